"""The simulator on a model mixing sliding-window and full-attention layers: the KV cache groups come from the
model spec, the block count follows vLLM's hybrid rule, and the run reports each kind's share of the pool."""

from __future__ import annotations

import pytest

from kvplan.sim.cost.analytic import kv_capacity_blocks
from kvplan.sim.run import build_configs, build_cost, model_layout, simulate
from kvplan.sim.spec import SimSpec
from kvplan.sim.specs.hardware import get_hardware
from kvplan.sim.specs.models import MODELS, ModelSpec
from tests.sim.helpers import random_trace

KINDS = tuple(("sliding_attention",) * 5 + ("full_attention",)) * 10 + ("sliding_attention",) * 2
SHAPE = dict(num_layers=62, hidden_size=5376, num_heads=32, num_kv_heads=16, head_dim=128, intermediate_size=21504,
             vocab_size=262208, context_len=131072)


@pytest.fixture
def gemma_like(monkeypatch):
    """A Gemma-3-27B-shaped spec (5 sliding layers of window 1024, then 1 full, 62 layers) and its all-full twin,
    as built-in models for the test's duration."""
    monkeypatch.setitem(MODELS, "test-hybrid", ModelSpec("test-hybrid", layer_types=KINDS, sliding_window=1024,
                                                         **SHAPE))
    monkeypatch.setitem(MODELS, "test-uniform", ModelSpec("test-uniform", **SHAPE))
    return "test-hybrid", "test-uniform"


def test_block_count_is_memory_over_ten_layer_blocks(gemma_like):
    hybrid, uniform = gemma_like
    assert model_layout(uniform) is None
    layout = model_layout(hybrid)
    assert layout.group_size == 10 and len(layout.groups) == 7
    # kv_capacity_blocks' own budget below (2048 tokens, 256 sequences), not vLLM's H200 default (8192 / 1024)
    # and kvplan's block size and memory fraction, which the arithmetic below uses (not vLLM 0.34's 64 and 1.0)
    knobs = dict(max_num_batched_tokens=2048, max_num_seqs=256, block_size=16, gpu_memory_utilization=0.9)
    _, blocks = build_cost(SimSpec(model=hybrid, hardware="h200", **knobs))
    _, uniform_blocks = build_cost(SimSpec(model=uniform, hardware="h200", **knobs))
    # the same memory B: floor(B / (62 layers' bytes per block)) uniform, floor(B / (10 layers')) hybrid
    assert uniform_blocks * 62 // 10 <= blocks < (uniform_blocks + 1) * 62 / 10
    model, hardware = MODELS[uniform], get_hardware("h200")
    per_layer_block = 2 * 16 * 128 * 2 * 16  # K and V of 16 heads x 128 dims in fp16, 16 tokens
    budget = uniform_blocks * 62 * per_layer_block  # at least this much memory was left for the KV cache
    assert blocks >= budget // (10 * per_layer_block)
    assert kv_capacity_blocks(model, hardware, 16) == uniform_blocks


def test_simulate_reports_both_budgets(gemma_like):
    hybrid, uniform = gemma_like
    trace = random_trace(1, 60, rate=4.0, prompt=(200, 3000), output=(20, 200))
    spec = SimSpec(model=hybrid, hardware="h200", num_blocks=3000)
    cache, _ = build_configs(spec, trace, 3000, build_cost(spec)[0])
    assert cache.hybrid and cache.kv_layout.group_size == 10
    result = simulate(trace, spec)
    groups = result.info["kv_groups"]
    assert set(groups) == {"sliding_attention", "full_attention"}
    sliding, full = groups["sliding_attention"], groups["full_attention"]
    assert (sliding["groups"], sliding["layers"], sliding["sliding_window"]) == (6, 52, 1024)
    assert (full["groups"], full["layers"], full["sliding_window"]) == (1, 10, None)
    # the kinds' tables hold every block in use: their shares add up to the pool's usage
    assert sliding["usage_mean"] + full["usage_mean"] == pytest.approx(result.summary["kv_usage_mean"], rel=1e-9)
    assert max(sliding["usage_peak"], full["usage_peak"]) <= result.summary["kv_usage_peak"] <= \
        sliding["usage_peak"] + full["usage_peak"]
    assert full["blocks_peak"] == round(full["usage_peak"] * 3000)
    assert result.summary["completed"] == 60
    plain = simulate(trace, SimSpec(model=uniform, hardware="h200", num_blocks=3000))
    assert "kv_groups" not in plain.info


def test_a_window_bounds_what_sliding_groups_hold(gemma_like):
    """One 8,000-token prompt in steps of 2,048: the full group ends holding its whole context; a sliding group
    holds at most 65 blocks decoding (cdiv(1024, 16) + 1), and peaks in the prefill steps [2048, 4096) and
    [4096, 6144): cdiv(4096, 16) - (2048 - 1023) // 16 = 256 - 64 = 192 blocks, so 6 x 192 for the six groups."""
    hybrid, _ = gemma_like
    trace = random_trace(2, 1, prompt=(8000, 8000), output=(100, 100))
    result = simulate(trace, SimSpec(model=hybrid, hardware="h200", num_blocks=4000, max_num_batched_tokens=2048,
                                     block_size=16))
    groups = result.info["kv_groups"]
    assert groups["full_attention"]["blocks_peak"] == -(-8100 // 16)  # 507: every block of 8,099 positions
    assert groups["sliding_attention"]["blocks_peak"] == 6 * 192


def test_sliding_layers_pay_attention_over_the_window_only(gemma_like):
    """One decode at context 3,000 on the Gemma-like spec: its 10 full layers read 3,000 keys in 188 blocks,
    its 52 sliding layers 1,024 keys in 64 blocks; every other term is the all-full twin's, so the two step
    times differ by exactly the attention the window saves."""
    import numpy as np

    from kvplan.sim.cost.analytic import AnalyticCost
    from kvplan.sim.cost.features import decode_stretch_features

    hybrid, uniform = gemma_like
    hw = get_hardware("h200")
    costs = [AnalyticCost(MODELS[name], hw, 16) for name in (hybrid, uniform)]
    assert [c.sliding_window for c in costs] == [1024, 0]
    f = decode_stretch_features(np.array([3000]), np.array([1]), 1, 16, sliding_window=1024)
    assert (int(f.window_context[0]), int(f.window_blocks[0]), int(f.blocks_touched[0])) == (1024, 64, 188)
    from kvplan.sim.gpu import attention as law  # docs/attention.md: a block costs its slots + the gather overhead

    pair, block = 4 * 32 * 128, 2 * 16 * 128 * 2 * (16 + law.GATHER_TOKENS)  # per (query, key) / layer-block
    attn, byte = hw.peak_flops * law.PREFILL_LAW[128][0], hw.hbm_bandwidth * law.DECODE_ETA
    full = max(pair * 62 * 3000 / attn, block * 62 * 188 / byte)
    windowed = max(pair * (10 * 3000 + 52 * 1024) / attn, block * (10 * 188 + 52 * 64) / byte)
    saved = costs[1].step_times(f)[0] - costs[0].step_times(f)[0]
    assert saved == pytest.approx(full - windowed, rel=1e-9) and saved > 0


def test_window_features_of_a_step_match_the_stretch_and_the_integral():
    """A prefill chunk's doubled attention work under a window is 2 × ∫ min(x, W) dx over the chunk (checked
    numerically), the unbounded window gives the plain feature back, and a stretch's window features equal
    its steps' one at a time (the fast path prices hybrid decodes as the step-by-step path does)."""
    import numpy as np

    from kvplan.sim.cost.features import decode_stretch_features, step_features
    from kvplan.sim.cost.step_sums import windowed_attention2

    for start, n, window in [(0, 100, 1024), (512, 1024, 1024), (2000, 48, 1024), (1000, 50, 1024), (0, 1, 1)]:
        x = np.linspace(start, start + n, 200_001)
        integral = 2 * np.trapezoid(np.minimum(x, window), x)
        assert windowed_attention2(start, start + n, window) == pytest.approx(integral, rel=1e-6)
        assert windowed_attention2(start, start + n, 10**9) == n * (2 * start + n)

    class Item:
        def __init__(self, start, n):
            self.num_new_tokens, self.start_pos, self.is_decode, self.samples = n, start, n == 1, True
            self.spec_token_ids = ()

    contexts, remaining = np.array([10, 1020, 1500, 4000]), np.array([3, 30, 30, 1])
    stretch = decode_stretch_features(contexts, remaining, 30, 16, sliding_window=1024)
    for j in range(30):
        items = [Item(int(c) - 1 + j, 1) for c, r in zip(contexts, remaining, strict=True) if j < r]
        one = step_features(items, 16, sliding_window=1024)
        assert (one.window_context, one.window_blocks) == (stretch.window_context[j], stretch.window_blocks[j])
    chunk = step_features([Item(512, 1024)], 16, sliding_window=1024)
    assert (chunk.window_attention2, chunk.window_blocks) == (1024**2 - 512**2 + 2 * 1024 * 512, 64)
