#!/usr/bin/env bash
# The main job: install what it needs and answer the quickstart question (is prefix caching worth it for chat
# traffic on Llama-3-8B and one A100-40GB, and how many requests per second does the GPU sustain under the SLOs,
# each way). Prints the answer; writes results/quickstart/ (report.html, summary.md, runs.parquet, plots).
# The install is the light one (scripts/install.sh --light: the simulator, no torch, nothing compiled); a current
# full install (scripts/install.sh) serves as it is. About a minute on 2 cores, the install included.
# Extra arguments go to `kvplan run` (e.g. --out DIR, --workers 4, --resume).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --light
# one worker per core, at most 4: the first seed of each of the 2 points searches alone, then 4 searches at once
workers=$(.venv/bin/python -c 'import os; print(min(4, len(os.sched_getaffinity(0))))')
.venv/bin/kvplan run experiments/quickstart.yaml --workers "$workers" "$@"
