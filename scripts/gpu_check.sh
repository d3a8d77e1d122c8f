#!/usr/bin/env bash
# GPU check for the paged-KV kernels (issue 6), in one go on a machine with a CUDA GPU:
#   1. the kernel tests compiled for the GPU (TRITON_INTERPRET unset), against the torch references;
#   2. `kvplan bench kernels --json`, which also writes the grid as CSV.
# Usage: bash scripts/gpu_check.sh [OUT_DIR]      (OUT_DIR defaults to $OUT, else results/gpu_check)
# Python: $PYTHON, else ./.venv/bin/python, else python3; it needs a CUDA build of torch and triton.
# Budget: under 10 minutes on one H200. The tests mostly wait on Triton compiling their ~100 kernel variants
# (a few minutes, capped at 5); the benchmark is sized to finish in under 4 minutes, compilation included.
# Exit status: 0 when both steps succeed, 1 when there is no GPU, else the first failing step's status.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
DEST=${1:-${OUT:-results/gpu_check}}
mkdir -p "$DEST"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET  # compile for the GPU: the point of this check

if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA GPU visible to $PY; nothing checked" >&2
  exit 1
fi
"$PY" -c "import torch, triton; print('device', torch.cuda.get_device_name(), 'torch', torch.__version__, \
'triton', triton.__version__)" | tee "$DEST/versions.txt"

timeout 300 "$PY" -m pytest tests/kernels -q -p no:cacheprovider 2>&1 | tee "$DEST/tests.txt"
tests_rc=${PIPESTATUS[0]}

timeout 270 "$PY" -m kvplan.cli bench kernels --json --csv "$DEST/bench_kernels.csv" > "$DEST/bench_kernels.json"
bench_rc=$?
"$PY" - "$DEST/bench_kernels.json" <<'EOF' || true
import json, sys
try:
    result = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    sys.exit(f"gpu_check: no benchmark result ({exc})")
print("bench target:", json.dumps(result.get("target", result)))
for r in result.get("rows", []):
    print(f"{r['kind']:8} b={r['batch']:<3} ctx={r['context']:<5} bs={r['block_size']:<4} "
          f"{r['kernel_ms']:.3f} ms  {r['gbps']:.0f} GB/s  vs_sdpa={r['vs_sdpa']:.2f}  diff={r['max_abs_diff']:.1e}")
EOF

echo "gpu_check: tests exit $tests_rc, bench exit $bench_rc; outputs in $DEST"
[ "$tests_rc" -ne 0 ] && exit "$tests_rc"
exit "$bench_rc"
