#!/usr/bin/env bash
# Install (idempotent) and run the linter, the type checker and the test suite. Arguments go to pytest:
# `bash scripts/test.sh -m "not slow"` is the everyday lane (CI runs everything).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/ruff check .
# the type check of the core and the simulator (its files and settings: [tool.mypy] in pyproject.toml)
.venv/bin/python -m mypy
# -n: one pytest worker per core, at most 4 (each imports torch: ~1 GB; the tests need no more): on CI's 2 cores the
# suite takes ~10 instead of ~14 minutes. --durations=20: the log names the slowest tests, to see where the CI time
# budget goes. Both before the caller's arguments, so `-n 0` (one process) or another --durations wins.
workers=$(.venv/bin/python -c 'import os; print(min(4, len(os.sched_getaffinity(0))))')
.venv/bin/python -m pytest -n "$workers" --durations=20 "$@"
