#!/usr/bin/env bash
# The light install as a user gets it: build the wheel and the sdist, install the wheel *without* the engine extra
# into a fresh virtual environment, and check there that torch is absent, that the simulator and the trace tools
# run on the bundled samples and shipped profiles, and that an engine command names the extra in one line. The venv
# already holds Hugging Face's `kernels` and PyPI's `traces`: the wheel adds one top-level name, `kvplan`, and
# leaves both packages as they were.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
.venv/bin/python -m build --outdir "$tmp/dist" . > "$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; exit 1; }
wheel=$(ls "$tmp"/dist/*.whl)
sdist=$(ls "$tmp"/dist/*.tar.gz)
.venv/bin/python -m zipfile -l "$wheel" > "$tmp/wheel.txt"
tar tzf "$sdist" > "$tmp/sdist.txt"
for data in traces/samples/mooncake_style.jsonl sim/profiles/cpu-local/llama-100m.yaml engine/csrc/cpu_decode.cpp \
    experiments/quickstart.yaml; do
  grep -q "$data" "$tmp/wheel.txt" || { echo "wheel lacks $data"; exit 1; }
  grep -q "$data" "$tmp/sdist.txt" || { echo "sdist lacks $data"; exit 1; }
done
tops=$(.venv/bin/python -c 'import sys, zipfile
tops = {n.split("/")[0] for n in zipfile.ZipFile(sys.argv[1]).namelist()}
print(" ".join(sorted(t for t in tops if not t.endswith((".dist-info", ".data")))))' "$wheel")
[ "$tops" = "kvplan" ] || { echo "the wheel installs top-level names beside kvplan: $tops"; exit 1; }
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check kernels traces \
  2> >(grep -v "is ignored: it is neither" >&2)
foreign='import kernels, traces; print(kernels.__file__, kernels.get_kernel.__module__, traces.__file__, traces.TimeSeries.__module__)'
before=$(cd "$tmp" && "$tmp/venv/bin/python" -c "$foreign")
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check "$wheel" \
  2> >(grep -v "is ignored: it is neither" >&2)
after=$(cd "$tmp" && "$tmp/venv/bin/python" -c "$foreign")
[ "$before" = "$after" ] || { echo "installing kvplan changed kernels/traces: $before -> $after"; exit 1; }
"$tmp/venv/bin/python" -m pip check > /dev/null || { "$tmp/venv/bin/python" -m pip check; exit 1; }
cd "$tmp"  # away from the source tree: only the installed package is importable
py="$tmp/venv/bin/python"
kv="$tmp/venv/bin/kvplan"
if "$py" -c "import torch" 2> /dev/null; then echo "the light install can import torch"; exit 1; fi
"$kv" --version
"$py" -m kvplan --version
"$kv" trace samples
sample=$("$py" -c "from kvplan.traces.samples import bundled_traces; print(bundled_traces()['mooncake_style'])")
"$kv" trace stats "$sample" > /dev/null
"$kv" simulate --trace "$sample" --model llama-3-8b --hardware a100-40gb --block-size 16 32 > /dev/null
chat=$("$py" -c "from kvplan.traces.samples import bundled_traces; print(bundled_traces()['chat'])")
"$kv" simulate --trace "$chat" --model llama-100m --hardware cpu-local > /dev/null  # a shipped profile
"$kv" run example:quickstart --explain > /dev/null  # the examples are installed, and their samples resolve
"$kv" run example:paged_vs_reservation --out "$tmp/paged" --quiet > /dev/null  # an experiment, end to end
test -s "$tmp/paged/report.html"
set +e
# the endpoint client needs no torch: nothing listens on port 9, so the replay is refused before it starts
"$kv" replay --endpoint http://127.0.0.1:9 --trace "$chat" --model llama-100m --duration 5 --timeout 5 --out "$tmp/ep" 2> ep.txt
code=$?
[ "$code" -eq 2 ] && grep -q "no server answers" ep.txt || { cat ep.txt; echo "replay --endpoint failed"; exit 1; }
"$kv" generate --model llama-100m --prompt hi 2> err.txt
code=$?
set -e
cat err.txt
[ "$code" -eq 2 ] && [ "$(wc -l < err.txt)" -eq 1 ] && grep -q "pip install 'kvplan\[engine\]'" err.txt
echo "light install: wheel $(basename "$wheel") (one top-level name, beside HF kernels and PyPI traces), simulate, trace and replay --endpoint run without torch, generate names the extra"
