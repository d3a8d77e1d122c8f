"""One run: build its workload and simulator from the resolved configuration, simulate, and store the result in
its own directory, written whole (temporary sibling, then rename) so that a finished run is never half there.

A sustained or concurrency run is a steady-state probe (`sim.probe`: the trace's population at the run's load
for the probe's duration, measured over its window, with a stability verdict); a burst run replays the trace
as recorded, time-scaled by `rate_scale` (`sim.run.simulate`).

    runs/<key>/config.json      the resolved configuration (with the seed; and `step_scale`, the factor on every
                                step's compute time, for a search at an edge of the model-error band)
    runs/<key>/summary.json     {"summary": vLLM-style metrics, "info": ..., "attainment": share, "wall_s": ...,
                                 "probe": the window's counts, signals and verdict (null for a burst run)}
    runs/<key>/series.parquet   KV usage, queue lengths and the memory breakdown over time (per replica)
    runs/<key>/requests.parquet the per-request table (outputs.tables)

The function runs in a worker process (or a Ray task): it takes and returns plain data only.
"""

from __future__ import annotations

import json
import time
from functools import lru_cache
from pathlib import Path

from kvplan.errors import UserError, short_repr
from kvplan.output import atomic_dir, json_text

SUMMARY_FILE = "summary.json"


@lru_cache(maxsize=4)
def _base_trace(trace: str | None, load: str, synthetic: str | None, seed: int):  # -> Trace
    from kvplan import traces
    from kvplan.traces.synth import synthesize

    if trace is not None:
        options = json.loads(load)
        return traces.load(trace, options.pop("format"), **options)
    spec = json.loads(synthetic)
    spec["seed"] = int(spec.get("seed", 0)) + seed  # each experiment seed draws a new workload
    try:
        return synthesize(spec)
    except ValueError as exc:
        raise UserError(f"workload.synthetic: {exc}") from None


def _workload_keys(config: dict) -> tuple[str | None, str, str | None, str, int]:
    """The arguments that determine a run's base workload, as plain strings (cache keys)."""
    from kvplan.experiments.schema import TRACE_LOAD

    w = config["workload"]
    synthetic = json.dumps(w["synthetic"], sort_keys=True) if "synthetic" in w else None
    load = json.dumps({key: w.get(key) for key in ("format", *TRACE_LOAD)}, sort_keys=True)
    # the transforms, then the LoRA adapters the requests name (workload.lora_adapters / lora_skew)
    steps = {"transforms": w["transforms"], "lora": [w.get("lora_adapters", 0), w.get("lora_skew", 0.0)]}
    return w.get("trace"), load, synthetic, json.dumps(steps, sort_keys=True), int(config["seed"])


def _transformed(trace: str | None, load: str, synthetic: str | None, transforms: str, seed: int):  # -> Trace
    from kvplan.traces.transforms import apply_transforms, assign_adapters

    steps = json.loads(transforms)
    base = _base_trace(trace, load, synthetic, seed)
    out = apply_transforms(base, steps["transforms"], seed, path="workload.transforms")
    adapters, skew = steps["lora"]
    return assign_adapters(out, adapters, skew, seed=seed) if adapters else out


@lru_cache(maxsize=4)
def _population(*keys):  # -> Population
    from kvplan.traces.steady import population

    return population(_transformed(*keys))


def build_trace(config: dict):  # -> Trace
    """A burst run's workload: the trace file or synthetic spec, its transforms, then the rate scale."""
    from kvplan.traces.transforms import scale_rate

    trace = _transformed(*_workload_keys(config))
    scale = config["workload"]["rate_scale"]
    return scale_rate(trace, scale) if scale != 1.0 else trace


def build_probe(config: dict):  # -> Probe
    """A steady-state run's load and measurement."""
    from kvplan.sim.probe import Probe

    w = config["workload"]
    return Probe(mode=w["mode"], rate=w["rate"], arrivals=w["arrivals"], concurrency=w["concurrency"] or 1,
                 think_s=w["think_s"], goodput=config.get("goodput"), **config["probe"])


def build_spec(config: dict):  # -> SimSpec
    """The simulator configured as the run says: a profile path as hardware means its calibrated cost; a
    `disaggregation` block, P/D pools (`experiments.pd_block`)."""
    from kvplan.experiments.pd_block import KEY, spec_of
    from kvplan.sim.spec import SimSpec

    hardware, cost, profile = config["hardware"], "analytic", None
    if hardware.endswith((".yaml", ".yml")):
        cost, profile = "calibrated", hardware
    return SimSpec(model=config["model"], hardware=hardware, cost=cost, profile=profile, **config["engine"],
                   **config["cluster"], disaggregation=spec_of(config.get(KEY)))


def attainment_share(requests, bounds: dict | None) -> float | None:
    """The share of requests (samples included) within every per-request bound; None without bounds. A probe's
    table counts only its measured requests (arriving inside the window)."""
    from kvplan.results.goodput import within_bounds

    if not bounds:
        return None
    if "phase" in requests:
        requests = requests[requests["phase"] == "measured"]
    ok = within_bounds(requests, bounds)
    return float(ok.mean()) if len(ok) else 0.0


def trace_notes(config: dict) -> list[str]:
    """What loading the run's trace file changed or left out (rows dropped with skip_bad, fields its layout does
    not read), as `kvplan trace stats` says it; none for a synthetic workload. The load is cached: free here."""
    trace, load, synthetic, _, seed = _workload_keys(config)
    if trace is None:
        return []
    return [f"{trace}: {line}" for line in _base_trace(trace, load, synthetic, seed).report.lines()]


def simulate_config(config: dict, trace=None):  # -> (ServingResult, offered rate in req/s or None)
    """Simulate one run's configuration (nothing written). `trace`: a burst run's workload in place of the one
    the configuration builds (`experiments.estimate` times a slice of it)."""
    from kvplan.sim.probe import run_probe
    from kvplan.sim.run import simulate

    spec = build_spec(config)
    step_scale = config.get("step_scale", 1.0)  # an edge of the model-error band (search.PointTask.step_scale)
    if config["workload"]["mode"] == "burst":
        if step_scale != 1.0:  # make_tasks never asks: `sim.run.simulate` prices steps as the model does
            raise ValueError(f"a burst run cannot scale its step times (step_scale {step_scale})")
        trace = build_trace(config) if trace is None else trace
        span = float(trace.arrival_s[-1] - trace.arrival_s[0]) if len(trace) > 1 else 0.0
        return simulate(trace, spec, config.get("goodput")), (len(trace) / span if span > 0 else None)
    result = run_probe(population(config), spec, build_probe(config), int(config["seed"]), step_scale)
    return result, result.info["probe"]["offered_rps"]


def population(config: dict):  # -> Population
    """A steady-state run's population of sessions (cached: every probe of one workload shares it)."""
    return _population(*_workload_keys(config))


def execute_run(config: dict, run_dir: str, tables: bool) -> dict:
    """Simulate one run and store it under `run_dir`; returns what summary.json holds."""
    from kvplan.results.serving_result import write_tables

    start = time.perf_counter()
    result, offered = simulate_config(config)
    doc = {"summary": result.summary, "info": result.info, "wall_s": time.perf_counter() - start,
           "offered_rate_rps": offered, "attainment": attainment_share(result.requests, config.get("attainment")),
           "probe": result.info.pop("probe", None), "trace_notes": trace_notes(config)}
    with atomic_dir(run_dir) as tmp:
        (tmp / "config.json").write_text(json_text(config))
        write_tables(result, tmp, "parquet")
        if not tables:
            (tmp / "requests.parquet").unlink()
        text = json_text(doc)
        (tmp / SUMMARY_FILE).write_text(text)
    return json.loads(text)  # exactly what a resumed run reads back (non-finite values as null)


def read_run(run_dir: Path) -> dict | None:
    """A finished run's summary.json, or None when the run has not finished (no directory, or an empty one). A run
    directory whose files do not match its manifest, or whose summary is not the object `execute_run` writes, is
    corrupt state: one line naming the file and what is wrong, and what to do."""
    from kvplan.output import verify_result_set
    from kvplan.strict_json import loads

    if not run_dir.exists() or not any(run_dir.iterdir()):
        return None
    path = run_dir / SUMMARY_FILE
    redo = f"allowed: rerun without --resume (which recomputes every run), or delete {run_dir}"
    try:
        verify_result_set(run_dir)
        doc = loads(path.read_bytes())
    except UserError as exc:
        raise UserError(f"--resume: {str(exc).split('; allowed: rerun')[0]}; {redo}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("summary"), dict) or not isinstance(doc.get("info"), dict):
        raise UserError(f"--resume: {path}: {short_repr(doc, 40)} is not the summary of a run (an object with "
                         f"summary and info objects); {redo}")
    return doc
