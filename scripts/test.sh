#!/usr/bin/env bash
# Install (idempotent) and run the whole test suite plus the linter and the type checker.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/ruff check .
# the type check of the core and the simulator (its files and settings: [tool.mypy] in pyproject.toml)
.venv/bin/python -m mypy
.venv/bin/python -m pytest "$@"
