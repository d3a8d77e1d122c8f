"""The analytic bound of a disaggregated point (experiments.bound.PDBound): the smallest of its prefill pool's, its
decode pool's and its KV link's rates; a probe above it is never stable, whichever part binds; a search that uses it
skips only probes that fail and keeps the answer; what it skipped is said with the part that binds."""

from __future__ import annotations

import math

import pytest

from kvplan.experiments.bound import SLACK, PDBound, point_bound
from kvplan.experiments.execute import simulate_config
from kvplan.experiments.points import expand, run_config
from kvplan.experiments.search import make_tasks
from kvplan.limits import MAX_REPLICAS
from tests.experiments.test_bound import check_bound_skips_only_failing_probes
from tests.experiments.test_runner import TINY_WORKLOAD, experiment

PD = {"prefill_replicas": 1, "decode_replicas": 1}
# prompts of ~100 tokens and outputs of ~400: the decode pool's rows bind (TINY_WORKLOAD's ~300 / ~60: the prefill's)
DECODE_HEAVY = {"synthetic": {**TINY_WORKLOAD["synthetic"], "lengths": {
    "prompt": {"dist": "lognormal", "median": 100, "sigma": 0.3, "max": 400},
    "output": {"dist": "lognormal", "median": 400, "sigma": 0.3, "max": 1200}}}}
PROBE = {"duration_s": 20, "min_requests": 100}


def bound_of(**doc) -> PDBound:
    exp = experiment(**{"engine": {"enable_prefix_caching": False, "entry_point": "llm"}, "disaggregation": PD, **doc})
    bound = point_bound(run_config(expand(exp)[0].config, 0))
    assert isinstance(bound, PDBound)
    return bound


def test_the_bound_is_the_smallest_part_and_each_part_scales_with_its_pool():
    bound = bound_of()
    assert [p.name for p in bound.parts] == ["prefill pool", "decode pool", "KV link"]
    assert bound.max_stable_rate(7) == pytest.approx(SLACK * min(p.rate() for p in bound.parts))  # (replicas unused)
    more = bound_of(disaggregation={**PD, "decode_replicas": 3})
    assert more.parts[1].rate() == pytest.approx(3 * bound.parts[1].rate())
    assert more.parts[0].rate() == pytest.approx(bound.parts[0].rate())
    assert more.parts[2].rate() == pytest.approx(3 * bound.parts[2].rate())  # a link per decode instance
    # the pool's own token budget moves its rows per second; a stretched step scales the pools, not the link
    assert bound.max_stable_rate(1, step_scale=2.0) <= bound.max_stable_rate(1)
    # the decode pool's prefix cache may hold any prompt block: no least bytes, so no link part
    cached = experiment(engine={"entry_point": "llm"}, disaggregation={**PD, "prefill_enable_prefix_caching": False})
    assert [p.name for p in point_bound(run_config(expand(cached)[0].config, 0)).parts] == ["prefill pool",
                                                                                               "decode pool"]


@pytest.mark.parametrize(("workload", "binding"), [(TINY_WORKLOAD, "prefill pool"), (DECODE_HEAVY, "decode pool")])
def test_a_probe_above_the_bound_is_never_stable(workload, binding):
    exp = experiment(engine={"enable_prefix_caching": False, "entry_point": "llm"}, disaggregation=PD,
                     workload=workload, probe=PROBE)
    config = run_config(expand(exp)[0].config, 0)
    bound = point_bound(config)
    assert min(bound.parts, key=lambda p: p.rate()).name == binding
    # what a search decides fails: above SLACK x the bound (a prefill pool's floor is tight - its long steps run
    # near R - so a finite probe just above the bound itself drains its slow queue growth in the grace period)
    config["workload"]["rate"] = bound.max_stable_rate(1) * 1.01
    result, _ = simulate_config(config)
    assert result.info["probe"]["verdict"] != "stable"


def test_a_bounded_pd_search_skips_only_failing_probes_and_keeps_the_answer():
    exp = experiment(engine={"enable_prefix_caching": False, "entry_point": "llm"}, disaggregation=PD,
                     slo={"p99_ttft_ms": 1}, search={"target": "max_rate", "low": 0.25, "high": 4096,
                                                      "tolerance": 0.05}, seeds=[0])
    bounded = make_tasks(exp)[0]
    assert isinstance(bounded.bound, PDBound)
    ceiling = bounded.bound.max_stable_rate(1)
    assert math.isfinite(ceiling) and ceiling < 4096
    check_bound_skips_only_failing_probes(exp, bounded)
    assert bounded.bound.as_text().startswith("at most ") and "req/s by the prefill pool (1 x " in \
        bounded.bound.as_text()


def test_the_fewest_decode_replicas_a_rate_may_meet_with():
    bound = bound_of(workload=DECODE_HEAVY)  # the decode pool binds: one instance's part is the smallest
    prefill, decode, _ = (part.rate() for part in bound.parts)
    assert 2.5 * decode < prefill
    assert bound.min_replicas(0.5 * SLACK * decode) == 1
    assert bound.min_replicas(2.5 * SLACK * decode) == 3
    assert bound.min_replicas(2.5 * SLACK * decode, step_scale=1.5) == 4  # each step 1.5x as long: 3.75 -> 4
    assert bound.min_replicas(1.01 * SLACK * prefill) > MAX_REPLICAS  # the prefill pool alone cannot keep up
