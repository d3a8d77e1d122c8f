"""The analytic bounds (experiments.bound): a true lower bound on step time, a probe above the rate bound never
stable, a search that uses them gives the answer the plain search gives, and what they skipped is said."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvplan.cli import main
from kvplan.experiments.binding import task_votes
from kvplan.experiments.bound import SLACK, point_bound, step_floor
from kvplan.experiments.execute import build_spec, simulate_config
from kvplan.experiments.points import expand, run_config
from kvplan.experiments.search import PointTask, make_tasks
from kvplan.sim.cost.features import StepFeatures
from kvplan.sim.run import build_cost
from tests.experiments.test_runner import TINY_WORKLOAD, drive_one, experiment, write_yaml

SHORT_PROBE = {"duration_s": 120, "min_requests": 100}


@pytest.mark.parametrize(("model", "hardware", "tp"), [("llama-3-8b", "a100-40gb", 1), ("llama-3-70b", "h100-sxm", 4)])
def test_no_step_is_faster_than_the_floor(model, hardware, tp):
    exp = experiment(model=model, hardware=hardware, engine={"tensor_parallel_size": tp})
    cost, _ = build_cost(build_spec(run_config(expand(exp)[0].config, 0)))
    rng = np.random.default_rng(0)
    n = 4000
    requests = rng.integers(1, 300, n)
    decode = rng.integers(0, requests + 1)
    prefill = np.where(decode < requests, rng.integers(0, 8192, n), 0) + (requests - decode)
    context = decode * rng.integers(1, 8000, n)
    features = StepFeatures(num_requests=requests, prefill_tokens=prefill,
                            prefill_attention2=prefill * rng.integers(1, 9000, n), decode_requests=decode,
                            decode_context=context, decode_context_max=np.minimum(context, 8000),
                            blocks_touched=context // 16 + decode, sampled=rng.integers(0, requests + 1),
                            batched=((prefill + decode) >= 2).astype(np.int64))
    tokens = prefill + decode
    assert (cost.step_times(features) >= step_floor(cost, tokens) * (1 - 1e-12)).all()


@pytest.mark.parametrize(("replicas", "factor"), [(1, 1.0), (2, SLACK)])
def test_a_probe_above_the_rate_bound_is_never_stable(replicas, factor):
    exp = experiment(engine={"enable_prefix_caching": False}, cluster={"replicas": replicas}, probe=SHORT_PROBE)
    config = run_config(expand(exp)[0].config, 0)
    bound = point_bound(config)
    config["workload"]["rate"] = bound.rate_per_replica * replicas * factor * 1.01
    result, _ = simulate_config(config)
    assert result.info["probe"]["verdict"] != "stable"


def test_the_bound_only_skips_probes_that_fail_and_keeps_the_answer():
    exp = experiment(engine={"enable_prefix_caching": False}, slo={"p99_ttft_ms": 1},
                     search={"target": "max_rate", "low": 0.25, "high": 256, "tolerance": 0.05}, seeds=[0])
    bounded = make_tasks(exp)[0]
    assert bounded.bound is not None
    check_bound_skips_only_failing_probes(exp, bounded)


def check_bound_skips_only_failing_probes(exp, bounded) -> None:
    """With its bound a search reaches the answer it reaches without, at thresholds below the bound's ceiling,
    simulating every probe the plain search does except those the bound decided (all above the ceiling)."""
    ceiling = bounded.bound.max_stable_rate(1)
    for threshold in (0.3, ceiling / 3, ceiling * 0.9):
        with_bound = PointTask(exp, bounded.point, [0], bound=bounded.bound)
        without = PointTask(exp, bounded.point, [0])
        simulated = drive_one(with_bound, lambda rate, t=threshold: rate <= t)
        every = drive_one(without, lambda rate, t=threshold: rate <= t)
        assert with_bound.answer == without.answer
        assert with_bound.decided and all(v > ceiling for v in with_bound.decided)
        assert sorted(simulated) == sorted(v for v in every if v not in with_bound.decided)


@pytest.mark.parametrize("needed", [1, 2, 3, 5, 8, 9, 16, 17])
def test_a_replica_climb_finds_what_the_bisection_finds(needed):
    exp = experiment(workload={**TINY_WORKLOAD, "rate": 400.0}, slo={"p99_ttft_ms": 1},
                     search={"target": "min_replicas", "low": 1, "high": 16}, seeds=[0])
    climb = make_tasks(exp)[0]
    fewest = climb.bound.min_replicas(400.0)
    assert 1 < fewest < 16  # the tiny workload's bound decides the first counts at this rate
    bisection = PointTask(exp, climb.point, [0])
    meets = lambda replicas: replicas >= max(needed, fewest)  # noqa: E731 - below the bound every count fails
    climbed, bisected = drive_one(climb, meets), drive_one(bisection, meets)
    assert climb.answer == bisection.answer
    assert climb.decided == list(range(1, fewest)) and min(climbed) >= fewest
    if max(needed, fewest) <= 4:
        assert max(climbed) < max(bisected)  # no large counts probed
    if needed <= fewest:  # the count below the answer was never simulated: the bound is what binds
        assert [v.limit for v in task_votes(climb, pd.DataFrame())] == ["analytic bound"]


def test_skipped_replicas_are_said(tmp_path, capsys):
    base = {"model": "llama-3-8b", "hardware": "a100-40gb", "probe": {"duration_s": 60, "min_requests": 50},
            "engine": {"enable_prefix_caching": False}, "seeds": [0], "slo": {"p99_ttft_ms": 60000},
            "outputs": {"tables": False, "plots": False, "report": False}}
    per_replica = point_bound(run_config(expand(experiment(**base))[0].config, 0)).max_stable_rate(1)
    rate = 1.5 * per_replica  # one replica is decided to fail; the search probes two, its highest count
    doc = {"name": "skip", **base, "workload": {**TINY_WORKLOAD, "rate": rate},
           "search": {"target": "min_replicas", "low": 1, "high": 2, "model_range": "none"}}
    path = write_yaml(tmp_path / "skip.yaml", doc)
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    skipped = [line for line in out.splitlines() if line.startswith("skipped:")]
    assert len(skipped) == 1 and "1 replicas: fails by the analytic bound, at most" in skipped[0]
    assert "Skipped: 1 replicas: fails by the analytic bound" in (tmp_path / "out" / "summary.md").read_text()
