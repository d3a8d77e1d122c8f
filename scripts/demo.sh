#!/usr/bin/env bash
# Install (idempotent) and run the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/kvplan bench core "$@"
