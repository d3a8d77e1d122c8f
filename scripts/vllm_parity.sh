#!/usr/bin/env bash
# Re-check that kvplan's core schedules exactly as vLLM's own V1 scheduler does (tests/core/test_vllm_parity.py).
#
# Builds a separate virtual environment per vLLM release (never the project's .venv): vLLM's wheel installed with
# --no-deps, a CPU torch (pinned), and the few pure-Python packages that importing vLLM's scheduler and config needs.
# vllm._C is not needed: the scheduler and KV cache manager are pure Python. Then runs the comparison on many seeded
# scenarios of each family (plain, hybrid, cache-aware admission, chunked prefill off with a long-prefill
# threshold, P/D remote KV through a pull connector), kvplan's side given the installed release's vllm_version.
#
#   scripts/vllm_parity.sh [--scenarios N] [--first-seed S] [--vllm-version V | --all] [--venv DIR]
#
# Defaults: 200 scenarios per family from seed 0, the newest release kvplan follows (engine.core.vllm_versions),
# the environment in .venv-vllm-<release>/. --all runs every release kvplan follows, each in its own environment.
# Prints one line per family: the vLLM version, scenarios, steps and the result; exits non-zero if any differs.
set -euo pipefail
cd "$(dirname "$0")/.."

scenarios=200
first_seed=0
vllm_version=""
venv=""
all=""
while [ $# -gt 0 ]; do
  case "$1" in
    --scenarios) scenarios="$2"; shift 2 ;;
    --first-seed) first_seed="$2"; shift 2 ;;
    --vllm-version) vllm_version="$2"; shift 2 ;;
    --all) all=1; shift ;;
    --venv) venv="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "vllm_parity.sh: unknown option $1; allowed: --scenarios N, --first-seed S, --vllm-version V, --all, --venv DIR" >&2
       exit 2 ;;
  esac
done
# The releases kvplan follows, newest last (one place: kvplan/engine/core/vllm_versions.py; standard library only)
releases=$(PYTHONPATH="$PWD" python3 -c "from kvplan.engine.core.vllm_versions import VERSIONS, NAMES
print(' '.join(VERSIONS[n].release for n in NAMES))")
if [ -n "$all" ]; then
  status=0
  for release in $releases; do
    "$0" --scenarios "$scenarios" --first-seed "$first_seed" --vllm-version "$release" || status=1
  done
  exit $status
fi
vllm_version=${vllm_version:-${releases##* }}
venv=${venv:-.venv-vllm-$vllm_version}

# What vLLM's scheduler, config and request modules import (found by importing them in a bare environment),
# at the versions the last parity run used. torch is pinned: an unpinned torch would pull a CUDA build.
TORCH="torch==2.13.0"
DEPS=(
  "packaging==26.4" "pydantic==2.14.4" "regex==2026.11.19" "numpy==2.4.6" "cbor2==6.3.0" "psutil==7.2.2"
  "pyzmq==27.3.0" "urllib3==2.8.0" "transformers==5.24.0" "aiohttp==3.14.5" "requests==2.34.2"
  "openai-harmony==0.0.8" "openai==3.57.0" "pillow==13.0.0" "pybase64==1.5.1" "cachetools==8.0.2"
  "msgspec==0.23.0" "cloudpickle==3.1.3" "uvloop==0.23.0" "py-cpuinfo==9.0.0" "prometheus_client==0.26.0"
  "xgrammar==0.2.9" "fastapi==0.165.0" "partial-json-parser==0.2.1.1.post7" "llguidance==1.9.1" "einops"
  "pytest>=8"
)

pip_quiet() {  # pip, without the notes this machine's extra indexes print; fails when pip fails
  "$py" -m pip "$@" 2>&1 | { grep -v "^WARNING: Location\|dependency conflicts\|requires .*, which is not installed\|requires .*, but you have\|^ERROR: pip's" || true; }
  return "${PIPESTATUS[0]}"
}

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
py="$venv/bin/python"
installed=$("$py" -c "import importlib.metadata as m; print(m.version('vllm'))" 2>/dev/null || true)
if [ "$installed" != "$vllm_version" ]; then
  pip_quiet install -q "$TORCH"
  wheels=$(mktemp -d)
  trap 'rm -rf "$wheels"' EXIT
  pip_quiet download -q --no-deps -d "$wheels" "vllm==$vllm_version"
  pip_quiet install -q --no-deps --force-reinstall "$wheels"/vllm-*.whl
  pip_quiet install -q "${DEPS[@]}"
fi
"$py" -c "import vllm.v1.core.sched.scheduler, torch" >/dev/null 2>&1 || {
  echo "vllm_parity.sh: vLLM's scheduler does not import in $venv; see: $py -c 'import vllm.v1.core.sched.scheduler'" >&2
  exit 1
}

report=$(mktemp)
set +e
PYTHONPATH="$PWD" KVPLAN_PARITY_SCENARIOS="$scenarios" KVPLAN_PARITY_FIRST_SEED="$first_seed" \
  KVPLAN_PARITY_REPORT="$report" VLLM_LOGGING_LEVEL=ERROR \
  "$py" -m pytest tests/core/test_vllm_parity.py -q -p no:cacheprovider -k identical -rs \
  > "$report.log" 2>&1
status=$?
set -e
if [ -s "$report" ]; then
  cat "$report"
else
  tail -40 "$report.log"
fi
rm -f "$report" "$report.log"
exit $status
