#!/usr/bin/env bash
# Idempotent install into ./.venv. Re-running is cheap: pip is only called when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.kvplan-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  # torch first and pinned: 2.13.0 CPU comes from local disk here; triton 3.7.1 matches its CUDA build.
  .venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 triton==3.7.1 2> >(grep -v "is ignored: it is neither" >&2)
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]" 2> >(grep -v "is ignored: it is neither" >&2)
  echo "$want" > "$stamp"
fi
