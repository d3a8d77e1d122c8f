#!/usr/bin/env bash
# Install (idempotent) and run the main job: simulate the bundled Mooncake-style sample trace on llama-3-8b on an
# A100-40GB, once per KV block size, and print the comparison table (about 5 s). Extra arguments go to
# `kvplan simulate` (e.g. --replicas 2 --router prefix_aware --json).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/kvplan simulate --trace traces/samples/mooncake_style.jsonl --model llama-3-8b --hardware a100-40gb \
    --block-size 16 32 64 128 256 "$@"
