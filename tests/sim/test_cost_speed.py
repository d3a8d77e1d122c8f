"""The step cost's speed-ups change no number: the token tables hold what their terms compute, the decode
shortcuts (one lookup for linear layers and LM head, no +0.0 terms) price a stretch as the general path does, and
the step features' integer rewrites count what the per-item loop counts."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from kvplan.engine.core.request import Request, make_request
from kvplan.sim.cost import reads_spread
from kvplan.sim.cost.analytic import AnalyticCost
from kvplan.sim.cost.features import (
    FEATURE_NAMES,
    StepFeatures,
    decode_stretch_features,
    first_decode_features,
    step_features,
)
from kvplan.sim.cost.parallel import Shape
from kvplan.sim.cost.scaled import ScaledCost
from kvplan.sim.cost.token_table import TokenTable
from kvplan.sim.gpu.table import load_table
from kvplan.sim.specs.hardware import get_hardware
from kvplan.sim.specs.models import get_model

PROFILE = Path(__file__).parent / "data" / "vidur_profiles"  # the fidelity tests' Vidur-format fixture


def _costs() -> dict[str, AnalyticCost]:
    """A dense model on one GPU, with TP (collectives) and PP (float micro-batch shares: the terms' own path), an MoE
    model with EP (routed experts, all-to-all) and a measured table."""
    h100, a100 = get_hardware("h100-sxm"), get_hardware("a100-80gb")
    llama = get_model("llama-3-8b")
    return {"dense": AnalyticCost(llama, h100, 16),
            "tp4": AnalyticCost(llama, h100, 16, shape=Shape(4)),
            "moe_ep": AnalyticCost(get_model("qwen3-30b-a3b"), h100, 16, shape=Shape(2, 1, True)),
            "pp2": AnalyticCost(llama, h100, 16, shape=Shape(1, 2)),
            "measured": AnalyticCost(llama, a100, 16, table=load_table(PROFILE, a100))}


COSTS = _costs()


def _tables(cost: AnalyticCost) -> list[tuple[str, TokenTable]]:
    named = [("linear", cost._linear), ("head", cost._head), ("decode_linear", cost._decode_linear),
             ("experts", cost._expert_table), ("collectives", cost._collective_table)]
    return [(name, table) for name, table in named if table is not None]


@pytest.mark.parametrize("name", sorted(COSTS))
def test_every_table_entry_is_its_terms_plain_int_answer(name):
    cost = replace(COSTS[name])  # fresh, empty tables
    tables = _tables(cost)
    assert len(tables) >= 3
    for label, table in tables:
        counts = [*range(700), 4095, 4096, 20_000]  # past the first fill (256) and grown twice
        looked_up = [table.at(x) for x in counts]
        assert len(table._values) > 4096
        for x, value in zip(counts, looked_up, strict=True):
            assert type(value) is float and value == table.term(x), (label, x)  # bit-identical, a Python float


@pytest.mark.parametrize("name", sorted(COSTS))
def test_array_lookups_match_the_terms_array_form_and_fall_back_outside_the_table(name):
    cost = replace(COSTS[name])
    rng = np.random.default_rng(7)
    for label, table in _tables(cost):
        inside = rng.integers(0, 3000, 50)
        assert np.array_equal(table.at(inside), table.term(inside)), label
        beyond = np.array([1, 5, table.limit + 3], dtype=np.int64)  # past the limit: the term prices all of it
        assert np.array_equal(table.at(beyond), table.term(beyond)), label
        assert len(table._values) <= table.limit
        other = inside.astype(np.int32)  # another dtype, and a PP micro-batch's float share: the term's own path
        assert np.array_equal(table.at(other), table.term(other))
        assert table.at(12.5) == table.term(12.5)


def _stretch(rng: np.random.Generator) -> StepFeatures:
    n, k = int(rng.integers(1, 40)), int(rng.integers(1, 60))
    contexts = rng.integers(1, 9000, n).astype(np.int64)
    remaining = rng.integers(1, 80, n).astype(np.int64)
    return decode_stretch_features(contexts, remaining, k, 16)


def _general(f: StepFeatures) -> StepFeatures:
    """The same stretch without the decode shortcuts: explicit zero arrays, one distinct array per feature."""
    zeros = np.zeros_like(f.num_requests)
    return StepFeatures(f.num_requests.copy(), zeros, zeros.copy(), f.decode_requests.copy(), f.decode_context,
                        f.decode_context_max, f.blocks_touched, f.sampled.copy(), f.batched)


@pytest.mark.parametrize("name", sorted(COSTS))
def test_a_stretch_prices_as_the_general_path_and_as_its_steps_one_by_one(name):
    cost = replace(COSTS[name])
    rng = np.random.default_rng(11)
    for _ in range(20):
        f = _stretch(rng)
        assert f.num_requests is f.decode_requests is f.sampled  # what the shortcut keys on
        times = cost.step_times(f)
        assert np.array_equal(times, cost.step_times(_general(f)))
        steps = [StepFeatures(*(v if isinstance(v, int) else int(v[j]) for v in
                                (getattr(f, name) for name in f.__slots__))) for j in range(len(times))]
        assert times.tolist() == [cost.step_times(step) for step in steps]  # bit-identical


def test_a_pickled_cost_prices_the_same():
    """Replicas in other processes get the cost pickled: the tables' terms are its bound methods."""
    cost = replace(COSTS["tp4"])
    f = _stretch(np.random.default_rng(3))
    before = cost.step_times(f)
    copy = pickle.loads(pickle.dumps(cost))
    assert np.array_equal(copy.step_times(f), before)
    assert copy._linear.term.__self__ is copy


def _request(computed: int) -> Request:
    """A core request that has computed `computed` tokens (a bulk decode: the step computes its next one)."""
    request = make_request(f"r{computed}", prompt_len=computed + 1, max_tokens=8)
    request.num_computed_tokens = computed
    return request


@dataclass
class _Item:
    num_new_tokens: int
    start_pos: int
    is_decode: bool = True
    samples: bool = True
    spec_token_ids: tuple[int, ...] = ()


@pytest.mark.parametrize("block_size", [1, 3, 16, 64])
@pytest.mark.parametrize("window", [0, 40])
def test_bulk_decodes_count_what_the_per_item_loop_counts(block_size, window):
    rng = np.random.default_rng(block_size + window)
    for _ in range(30):
        computed = [int(c) for c in rng.integers(0, 300, int(rng.integers(1, 20)))]
        bulk = step_features((), block_size, 0, [_request(c) for c in computed], window)
        items = step_features([_Item(1, c) for c in computed], block_size, 0, (), window)
        assert bulk == items
        assert first_decode_features([c + 1 for c in computed], block_size, window) == items


@pytest.mark.parametrize("name", ["dense", "moe_ep"])
def test_leaving_out_the_zero_attention_terms_changes_no_bit(name):
    """The attention law with every term written out (prefill work and the per-request read included, both 0 in
    a decode step) gives the shortcut's seconds exactly, for a step and a stretch."""
    a = COSTS[name]._attention
    f = _stretch(np.random.default_rng(5))
    for ctx, blocks, n in [(f.decode_context, f.blocks_touched, f.decode_requests),
                           (int(f.decode_context[0]), int(f.blocks_touched[0]), int(f.decode_requests[0]))]:
        prefill = a._prefill_unit * (0 / 2.0 + a._queries_k0 * 0)
        compute = (prefill + a._decode_unit * ctx) / a._flop_rate
        read = a._token_bytes * (blocks * a._block_tokens + a.request_tokens * n) / a._byte_rate
        full = np.maximum(compute, read) + a._floor
        step = StepFeatures(n, 0, 0, n, ctx, ctx, blocks, n, 1)
        assert np.array_equal(a.time(step), full)


@pytest.mark.parametrize("name", sorted(COSTS))
def test_the_analytic_cost_reads_no_spread_so_stretches_may_leave_it_out(name):
    """`reads_spread` False is true of every analytic shape: a step prices the same whatever its longest context
    and `batched`, so a stretch without them (`spread=False`) prices as one with them."""
    cost = replace(COSTS[name])
    assert reads_spread(cost) is False and reads_spread(ScaledCost(cost, 2.0)) is False
    rng = np.random.default_rng(5)
    for _ in range(20):
        n, k = int(rng.integers(1, 40)), int(rng.integers(1, 60))
        contexts, remaining = rng.integers(1, 9000, n), rng.integers(1, 80, n)
        full = decode_stretch_features(contexts, remaining, k, 16)
        lean = decode_stretch_features(contexts, remaining, k, 16, spread=False)
        assert lean.decode_context_max == 0 and lean.batched == 0
        assert np.array_equal(cost.step_times(full), cost.step_times(lean))
        step = StepFeatures(*(int(rng.integers(0, 5000)) for _ in FEATURE_NAMES))
        for spread in ({"decode_context_max": 0, "batched": 0}, {"decode_context_max": 10**6, "batched": 1}):
            assert cost.step_times(replace(step, **spread)) == cost.step_times(step)


def test_a_model_that_does_not_say_reads_the_spread():
    assert reads_spread(object()) is True  # (a calibrated profile prices it: the default keeps it)
