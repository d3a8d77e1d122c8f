#!/usr/bin/env bash
# Install (idempotent) and run the whole test suite plus the linter. Arguments go to pytest:
# `bash scripts/test.sh -m "not slow"` is the everyday lane (CI runs everything).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest "$@"
