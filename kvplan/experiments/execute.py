"""One run: build its workload and simulator from the resolved configuration, simulate, and store the result in
its own directory, written whole (temporary sibling, then rename) so that a finished run is never half there.

    runs/<key>/config.json      the resolved configuration (with the seed)
    runs/<key>/summary.json     {"summary": vLLM-style metrics, "info": ..., "attainment": share, "wall_s": ...}
    runs/<key>/series.parquet   KV usage, queue lengths and the memory breakdown over time (per replica)
    runs/<key>/requests.parquet the per-request table (outputs.tables)

The function runs in a worker process (or a Ray task): it takes and returns plain data only.
"""

from __future__ import annotations

import json
import time
from functools import lru_cache
from pathlib import Path

import numpy as np

from kvplan.output import atomic_dir, json_text

SUMMARY_FILE = "summary.json"


@lru_cache(maxsize=4)
def _base_trace(trace: str | None, load: str, synthetic: str | None, seed: int):  # -> Trace
    import traces
    from traces.synth import synthesize

    if trace is not None:
        options = json.loads(load)
        return traces.load(trace, options.pop("format"), **options)
    spec = json.loads(synthetic)
    spec["seed"] = int(spec.get("seed", 0)) + seed  # each experiment seed draws a new workload
    try:
        return synthesize(spec)
    except ValueError as exc:
        raise ValueError(f"workload.synthetic: {exc}") from None


def build_trace(config: dict):  # -> Trace
    """The run's workload: the trace file or synthetic spec, its transforms, then the rate scale."""
    from kvplan.experiments.schema import TRACE_LOAD
    from traces.transforms import apply_transforms, scale_rate

    w = config["workload"]
    synthetic = json.dumps(w["synthetic"], sort_keys=True) if "synthetic" in w else None
    # As JSON text, so that the cached base trace is keyed by plain strings.
    load = json.dumps({key: w.get(key) for key in ("format", *TRACE_LOAD)}, sort_keys=True)
    trace = _base_trace(w.get("trace"), load, synthetic, int(config["seed"]))
    trace = apply_transforms(trace, w["transforms"], int(config["seed"]), path="workload.transforms")
    return scale_rate(trace, w["rate_scale"]) if w["rate_scale"] != 1.0 else trace


def build_spec(config: dict):  # -> SimSpec
    """The simulator configured as the run says: a profile path as hardware means its calibrated cost."""
    from sim.run import SimSpec

    hardware, cost, profile = config["hardware"], "analytic", None
    if hardware.endswith((".yaml", ".yml")):
        cost, profile = "calibrated", hardware
    return SimSpec(model=config["model"], hardware=hardware, cost=cost, profile=profile, **config["engine"],
                   **config["cluster"])


def attainment_share(requests, bounds: dict | None) -> float | None:
    """The share of requests (samples included) within every per-request bound; None without bounds."""
    from kvplan.experiments.schema import ATTAINMENT_COLUMNS

    if not bounds:
        return None
    ok = np.ones(len(requests), dtype=bool)
    for key, column in ATTAINMENT_COLUMNS.items():
        if bounds.get(key) is not None:
            values = requests[column].to_numpy(dtype=float)
            ok &= np.nan_to_num(values, nan=np.inf) <= bounds[key]
    return float(ok.mean()) if len(ok) else 0.0


def execute_run(config: dict, run_dir: str, tables: bool) -> dict:
    """Simulate one run and store it under `run_dir`; returns what summary.json holds."""
    from kvplan.commands.simulate import write_tables
    from sim.run import simulate

    start = time.perf_counter()
    trace = build_trace(config)
    result = simulate(trace, build_spec(config))
    span = float(trace.arrival_s[-1] - trace.arrival_s[0]) if len(trace) > 1 else 0.0
    doc = {"summary": result.summary, "info": result.info, "wall_s": time.perf_counter() - start,
           "offered_rate_rps": len(trace) / span if span > 0 else None,
           "attainment": attainment_share(result.requests, config.get("attainment"))}
    with atomic_dir(run_dir) as tmp:
        (tmp / "config.json").write_text(json_text(config))
        write_tables(result, tmp, "parquet")
        if not tables:
            (tmp / "requests.parquet").unlink()
        text = json_text(doc)
        (tmp / SUMMARY_FILE).write_text(text)
    return json.loads(text)  # exactly what a resumed run reads back (non-finite values as null)


def read_run(run_dir: Path) -> dict | None:
    """A finished run's summary.json, or None when the run has not finished."""
    path = run_dir / SUMMARY_FILE
    return json.loads(path.read_text()) if path.is_file() else None
