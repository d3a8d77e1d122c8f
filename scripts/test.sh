#!/usr/bin/env bash
# Install (idempotent) and run the linter, the type checker and the test suite. Arguments go to pytest:
# `bash scripts/test.sh -m "not slow"` is the everyday lane (CI runs everything).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/ruff check .
# the type check of the core and the simulator (its files and settings: [tool.mypy] in pyproject.toml)
.venv/bin/python -m mypy
# --durations=20: the log names the slowest tests, to see where the CI time budget goes (before the caller's
# arguments: a --durations the caller gives wins)
.venv/bin/python -m pytest --durations=20 "$@"
