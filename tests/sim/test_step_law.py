"""`StepLaw` prices a step as `AnalyticCost.step_times` does on its ints, and a pure-decode stretch as it does on
the stretch's arrays, bit for bit, for every model shape that has one; the shapes that take another branch of
`step_times` have none."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.sim.cost import step_law_of
from kvplan.sim.cost.analytic import AnalyticCost
from kvplan.sim.cost.features import StepFeatures, decode_stretch_features
from kvplan.sim.cost.parallel import Shape
from kvplan.sim.cost.scaled import ScaledCost
from kvplan.sim.cost.step_sums import stretch_sums
from kvplan.sim.specs.hardware import get_hardware
from kvplan.sim.specs.models import get_model

H100, A100 = get_hardware("h100-sxm"), get_hardware("a100-80gb")
LLAMA = get_model("llama-3-8b")


def _costs() -> dict[str, object]:
    """A dense model on one GPU, with TP (collectives), without async scheduling (compute + host), with a request
    term in the KV read, an MoE model with EP (routed experts, all-to-all), and a scaled one (the model-error band)."""
    dense = AnalyticCost(LLAMA, H100, 16)
    base = {"dense": dense,
            "tp4": AnalyticCost(LLAMA, H100, 16, shape=Shape(4)),
            "sync": AnalyticCost(LLAMA, A100, 32, async_scheduling=False),
            "moe_ep": AnalyticCost(get_model("qwen3-30b-a3b"), H100, 16, shape=Shape(2, 1, True)),
            "scaled": ScaledCost(AnalyticCost(LLAMA, A100, 16), 1.1)}
    with_requests = AnalyticCost(LLAMA, H100, 16)
    with_requests._attention.request_tokens = 3.5
    base["request_term"] = with_requests
    return base


COSTS = _costs()


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(COSTS)),
       requests=st.lists(st.tuples(st.integers(1, 40_000), st.integers(1, 300)), min_size=1, max_size=80),
       k=st.integers(1, 120), block_size=st.sampled_from([1, 16, 32]))
def test_the_law_prices_a_stretch_as_the_arrays_do(name, requests, k, block_size):
    cost = COSTS[name]
    law = step_law_of(cost)
    assert law is not None
    contexts, remaining = [c for c, _ in requests], [r for _, r in requests]
    live, attended, blocks, *_ = stretch_sums(contexts, remaining, k, block_size, 0, False)
    features = decode_stretch_features(contexts, remaining, k, block_size, 0, False)
    assert law.times(live, attended, blocks) == cost.step_times(features).tolist()


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(sorted(COSTS)), decodes=st.integers(0, 600), prefills=st.integers(0, 8),
       prefill=st.integers(0, 9000), start=st.integers(0, 60_000),
       context=st.one_of(st.integers(0, 5_000), st.integers(0, 4_000_000)),  # (small: compute-bound attention)
       blocks=st.one_of(st.integers(0, 64), st.integers(0, 300_000)), sampled=st.integers(0, 600))
def test_the_law_prices_one_step_as_the_ints_do(name, decodes, prefills, prefill, start, context, blocks, sampled):
    """Any mix of prefill chunks (admitted or continuing: requests > decodes) and decodes, as `scheduled_sums`
    describes it (a step's `StepFeatures` fields in order, no window features)."""
    cost = COSTS[name]
    law = step_law_of(cost)
    assert law is not None
    prefills = min(prefills, prefill)
    attention2 = prefill * (2 * start + prefill)
    sums = (decodes + prefills, prefill, attention2, decodes, context, 0, blocks, min(sampled, decodes + prefills),
            int(decodes + prefill >= 2), 0, 0, 0)
    if sums[0] == 0:
        return  # no step
    assert law.step(sums) == float(cost.step_times(StepFeatures(*sums)))


def test_a_step_with_window_features_is_not_the_laws():
    law = step_law_of(COSTS["dense"])
    assert law is not None
    assert law.step((2, 0, 0, 2, 100, 60, 8, 2, 1, 0, 40, 3)) is None


def test_shapes_priced_another_way_have_no_law():
    """Pipeline parallelism prices micro-batch shares, sliding-window layers their window features, a scaled scaled
    model multiplies twice: each prices its stretches with `step_times` on arrays."""
    assert step_law_of(AnalyticCost(LLAMA, H100, 16, shape=Shape(1, 2))) is None
    assert step_law_of(AnalyticCost(get_model("gemma-3-27b"), H100, 16)) is None
    assert step_law_of(ScaledCost(ScaledCost(AnalyticCost(LLAMA, H100, 16), 1.1), 0.9)) is None


def test_a_count_beyond_the_tables_falls_back():
    """A step of more requests than the tables may hold is priced by the model itself (None here)."""
    cost = replace(AnalyticCost(LLAMA, H100, 16))
    cost._decode_linear.limit = 64
    law = step_law_of(cost)
    assert law is not None
    assert law.times([63, 10], [1000, 900], [70, 60]) is not None
    assert law.times([64], [1000], [70]) is None
    assert law.times([], [], []) == []
    assert law.step((64, 0, 0, 64, 1000, 0, 70, 64, 1, 0, 0, 0)) is not None  # (the general tables' own limit)
    cost._linear.limit = 64
    assert law.step((1, 300, 300 * 300, 0, 0, 0, 19, 1, 1, 0, 0, 0)) is None  # (past its first 256 entries)


@pytest.mark.parametrize("factor", [0.5, 1.0, 1.37])
def test_a_scaled_law_multiplies_last(factor):
    inner = AnalyticCost(LLAMA, H100, 16)
    contexts, remaining = [500, 1200, 7], [3, 40, 9]
    live, attended, blocks, *_ = stretch_sums(contexts, remaining, 30, 16, 0, False)
    law, scaled = step_law_of(inner), step_law_of(ScaledCost(inner, factor))
    assert law is not None and scaled is not None
    assert scaled.times(live, attended, blocks) == [t * factor for t in law.times(live, attended, blocks) or []]


def test_no_cost_model_has_both_a_law_and_recorded_steps():
    """`step_parts` asks for a recorded cost's measured steps only when no step law is given: no model class may
    offer both (a recorded cost replays measured steps; the others have no measurements to replay)."""
    from kvplan.sim.cost.calibrated import CalibratedCost
    from kvplan.sim.cost.recorded import RecordedCost

    for cls in (AnalyticCost, CalibratedCost, RecordedCost, ScaledCost):
        law = getattr(cls, "step_law", None)
        recorded = getattr(cls, "recorded_step_time", None)
        assert law is None or recorded is None, cls.__name__
    assert getattr(RecordedCost, "recorded_step_time", None) is not None  # (the test sees the real attribute)
