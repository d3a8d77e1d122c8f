#!/usr/bin/env bash
# Install (idempotent) and run the main job: the quickstart capacity-planning experiment (which KV block size,
# and how much traffic, for Llama-3-8B on one A100-40GB on the bundled Mooncake-style sample). Prints the
# recommendation; writes results/quickstart/ (report.html, summary.md, runs.parquet, plots). About a minute.
# Extra arguments go to `kvplan run` (e.g. --out DIR, --workers 4, --resume).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/kvplan run experiments/quickstart.yaml --workers 2 "$@"
