"""The attention kernel model (`sim.gpu.attention`): its law by hand, the block-size effect, the published points
and the constants fitted on them, the CPU measurement path (no timing asserted), and docs/attention.md being what
scripts/attention_block_size.py writes."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.sim.cost.features import StepFeatures, decode_stretch_features, step_features
from kvplan.sim.gpu import attention
from kvplan.sim.gpu.attention import AttentionCost, prefill_law
from kvplan.sim.gpu.attention_reference import (
    DECODE_POINTS,
    FITTED,
    POINTS,
    PREFILL_POINTS,
    error_summary,
    fit_constants,
    point_errors,
)
from kvplan.sim.specs.hardware import get_hardware
from kvplan.sim.specs.models import get_model

ROOT = Path(__file__).resolve().parents[2]
LLAMA = get_model("llama-3-8b")  # 32 layers, 32 heads, 8 KV heads, head_dim 128
A100 = get_hardware("a100-80gb")
PAIR = 4 * 32 * 32 * 128  # FLOPs per (query, key) pair over the layers
KV_TOKEN = 2 * 32 * 8 * 128 * 2  # K/V bytes per token over the layers, bf16


def _item(n, start, decode=False):
    return type("Item", (), {"num_new_tokens": n, "start_pos": start, "is_decode": decode, "samples": True,
                           "spec_token_ids": ()})()


def test_decode_batch_by_hand():
    # 64 decodes attending 1000 tokens: 63 blocks of 16 each, bound by the read.
    f = step_features([_item(1, 999, decode=True) for _ in range(64)], 16)
    e, _ = attention.PREFILL_LAW[128]
    compute = PAIR * 64 * 1000 / (A100.peak_flops * e)
    read = KV_TOKEN * (64 * 63 * (16 + attention.GATHER_TOKENS) + attention.REQUEST_TOKENS * 64) / (
        A100.hbm_bandwidth * attention.DECODE_ETA)
    assert read > compute
    expected = read + 32 * attention.KERNEL_S
    assert AttentionCost(LLAMA, A100, 16).time(f) == pytest.approx(expected, rel=1e-12)


def test_prefill_chunk_by_hand():
    # A 2048-token chunk after 4096 cached tokens: 2048 × (4096 + 1024) pairs, 2048 queries, compute-bound.
    f = step_features([_item(2048, 4096)], 16)
    e, k0 = attention.PREFILL_LAW[128]
    compute = PAIR * (2048 * (4096 + 1024) + k0 * 2048) / (A100.peak_flops * e)
    read = KV_TOKEN * 384 * (16 + attention.GATHER_TOKENS) / (A100.hbm_bandwidth * attention.DECODE_ETA)
    assert compute > read
    assert AttentionCost(LLAMA, A100, 16).time(f) == pytest.approx(compute + 32 * attention.KERNEL_S, rel=1e-12)


def test_options_replace_the_fitted_efficiencies():
    f = step_features([_item(512, 0)], 16)
    flat = AttentionCost(LLAMA, A100, 16, attention_efficiency=0.25).time(f)
    _, k0 = attention.PREFILL_LAW[128]
    assert flat == pytest.approx(PAIR * (512 * 256 + k0 * 512) / (A100.peak_flops * 0.25) + 32 * attention.KERNEL_S)
    decode = step_features([_item(1, 4095, decode=True)], 16)
    slow, fast = (AttentionCost(LLAMA, A100, 16, memory_efficiency=x).time(decode) for x in (0.4, 0.8))
    assert slow - 32 * attention.KERNEL_S == pytest.approx(2 * (fast - 32 * attention.KERNEL_S))


def test_prefill_law_interpolates_in_log_head_dim_and_clamps():
    assert prefill_law(128) == attention.PREFILL_LAW[128]
    assert prefill_law(32) == attention.PREFILL_LAW[64] and prefill_law(512) == attention.PREFILL_LAW[256]
    e, k0 = prefill_law(round(2 ** 7.5))  # 181: about halfway between 128 and 256 in log2
    lo, hi = attention.PREFILL_LAW[128], attention.PREFILL_LAW[256]
    w = (math.log2(181) - 7) / 1.0
    assert (e, k0) == pytest.approx((lo[0] + w * (hi[0] - lo[0]), lo[1] + w * (hi[1] - lo[1])))


def test_longer_prefix_raises_the_achieved_efficiency():
    """Per pair, a chunk whose queries read more keys costs less (K0 amortized): e × K / (K + K0)."""
    cost = AttentionCost(LLAMA, A100, 16, kernel_s=0.0)
    short, long = (cost.time(step_features([_item(512, start)], 16)) for start in (0, 8192))
    pairs_short, pairs_long = 512 * 256, 512 * (8192 + 256)
    assert long / pairs_long < short / pairs_short


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 64), min_size=1, max_size=20), st.sampled_from(["a100-80gb", "h100-sxm", "l4"]))
def test_smaller_blocks_are_never_cheaper_at_equal_context(multiples, gpu):
    """Contexts in whole 256-token units: every block size reads the same slots, so only the per-block overhead
    differs, and halving the block never makes decode attention cheaper."""
    ends = [256 * m for m in multiples]
    times = []
    for block in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        f = step_features([_item(1, end - 1, decode=True) for end in ends], block)
        times.append(AttentionCost(LLAMA, get_hardware(gpu), block).time(f))
    assert all(a >= b for a, b in itertools.pairwise(times))
    assert times[0] > times[4]  # block 1 costs more than block 16 (g > 0)


def test_a_stretch_is_priced_bit_identically_to_its_steps():
    contexts, remaining = np.array([40, 300, 1000]), np.array([5, 9, 9])
    stretch = decode_stretch_features(contexts, remaining, 9, 16)
    cost = AttentionCost(LLAMA, A100, 16)
    times = cost.time(stretch)
    for j in range(9):
        alive = [int(c) + j for c, r in zip(contexts, remaining, strict=True) if j < r]
        f = step_features([_item(1, end - 1, decode=True) for end in alive], 16)
        assert float(times[j]) == cost.time(f)


def test_the_published_points_and_their_errors():
    rows = point_errors()
    assert len(rows) == len(POINTS) == 28 and len(PREFILL_POINTS) == 18 and len(DECODE_POINTS) == 10
    for r in rows:
        assert r["measured_s"] > 0 and r["predicted_s"] > 0
        assert r["error_pct"] == pytest.approx(100 * (r["predicted_s"] / r["measured_s"] - 1))
    # the FA3 paper's 616 TFLOP/s at head dim 128, 16k, causal: 1 × 16k² × 16 heads × 128 × 4 / 2 FLOPs
    top = next(p for p in PREFILL_POINTS if p.head_dim == 128 and p.tokens == 16384)
    assert top.seconds == pytest.approx(4 * 16384**2 * 16 * 128 / 2 / 616e12)
    fitted = [r for r, p in zip(rows, POINTS, strict=True) if p in FITTED]
    assert error_summary(fitted)["median_abs_err_pct"] < 5.0  # the law fits what it was fitted on
    # on another GPU the same points answer a transfer question: times scale with its peaks
    l4 = point_errors(get_hardware("l4"))
    assert all(a["predicted_s"] > b["predicted_s"] for a, b in zip(l4, rows, strict=True))


def test_error_summary_by_hand():
    rows = [{"error_pct": x} for x in (-10.0, 5.0, 20.0, -2.0)]
    s = error_summary(rows)
    assert s["family"] == "attention" and s["rows"] == 4
    assert s["median_abs_err_pct"] == pytest.approx(7.5)
    assert s["bias_pct"] == pytest.approx(3.25) and s["median_err_pct"] == pytest.approx(1.5)
    assert s["p90_abs_err_pct"] == pytest.approx(np.percentile([10, 5, 20, 2], 90))


def test_the_shipped_constants_are_what_the_published_points_give():
    c = fit_constants(attention.GATHER_TOKENS)
    for d, (e, k0) in attention.PREFILL_LAW.items():
        assert c.prefill_law[d][0] == pytest.approx(e, abs=1e-4) and c.prefill_law[d][1] == pytest.approx(k0, abs=0.1)
    assert c.decode_eta == pytest.approx(attention.DECODE_ETA, abs=1e-4)
    assert c.request_tokens == pytest.approx(attention.REQUEST_TOKENS, abs=0.01)
    assert c.kernel_s == pytest.approx(attention.KERNEL_S, abs=0.01e-6)
    # the fit assumes prefill points compute-bound and decode points read-bound: check it on the shipped law
    hw = get_hardware("h100-sxm")
    for p in POINTS:
        cost = AttentionCost(p.model(), hw, p.block_size)
        f = p.features()
        compute = (cost._prefill_unit * (f.prefill_attention2 / 2 + cost._queries_k0 * f.prefill_tokens) +
                   cost._decode_unit * f.decode_context) / cost._flop_rate
        read = cost._token_bytes * f.blocks_touched * cost._block_tokens / cost._byte_rate
        assert (compute > read) == (p.kind == "prefill")


def test_the_cpu_gather_overhead_is_the_measured_one():
    rows = json.loads((ROOT / "docs" / "figures" / "attention_cpu_blocks.json").read_text())
    assert round(rows["fit"]["block_tokens"], 2) == attention.GATHER_TOKENS


def test_fit_decode_recovers_known_coefficients():
    from kvplan.bench.attention_blocks import fit_decode

    rows = [{"kind": "decode", "batch": b, "tokens": b * c, "blocks": b * c // s,
             "seconds": 1e-5 + 2e-7 * b * c + 1e-7 * (b * c // s) + 3e-6 * b}
            for b in (1, 4) for c in (256, 1024) for s in (1, 16, 256)]
    fit = fit_decode(rows)
    assert fit.block_tokens == pytest.approx(0.5) and fit.request_tokens == pytest.approx(15.0)
    assert fit.t0 == pytest.approx(1e-5) and fit.median_abs_err < 1e-9


@pytest.mark.engine
def test_the_cpu_measurement_path_on_a_tiny_cache():
    """The rows' shapes and the kernel's agreement with plain attention; no time is asserted."""
    from kvplan.engine.backends.cpu_backend import cpu_kernel_error

    if cpu_kernel_error() is not None:
        pytest.skip(f"the CPU decode kernel is not built here: {cpu_kernel_error()}")
    from kvplan.bench.attention_blocks import Shape, measure_decode, measure_prefill

    shape = Shape(num_heads=4, num_kv_heads=2, head_dim=16)
    rows = measure_decode((1, 4), (8,), (1, 2), reps=1, shape=shape)
    assert [(r["batch"], r["block_size"], r["blocks"], r["tokens"]) for r in rows] == [
        (1, 1, 8, 8), (1, 4, 2, 8), (2, 1, 16, 16), (2, 4, 4, 16)]
    assert all(r["max_abs_diff"] < 1e-4 and r["seconds"] > 0 for r in rows)
    prefill = measure_prefill((4, 8), reps=1, shape=shape)
    assert [(r["chunk"], r["pairs"]) for r in prefill] == [(4, 10), (8, 36)]
    with pytest.raises(ValueError, match="multiples"):
        measure_decode((4,), (6,), (1,), reps=1, shape=shape)


def test_the_docs_page_is_what_the_script_writes():
    spec = importlib.util.spec_from_file_location("attention_block_size", ROOT / "scripts" / "attention_block_size.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    cpu = json.loads(script.CPU_ROWS.read_text())
    assert (ROOT / "docs" / "attention.md").read_text() == script.write_doc(script.model_curves(), cpu)
    assert (ROOT / "docs" / "figures" / "attention_block_size.png").stat().st_size > 10_000


def test_features_left_plain_zero_price_like_arrays():
    """A stretch may keep a feature that is 0 in every step as a plain 0 (StepFeatures' contract)."""
    f = StepFeatures(np.array([2]), 0, 0, np.array([2]), np.array([100]), np.array([50]), np.array([8]),
                     np.array([2]), np.array([1]))
    g = StepFeatures(2, 0, 0, 2, 100, 50, 8, 2, 1)
    cost = AttentionCost(LLAMA, A100, 16)
    assert float(cost.time(f)[0]) == cost.time(g)
