"""`DecodeLaw` prices a pure-decode stretch as `AnalyticCost.step_times` does on the stretch's arrays, bit for bit,
for every model shape that has one; the shapes that take another branch of `step_times` have none."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.sim.cost import decode_law_of
from kvplan.sim.cost.analytic import AnalyticCost
from kvplan.sim.cost.features import decode_stretch_features
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
    law = decode_law_of(cost)
    assert law is not None
    contexts, remaining = [c for c, _ in requests], [r for _, r in requests]
    live, attended, blocks, *_ = stretch_sums(contexts, remaining, k, block_size, 0, False)
    features = decode_stretch_features(contexts, remaining, k, block_size, 0, False)
    assert law.times(live, attended, blocks) == cost.step_times(features).tolist()


def test_shapes_priced_another_way_have_no_law():
    """Pipeline parallelism prices micro-batch shares, sliding-window layers their window features, a scaled scaled
    model multiplies twice: each prices its stretches with `step_times` on arrays."""
    assert decode_law_of(AnalyticCost(LLAMA, H100, 16, shape=Shape(1, 2))) is None
    assert decode_law_of(AnalyticCost(get_model("gemma-3-27b"), H100, 16)) is None
    assert decode_law_of(ScaledCost(ScaledCost(AnalyticCost(LLAMA, H100, 16), 1.1), 0.9)) is None


def test_a_count_beyond_the_tables_falls_back():
    """A step of more requests than the tables may hold is priced by the model itself (None here)."""
    cost = replace(AnalyticCost(LLAMA, H100, 16))
    cost._decode_linear.limit = 64
    law = decode_law_of(cost)
    assert law is not None
    assert law.times([63, 10], [1000, 900], [70, 60]) is not None
    assert law.times([64], [1000], [70]) is None
    assert law.times([], [], []) == []


@pytest.mark.parametrize("factor", [0.5, 1.0, 1.37])
def test_a_scaled_law_multiplies_last(factor):
    inner = AnalyticCost(LLAMA, H100, 16)
    contexts, remaining = [500, 1200, 7], [3, 40, 9]
    live, attended, blocks, *_ = stretch_sums(contexts, remaining, 30, 16, 0, False)
    law, scaled = decode_law_of(inner), decode_law_of(ScaledCost(inner, factor))
    assert law is not None and scaled is not None
    assert scaled.times(live, attended, blocks) == [t * factor for t in law.times(live, attended, blocks) or []]
