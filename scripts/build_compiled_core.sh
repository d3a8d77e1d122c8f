#!/usr/bin/env bash
# Build the shared serving core (kvplan/engine/core) with mypyc (or Cython) into OUT, never into the package:
# OUT/kvplan mirrors the package - real folders, a link to the checkout's file for every file - except that the
# modules it compiles are copies with their C extensions beside them (an extension wins over a .py of the same name
# on import). So a module left interpreted is the checkout's own file, found where it lives (its data beside the
# package too), and an edit to it is live in the build. The build is finished when OUT/kvplan-compiled.json is
# written, last, with the digest of the sources it compiled (kvplan/launch.py): scripts/install.sh builds into
# .venv/kvplan-compiled, and the `kvplan` script runs that build while its digest is current, the pure modules
# otherwise. The pure-Python core stays the executable specification; tests/core/test_compiled_core.py and
# tests/sim/test_compiled_sim.py compare the two (KVPLAN_COMPILED_CORE=OUT).
#
#   scripts/build_compiled_core.sh OUT [EXTRA_MODULE.py ...]    e.g. ... /tmp/core kvplan/sim/replica.py
#   scripts/build_compiled_core.sh OUT --sim                    the core and SIM_MODULES below: the install's build
#   COMPILER=cython scripts/build_compiled_core.sh OUT          Cython instead, on the same unchanged .py files
#   PYTHONPATH=OUT .venv/bin/python -P -m kvplan ...            runs with that build (a plain -m from the checkout
#                                                               imports the pure package)
#
# COMPILER=cython runs `cythonize` (CYTHONIZE, default: the one on PATH; `pip install cython` in any venv of the
# same Python) in pure-Python mode on the same modules, for a like-for-like comparison with mypyc.
#
# Compiled: every module of kvplan/engine/core except the ones below, which mypyc cannot compile as written and
# which are off the hot path (configuration, built once per run). Each reason was observed with mypy 2.4.1's mypyc:
#   config.py         - internal mypyc error (AssertionError in env_class) on a nested function inside a method of
#                       a non-extension class (CacheConfig carries the non-dataclass decorator `config_fields`)
#   kv_interface.py   - a @runtime_checkable Protocol: compiled, it is no longer a protocol class (TypeError)
#   settings.py, setting_classes.py, vllm_versions.py - the setting declarations that config.py builds on; left
#                       interpreted with it (they run once per configuration)
#   __init__.py files - re-exports only
# Needs a C compiler (cc) and Python headers; 1 to 4 minutes with mypyc, about 5 with Cython, on 2 shared cores.
set -euo pipefail
# Beside the core, the install's build (--sim) compiles the simulator's step loop and the per-arrival and per-request
# bookkeeping around it (the router each arrival asks), and the pricing helpers every step calls (a step's price, the
# token tables, a decode stretch's sums and the analytic cost's step law that prices them).
# shared_store.py must go with the core: its class subclasses the core's TierView.
SIM_MODULES=(kvplan/sim/replica.py kvplan/sim/token_clock.py kvplan/sim/shared_store.py kvplan/sim/cluster.py kvplan/results/request_table.py
             kvplan/results/itl.py kvplan/sim/cost/token_table.py kvplan/sim/cost/step_sums.py
             kvplan/sim/cost/step_law.py kvplan/sim/cost/step_price.py kvplan/sim/routers.py)
if [ $# -lt 1 ]; then
  echo "usage: $0 OUT [EXTRA_MODULE.py ...]  (OUT: a scratch directory outside the checkout)" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "$1" && cd "$1" && pwd)
shift
case "$out/" in
  "$root"/.venv/*) ;;  # git-ignored: the install's own build (.venv/kvplan-compiled)
  "$root"/*) echo "$0: OUT $out is inside the checkout $root; build compiled files outside it (or under .venv)" >&2
             exit 2 ;;
esac
python=${PYTHON:-$root/.venv/bin/python}
[ -x "$python" ] || python=$(command -v python3)

rm -f "$out/kvplan-compiled.json"  # unfinished until the end (kvplan/launch.py)
rm -rf "$out/kvplan" "$out/build" "$out"/*__mypyc*.so
# The mirror: the package's folders, each file a link to the checkout's (the compiled modules are copied below)
(cd "$root" && find kvplan -name __pycache__ -prune -o -type d -print) | while IFS= read -r dir; do
  mkdir -p "$out/$dir"
done
(cd "$root" && find kvplan -name __pycache__ -prune -o -type f -print) | while IFS= read -r file; do
  ln -s "$root/$file" "$out/$file"
done
cp "$root/pyproject.toml" "$out/"  # mypyc reads the project's mypy settings from it

excluded="config.py kv_interface.py settings.py setting_classes.py vllm_versions.py __init__.py"
modules=()
cd "$out"
while IFS= read -r path; do
  name=$(basename "$path")
  case " $excluded " in *" $name "*) echo "interpreted: $path"; continue ;; esac
  modules+=("$path")
done < <(find kvplan/engine/core -name '*.py' | sort)
if [ "${1:-}" = --sim ]; then
  shift
  modules+=("${SIM_MODULES[@]}")
fi
modules+=("$@")
digest=$(cd "$root" && "$python" -m kvplan.launch digest "${modules[@]}")  # of the sources about to be copied
for path in "${modules[@]}"; do
  echo "compiling:   $path"
  rm "$out/$path" && cp "$root/$path" "$out/$path"
done
# The copies' dataclasses get their __init__ written out, so that it is compiled too (kvplan/compiled_inits.py)
(cd "$root" && "$python" -m kvplan.compiled_inits "${modules[@]/#/$out/}") > "$out/inits.log"
echo "dataclass __init__s written: $(grep -c "^__init__ written" "$out/inits.log" || true)"  # (grep -c: 1 on none)
case "${COMPILER:-mypyc}" in
  mypyc)
    "$python" -m mypyc "${modules[@]}" > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
    grep -E "^kvplan/.*(warning|error)" "$out/build.log" || true ;;
  cython)
    "${CYTHONIZE:-cythonize}" -i -3 -j 2 "${modules[@]}" > "$out/build.log" 2>&1 \
      || { tail -40 "$out/build.log"; exit 1; }
    grep -iE "^warning" "$out/build.log" || true ;;
  *) echo "$0: COMPILER=${COMPILER} is neither mypyc nor cython" >&2; exit 2 ;;
esac
rm -rf "$out/build"
(cd "$root" && "$python" -m kvplan.launch stamp "$out" "$digest" "${COMPILER:-mypyc}" "${modules[@]}")
echo "built $(find "$out/kvplan" -name '*.so' | wc -l) extension modules into $out (${COMPILER:-mypyc})"
echo "use: KVPLAN_COMPILED_CORE=$out (tests/core/test_compiled_core.py) or PYTHONPATH=$out .venv/bin/python -P -m kvplan ..."
