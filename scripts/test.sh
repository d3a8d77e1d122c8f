#!/usr/bin/env bash
# Install (idempotent) and run the linter, the type checker and the test suite. Arguments go to pytest:
# `bash scripts/test.sh -m "not slow"` is the everyday lane (CI runs everything).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/ruff check .
# the type check of the core and the simulator (its files and settings: [tool.mypy] in pyproject.toml)
.venv/bin/python -m mypy
.venv/bin/python -m pytest "$@"
