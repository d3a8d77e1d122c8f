"""`kvplan bench traces`: loading a million-request trace, against the issue's budgets (10 s, 1 GB).

Two seeded files are generated in a temporary directory: an Azure-2023-layout CSV (wall-clock timestamps
and lengths) and a Mooncake-like JSONL whose requests carry 512-token `hash_ids` with shared document
prefixes. Each is loaded by `traces.load` in a fresh Python process, so that the peak RSS it reports is
the load's own and not the generator's: VmHWM (the resident high-water mark) from /proc/self/status after
the load minus before it, imports done. Not `getrusage` ru_maxrss: Linux carries the parent's peak into a
child across fork and exec, so a child of the (large) generating process would report that instead.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from kvplan.traces.arrivals import arrival_times
from kvplan.traces.distributions import length_sampler
from kvplan.traces.io import MOONCAKE_GRANULARITY, render_layout
from kvplan.traces.schema import Trace, offsets_from_counts

LOAD_BUDGET_S = 10.0  # issue 3: a 1M-row Azure CSV loads in <= 10 s
MEMORY_BUDGET_BYTES = 10**9  # issue 3: a 1M-request trace with 512-token hashes is held in <= 1 GB
RATE_RPS = 5.0
DOCUMENTS = 2000  # shared prefixes (long system prompts, documents) of the Mooncake-like trace
DOCUMENT_BLOCKS = (2, 40)  # their length range in 512-token blocks
SHARED_FRACTION = 0.6  # requests that start with a shared document

# Run in a child process: prints one JSON object with the load's wall and CPU time (CPU time is the steadier
# figure on a shared machine), size and peak RSS increase.
_MEASURE = """
import json, re, sys, time
from kvplan import traces
def peak_kib():
    with open("/proc/self/status") as f:
        return int(re.search(r"VmHWM:\\s+(\\d+) kB", f.read()).group(1))
before = peak_kib()
start, cpu_start = time.perf_counter(), time.process_time()
trace = traces.load(sys.argv[1])
seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
after = peak_kib()
print(json.dumps({"rows": len(trace), "seconds": seconds, "cpu_seconds": cpu_seconds,
                  "memory_bytes": trace.memory_bytes(),
                  "peak_rss_increase_bytes": (after - before) * 1024, "format": trace.report.format,
                  "hash_ids": 0 if trace.hash_ids is None else len(trace.hash_ids)}))
"""


def _lengths(spec: dict, rng: np.random.Generator, rows: int) -> np.ndarray:
    return length_sampler(spec, "bench", Path())(rng, rows)


def azure_like(rows: int, seed: int) -> Trace:
    """Poisson arrivals, lengths shaped like the Azure 2023 conversation trace."""
    rng = np.random.default_rng(seed)
    arrival = arrival_times({"process": "poisson", "rate": RATE_RPS}, rows, rng)
    prompt = _lengths({"dist": "lognormal", "median": 1000, "sigma": 0.8, "max": 14000}, rng, rows)
    output = _lengths({"dist": "lognormal", "median": 130, "sigma": 0.9, "max": 1000}, rng, rows)
    return Trace.build(arrival - arrival[0], prompt, output)


def mooncake_like(rows: int, seed: int) -> Trace:
    """Long prompts (mean about 11k tokens, as Mooncake's conversation trace) with 512-token hash ids: a share
    of requests open with one of a few thousand Zipf-popular documents, the rest of every prompt is unique.
    Ids are small integers, as the published trace's (renumbered by first appearance), so lines are as long."""
    rng = np.random.default_rng(seed)
    arrival = arrival_times({"process": "poisson", "rate": RATE_RPS}, rows, rng)
    prompt = _lengths({"dist": "lognormal", "median": 8000, "sigma": 0.8, "max": 128000}, rng, rows)
    output = _lengths({"dist": "lognormal", "median": 300, "sigma": 0.6, "max": 2000}, rng, rows)
    counts = -(-prompt // MOONCAKE_GRANULARITY)
    doc_blocks = rng.integers(DOCUMENT_BLOCKS[0], DOCUMENT_BLOCKS[1] + 1, size=DOCUMENTS)
    popularity = 1.0 / np.arange(1, DOCUMENTS + 1)
    doc = rng.choice(DOCUMENTS, size=rows, p=popularity / popularity.sum())
    shared = np.where(rng.random(rows) < SHARED_FRACTION, np.minimum(doc_blocks[doc], counts), 0)
    offsets = offsets_from_counts(counts)
    position = np.arange(offsets[-1]) - np.repeat(offsets[:-1], counts)
    in_doc = position < np.repeat(shared, counts)
    # Document d's block j is id d * max + j; every other block gets an id of its own above those.
    doc_ids = np.repeat(doc, counts) * DOCUMENT_BLOCKS[1] + position
    ids = np.where(in_doc, doc_ids, DOCUMENTS * DOCUMENT_BLOCKS[1] + np.arange(offsets[-1]))
    return Trace.build(arrival - arrival[0], prompt, output, hash_ids=ids, hash_offsets=offsets,
                       hash_granularity=MOONCAKE_GRANULARITY)


def measure_load(path: Path) -> dict:
    """Load `path` in a fresh interpreter and return what `_MEASURE` reports."""
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(path)], capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"loading {path} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def _with_ratios(result: dict, file_bytes: int) -> dict:
    return {**result, "file_bytes": file_bytes, "rows_per_s": result["rows"] / result["seconds"],
            "seconds_vs_budget": result["seconds"] / LOAD_BUDGET_S,
            "memory_vs_budget": result["memory_bytes"] / MEMORY_BUDGET_BYTES,
            "peak_rss_vs_budget": result["peak_rss_increase_bytes"] / MEMORY_BUDGET_BYTES}


def run(rows: int = 1_000_000, seed: int = 0) -> dict:
    if rows < 1:
        raise ValueError(f"--rows must be >= 1, got {rows}")
    files = {"azure_csv": ("azure.csv", azure_like, "azure"),
             "mooncake_jsonl": ("mooncake.jsonl", mooncake_like, "mooncake")}
    loads = {}
    with tempfile.TemporaryDirectory(prefix="kvplan-bench-traces-") as tmp:
        for key, (name, generate, layout) in files.items():
            path = Path(tmp) / name
            path.write_bytes(render_layout(generate(rows, seed), layout))
            loads[key] = _with_ratios(measure_load(path), path.stat().st_size)
    return {"rows": rows, "seed": seed, "load_budget_s": LOAD_BUDGET_S, "memory_budget_bytes": MEMORY_BUDGET_BYTES,
            "peak_rss_method": "VmHWM of a fresh process (/proc/self/status), after the load minus before",
            "loads": loads}
