"""The `steady_search` row of `kvplan bench sim`: a steady-state capacity search as the quickstart runs it.

The quickstart's points (prefix caching on and off) are searched for their highest sustained rate
with the experiment's own probes (600 simulated seconds or more each, lengthened when their window is short,
stopped early when overloaded), on the experiment's first seed, in this process - a bisection's probes depend
on each other, so one search is one process's work; `kvplan run --workers N` runs the seeds' searches side by
side. Simulated time is the sum over probes of the time each one simulated (up to its stop); requests, the
requests its arrivals sent. Against the plain path (`kvplan.bench.sim`), the part both paths run is the search's
first probe (the first run it asked for), again in this process after the search.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path

QUICKSTART = Path(__file__).resolve().parents[2] / "experiments" / "quickstart.yaml"


def steady_search(experiment: Path = QUICKSTART) -> dict:
    from kvplan.commands.run import load
    from kvplan.experiments.runner import run_experiment

    exp, _ = load(experiment)  # as `kvplan run` reads it (sample traces resolved, points checked)
    exp.seeds = exp.seeds[:1]
    with tempfile.TemporaryDirectory(prefix="kvplan-bench-") as tmp:
        start = time.perf_counter()
        outcome = run_experiment(exp, Path(tmp) / "out", workers=1, progress=False)
        wall = time.perf_counter() - start
    docs = [run["doc"] for run in outcome.runs.values()]
    probes = [doc["probe"] for doc in docs]
    simulated = sum(p["stopped_s"] for p in probes)
    steps = sum(doc["info"]["steps"] for doc in docs)
    fast = sum(doc["info"]["fast_steps"] for doc in docs)
    answers = {task.point.label: task.answer for task in outcome.tasks}
    plain = probe_against_plain(next(iter(outcome.runs.values()))["config"]) if outcome.runs else None
    return {"requests": sum(p["sent"] for p in probes), "replicas": docs[0]["info"]["replicas"] if docs else 1,
            "experiment": str(experiment), "seeds": exp.seeds, "probes": len(docs),
            "overloaded_probes": sum(p["verdict"] == "overloaded" for p in probes), "simulated_s": simulated,
            "wall_s": wall, "speedup": simulated / wall, "steps": steps, "fast_steps": fast,
            "fast_share": fast / max(steps, 1), "answers": answers, "plain": plain}


def probe_against_plain(config: dict) -> dict:
    """One run of the search (its resolved configuration) on the fast and the plain path (`bench.sim.against_plain`):
    the probe's simulated time is the time it ran to (its stop)."""
    from kvplan.bench.sim import against_plain
    from kvplan.experiments.execute import build_probe, build_spec, population
    from kvplan.sim.probe import run_probe

    spec, probe, pop = build_spec(config), build_probe(config), population(config)

    def run_once(fast_path: bool):
        out = run_probe(pop, replace(spec, fast_path=fast_path), probe, int(config["seed"]),
                        config.get("step_scale", 1.0))
        return out, out.info["probe"]["stopped_s"], out.info["probe"]["sent"]

    rate = "" if probe.rate is None else f" ({probe.rate:g} req/s)"
    return {"rule": f"the search's first probe{rate}", **against_plain(run_once)}
