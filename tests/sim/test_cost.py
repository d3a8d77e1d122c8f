"""Cost models, specs and KV capacity arithmetic."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from kvplan.engine.core import CacheConfig, Scheduler, SchedulerConfig, make_request
from kvplan.sim.cost.analytic import AnalyticCost, kv_capacity_blocks, step_ops
from kvplan.sim.cost.calibrated import load_profile
from kvplan.sim.cost.features import FEATURE_NAMES, StepFeatures, decode_stretch_features, step_features
from kvplan.sim.gpu import attention as attn
from kvplan.sim.gpu.laws import GpuLaws
from kvplan.sim.run import build_cost
from kvplan.sim.spec import SimSpec
from kvplan.sim.specs.hardware import HardwareSpec, get_hardware
from kvplan.sim.specs.models import MODELS, get_model


def test_llama2_7b_kv_bytes_and_the_24gb_card_seed_arithmetic():
    llama = get_model("llama-2-7b")
    assert llama.kv_bytes_per_token() == 524_288  # 2 x 32 layers x 32 heads x 128 dims x 2 bytes
    assert 13.3e9 < llama.weight_bytes < 14e9
    card = HardwareSpec("card-24gb", 1e14, 1e12, 24e9, 25e9)
    tokens = kv_capacity_blocks(llama, card, 16, gpu_memory_utilization=1.0, max_num_batched_tokens=0,
                                max_num_seqs=0) * 16
    assert 19_500 < tokens < 20_500  # (24 GB - ~13.5 GB of weights) / 512 KiB ~ 20k tokens
    with_reserve = kv_capacity_blocks(llama, get_hardware("rtx-4090"), 16) * 16
    assert 15_000 < with_reserve < 22_000


def test_kv_dtype_halves_bytes_and_doubles_capacity():
    model, hw = get_model("llama-3-8b"), get_hardware("h100-sxm")
    assert model.kv_bytes_per_token(1) == model.kv_bytes_per_token() / 2
    fp16 = kv_capacity_blocks(model, hw, 16)
    assert kv_capacity_blocks(model, hw, 16, kv_dtype_bytes=1) in (2 * fp16, 2 * fp16 + 1)


def test_builtin_specs_and_hf_config(tmp_path):
    assert set(MODELS) >= {"llama-2-7b", "llama-2-13b", "llama-3-8b", "llama-3-70b", "qwen2.5-7b", "mistral-7b",
                           "opt-13b", "smollm2-135m"}
    assert 7.9e9 < get_model("llama-3-8b").num_params < 8.1e9
    small = get_model("llama-100m")  # the engine's random benchmark model: 12 x 6.3M layers + 24.6M tied embedding
    assert (small.head_dim, small.num_kv_heads, small.tied_embeddings, small.dtype_bytes) == (64, 4, True, 2)
    assert small.num_params == 12 * (768 * 64 * (24 + 8) + 3 * 768 * 2048) + 32000 * 768 == 100_073_472
    cfg = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30,
           "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = get_model(str(tmp_path))
    assert spec.num_params == get_model("smollm2-135m").num_params
    with pytest.raises(ValueError, match=r"allowed: a built-in model \(.*30 in all: `kvplan simulate --help` "
                                         r"lists them\)"):
        get_model("gpt-5")
    with pytest.raises(ValueError, match="allowed: a100-40gb, a100-80gb, a10g, a40, b200, h100-sxm, h200, l4, "
                                         "l40s, rtx-4090, rtx-pro-6000"):
        get_hardware("tpu")


def test_the_published_papers_models_match_their_configs():
    """OPT-66B (DistServe), Llama-2-70B and BLOOM-176B (Splitwise), as their HF config.json state them: the sizes in
    their names, and a token's fp16 KV (2 x layers x KV heads x head dim x 2 bytes)."""
    expected = {"opt-66b": (65e9, 67e9, 2 * 64 * 72 * 128 * 2, 2048),
                "llama-2-70b": (68e9, 70e9, 2 * 80 * 8 * 128 * 2, 4096),
                "bloom-176b": (175e9, 177e9, 2 * 70 * 112 * 128 * 2, None)}
    for name, (low, high, kv_bytes, context) in expected.items():
        spec = get_model(name)
        assert low < spec.num_params < high, name
        assert (spec.kv_bytes_per_token(), spec.context_len) == (kv_bytes, context), name
    assert not get_model("bloom-176b").gated_mlp and get_model("bloom-176b").tied_embeddings


def _attention_by_hand(pair_flops, kv_token, layers, rate, pairs, queries, context, blocks, requests, kv_rate):
    """`sim.gpu.attention`'s law (docs/attention.md) at head dim 128 with the attention rate `rate` and the KV read
    at `kv_rate` bytes/s (a set `memory_efficiency` applies to the KV reads too)."""
    _, k0 = attn.PREFILL_LAW[128]
    compute = pair_flops * (pairs + k0 * queries + context) / rate
    read = kv_token * (blocks * (16 + attn.GATHER_TOKENS) + attn.REQUEST_TOKENS * requests) / kv_rate
    return max(compute, read) + layers * attn.KERNEL_S


def test_analytic_decode_step_is_the_roofline_by_hand():
    # Llama-2-7B (untied): the step streams the layers and the LM head, not the input embedding table.
    model, hw = get_model("llama-2-7b"), get_hardware("a100-80gb")
    # the pure roofline laws with 128-row GEMM tiles and no kernel floors, at 0.5 of both peaks
    roofline = GpuLaws(gemm_tile_m=128, elementwise_bandwidth_efficiency=0.5)
    cost = AnalyticCost(model, hw, 16, compute_efficiency=0.5, memory_efficiency=0.5, step_overhead_s=1e-3,
                        request_overhead_s=1e-4, admit_overhead_s=0.0, async_scheduling=False, laws=roofline)
    f = decode_stretch_features(np.array([100, 200]), np.array([5, 5]), 1, 16)  # decodes attending 100 and 200
    layers = 32 * (4096 * 128 * (32 + 32 + 32 + 32) + 3 * 4096 * 11008)
    head = 32000 * 4096
    assert (model.layer_matmul_params, model.lm_head_params) == (layers, head) == (6_476_005_376, 131_072_000)
    assert model.weight_bytes == 2 * (layers + 2 * head)  # resident; only layers + head are read per step
    kv_token = 524_288
    flop_rate, byte_rate = 312e12 * 0.5, 2.039e12 * 0.5

    def gemm(m, k, n):  # 2 rows cost one 128-row tile; the weight is read once, the activations in and out
        return max(2 * k * n * 128 / flop_rate, (k * n + m * (k + n)) * 2 / byte_rate)

    gemms = 32 * (gemm(2, 4096, 3 * 4096) + gemm(2, 4096, 4096) + gemm(2, 4096, 2 * 11008) + gemm(2, 11008, 4096))
    # norms 2h (twice per layer and once at the end), RoPE on q and k, the residual add 3h, SwiGLU 3i, the
    # embedding gather 2h; the KV write reads K and V and stores them
    elementwise = (65 * 2 * 4096 + 32 * (2 * 64 * 128 + 3 * 4096 + 3 * 11008) + 2 * 4096) * 2 + 2 * kv_token
    expected = (gemms + gemm(2, 4096, 32000)  # both rows are sampled
                + _attention_by_hand(4 * 32 * 32 * 128, kv_token, 32, 312e12 * attn.PREFILL_LAW[128][0], 0, 0, 300,
                                     7 + 13, 2, byte_rate)
                + 2 * elementwise / byte_rate + 1e-3 + 2e-4)
    assert cost.step_times(f)[0] == pytest.approx(expected, rel=1e-12)
    assert cost.transfer_time(4, 0) == pytest.approx(4 * 16 * 524_288 / hw.host_link_bandwidth)
    assert cost.transfer_time(0, 3) == pytest.approx(2 * 3 * 16 * 524_288 / byte_rate)


# Llama-3-8B by hand (HF config.json): 32 layers, hidden 4096, 32 heads, 8 KV heads of 128, MLP 14336, vocab
# 128256, bf16; on an A100-80GB (312 TFLOP/s dense bf16, 2.039 TB/s) at non-default efficiencies.
L, HID, HEADS, KV_HEADS, HD, INTER, VOCAB = 32, 4096, 32, 8, 128, 14336, 128256
LAYER_PARAMS = L * (HID * HD * (2 * HEADS + 2 * KV_HEADS) + 3 * HID * INTER)  # q, o + k, v; gate, up, down
HEAD_PARAMS = VOCAB * HID
KV_TOKEN = 2 * L * KV_HEADS * HD * 2
# per layer two norms (2h each), RoPE on q and k, the residual add (3h), SwiGLU (3i); the final norm and the
# embedding gather (2h each) once; the KV write reads K and V and stores them
ELEMENTWISE_TOKEN = ((2 * L + 1) * 2 * HID + L * (2 * (HEADS + KV_HEADS) * HD + 3 * HID + 3 * INTER) + 2 * HID) * 2 \
    + 2 * KV_TOKEN
# the pure roofline laws with 128-row GEMM tiles and no kernel floors; element-wise ops at 0.8 of HBM
ROOFLINE = GpuLaws(gemm_tile_m=128, elementwise_bandwidth_efficiency=0.8)
PAIR_FLOPS = 4 * L * HEADS * HD  # QK^T and PV per (query, key) pair
FLOP_RATE, ATTN_RATE, BYTE_RATE = 312e12 * 0.5, 312e12 * 0.4, 2.039e12 * 0.8


def _gemm(m, k, n):
    """The GEMM law at ROOFLINE: M rows in whole 128-row tiles vs the weight read once plus the activations."""
    return max(2 * k * n * 128 * -(-m // 128) / FLOP_RATE, (k * n + m * (k + n)) * 2 / BYTE_RATE)


def _layers(m):
    """Every layer's qkv, o, gate+up and down projections over m rows."""
    return L * (_gemm(m, HID, (HEADS + 2 * KV_HEADS) * HD) + _gemm(m, HEADS * HD, HID) + _gemm(m, HID, 2 * INTER)
                + _gemm(m, INTER, HID))


def _llama3_cost():
    return AnalyticCost(get_model("llama-3-8b"), get_hardware("a100-80gb"), 16, compute_efficiency=0.5,
                        memory_efficiency=0.8, attention_efficiency=0.4, step_overhead_s=1e-3,
                        request_overhead_s=1e-4, admit_overhead_s=0.0, async_scheduling=False, laws=ROOFLINE)


def _item(n, start, decode=False, samples=True):
    return SimpleNamespace(num_new_tokens=n, start_pos=start, is_decode=decode, samples=samples, spec_token_ids=())


def test_llama3_shapes_by_hand():
    model = get_model("llama-3-8b")
    assert (LAYER_PARAMS, HEAD_PARAMS, KV_TOKEN) == (6_979_321_856, 525_336_576, 131_072)
    assert (model.layer_matmul_params, model.lm_head_params, model.kv_bytes_per_token()) == (
        LAYER_PARAMS, HEAD_PARAMS, KV_TOKEN)
    assert model.matmul_params == LAYER_PARAMS + HEAD_PARAMS
    gemms, elementwise, weight = step_ops(model)
    assert [(op.name, op.count, op.k, op.n) for op in gemms] == [
        ("attn_pre_proj", L, HID, (HEADS + 2 * KV_HEADS) * HD), ("attn_post_proj", L, HEADS * HD, HID),
        ("mlp_up_proj", L, HID, 2 * INTER), ("mlp_down_proj", L, INTER, HID)]
    assert sum(op.count * op.bytes_per_token for op in elementwise) == ELEMENTWISE_TOKEN == 5_537_792
    assert weight == 2


def test_analytic_pure_decode_batch_by_hand():
    # 64 decodes each attending 1000 tokens (63 blocks of 16): 64 rows cost a whole 128-row tile.
    f = step_features([_item(1, 999, decode=True) for _ in range(64)], 16)
    layers = _layers(64)
    assert layers == pytest.approx(2 * LAYER_PARAMS * 128 / FLOP_RATE)  # 11.5 ms: the tile outweighs the read
    head = _gemm(64, HID, VOCAB)
    attention = _attention_by_hand(PAIR_FLOPS, KV_TOKEN, L, ATTN_RATE, 0, 0, 64 * 1000, 64 * 63, 64, BYTE_RATE)
    expected = layers + head + attention + 64 * ELEMENTWISE_TOKEN / BYTE_RATE + 1e-3 + 64 * 1e-4
    assert _llama3_cost().step_times(f) == pytest.approx(expected, rel=1e-12)
    assert 0.024 < expected < 0.027  # 11.4 + 0.9 + 5.6 + 0.2 ms + 7.4 ms of overheads


def test_analytic_long_prefill_with_cached_prefix_by_hand():
    # The last 2048-token chunk of a prompt whose first 4096 tokens are cached: 2048 × (4096 + 1024) causal pairs,
    # attention reads 6144 / 16 = 384 blocks; one sampled row.
    f = step_features([_item(2048, 4096)], 16)
    layers = _layers(2048)
    head = _gemm(1, HID, VOCAB)
    attention = _attention_by_hand(PAIR_FLOPS, KV_TOKEN, L, ATTN_RATE, 2048 * (4096 + 1024), 2048, 0, 384, 0,
                                   BYTE_RATE)
    expected = layers + head + attention + 2048 * ELEMENTWISE_TOKEN / BYTE_RATE + 1e-3 + 1e-4
    assert _llama3_cost().step_times(f) == pytest.approx(expected, rel=1e-12)
    assert 0.23 < expected < 0.25


def test_analytic_mixed_step_by_hand():
    # 10 decodes attending 500 tokens (32 blocks) + a 300-token first chunk of a longer prompt (19 blocks, not
    # sampled): 310 rows cost 3 tiles (384 rows), the 10 sampled rows one tile.
    items = [_item(1, 499, decode=True) for _ in range(10)] + [_item(300, 0, samples=False)]
    f = step_features(items, 16)
    layers = _layers(310)  # 310 rows: 3 tiles
    head = _gemm(10, HID, VOCAB)
    attention = _attention_by_hand(PAIR_FLOPS, KV_TOKEN, L, ATTN_RATE, 300 * 150, 300, 10 * 500, 10 * 32 + 19, 10,
                                   BYTE_RATE)
    elementwise = 310 * ELEMENTWISE_TOKEN / BYTE_RATE
    expected = layers + head + attention + elementwise + 1e-3 + 11 * 1e-4
    assert _llama3_cost().step_times(f) == pytest.approx(expected, rel=1e-12)


def test_lm_head_grows_with_sampled_rows_not_prefill_tokens():
    cost = _llama3_cost()

    def price(prefill, sampled):
        return cost.step_times(StepFeatures(1, prefill, prefill * prefill, 0, 0, 0, -(-prefill // 16), sampled,
                                               int(prefill >= 2)))

    head_tile = 2 * HEAD_PARAMS * 128 / FLOP_RATE
    assert head_tile == _gemm(128, HID, VOCAB)  # compute bound: a whole tile whatever its rows
    for prefill in (128, 2048, 8192):  # a chunk that samples pays one head tile, however long it is
        assert price(prefill, 1) - price(prefill, 0) == pytest.approx(head_tile, rel=1e-9)
    assert price(2048, 128) == price(2048, 1)  # one tile holds up to 128 sampled rows
    assert price(2048, 129) - price(2048, 0) == pytest.approx(2 * head_tile, rel=1e-9)  # compute-bound: 2 tiles
    # Charging the head on every prompt token would cost 2048 rows' worth; the head is ~0.5% of this step.
    assert price(2048, 1) - price(2048, 0) < 0.01 * price(2048, 1)


def test_elementwise_share_of_a_long_prefill():
    model, hw = get_model("llama-3-8b"), get_hardware("a100-80gb")
    cost = AnalyticCost(model, hw, 16)  # the defaults: the shipped laws
    step = cost.step_times(step_features([_item(2048, 0)], 16))
    law = cost.resolved_laws
    _, ops, _ = step_ops(model)
    elementwise = sum(op.count * law.elementwise_time(op.law or op.name, 2048 * op.bytes_per_token, hw) for op in ops)
    assert 0.03 < elementwise / step < 0.12


@pytest.mark.parametrize("model_name,hardware", [("llama-3-8b", "a100-80gb"), ("llama-100m", "h100-sxm")])
def test_stretch_and_single_steps_price_bit_identically(model_name, hardware):
    cost = AnalyticCost(get_model(model_name), get_hardware(hardware), 16, kv_dtype_bytes=1)
    rng = np.random.default_rng(3)
    contexts = rng.integers(1, 5000, 140)
    remaining = rng.integers(1, 40, 140)  # the batch shrinks across the 128-row tile boundary
    k = 40
    stretch = decode_stretch_features(contexts, remaining, k, 16)
    times = cost.step_times(stretch)
    assert isinstance(times, np.ndarray) and times.shape == (k,)
    for j in range(k):
        single = StepFeatures(*(int(np.broadcast_to(getattr(stretch, name), k)[j]) for name in FEATURE_NAMES))
        assert cost.step_times(single) == times[j], j  # bit-identical, not approx
    alive = np.broadcast_to(stretch.num_requests, k)
    assert alive[0] > 128 > alive[-1]


def test_analytic_rejects_bad_options():
    model, hw = get_model("llama-100m"), get_hardware("a100-80gb")
    with pytest.raises(ValueError, match=r"cost\.attention_efficiency"):
        AnalyticCost(model, hw, 16, attention_efficiency=1.5)
    with pytest.raises(ValueError, match=r"cost\.gemm_tile_rows"):
        AnalyticCost(model, hw, 16, gemm_tile_rows=0)


def _profile(tmp_path, text: str):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


def test_calibrated_profile_is_a_linear_model_over_the_features(tmp_path):
    path = _profile(tmp_path, "block_size: 16\nkv_capacity_blocks: 500\nswap_seconds_per_block: 0.5\n"
                              "coefficients: {step: 1.0, request: 0.1, prefill_tokens: 0.01, prefill_attention: 0.001,"
                              " decode_requests: 2.0, decode_context: 0.0001, decode_context_max: 0.003,"
                              " blocks_touched: 0.2}\n")
    cost = load_profile(path)
    cache = CacheConfig(block_size=16, num_blocks=64, enable_prefix_caching=False, max_model_len=256)
    sched = Scheduler(cache, SchedulerConfig())
    sched.add_request(make_request("a", prompt_len=40, max_tokens=3))
    sched.update(sched.schedule())
    sched.add_request(make_request("b", prompt_len=20, max_tokens=3))
    step = sched.schedule()  # a decodes at position 40 (attends 41), b prefills 20 tokens from 0
    f = step_features(step.scheduled, 16)
    expected = 1.0 + 0.1 * 2 + 0.01 * 20 + 0.001 * (20 * 10) + 2.0 + 0.0001 * 41 + 0.003 * 41 + 0.2 * (3 + 2)
    assert cost.step_times(f) == pytest.approx(expected)
    assert cost.transfer_time(3, 0) == 1.5
    _, blocks = build_cost(SimSpec(cost="calibrated", profile=str(path), block_size=32))
    assert blocks == 250  # measured at block 16: the same bytes in blocks of 32


@pytest.mark.parametrize("text,match", [
    ("coefficients: {warp: 1}", "coefficients.warp: unknown feature; allowed: step"),
    ("coefficients: {step: fast}", "coefficients.step: must be a finite number of seconds >= 0"),
    ("coefficients: {step: -1.0}", "coefficients.step: must be a finite number of seconds >= 0"),
    ("coefficients: {step: .inf}", "coefficients.step: must be a finite number of seconds >= 0"),
    ("coefficients: {step: true}", "coefficients.step: must be a finite number of seconds >= 0"),
    ("coefficients: {step: 0}", "all zero would price every step at 0 s"),
    ("speed: 1\ncoefficients: {step: 1}", "unknown key 'speed'"),
    ("kv_capacity_blocks: -3\ncoefficients: {step: 1}", "kv_capacity_blocks: must be an integer >= 1"),
])
def test_bad_profiles_name_the_key(tmp_path, text, match):
    with pytest.raises(ValueError, match=match):
        load_profile(_profile(tmp_path, text))


def test_stretch_features_match_single_steps_of_the_core():
    cache = CacheConfig(block_size=4, num_blocks=200, enable_prefix_caching=False, max_model_len=128)
    sched = Scheduler(cache, SchedulerConfig())
    for i, (prompt, max_tokens) in enumerate(((5, 50), (9, 4), (30, 9))):  # two finish inside the stretch
        sched.add_request(make_request(str(i), prompt_len=prompt, max_tokens=max_tokens))
    sched.update(sched.schedule())
    contexts = np.array([r.num_computed_tokens + 1 for r in sched.running])
    remaining = np.array([r.max_tokens - r.num_output_tokens for r in sched.running])
    stretch = decode_stretch_features(contexts, remaining, 12, 4)
    assert stretch.num_requests.tolist() == [3, 3, 3, 2, 2, 2, 2, 2, 1, 1, 1, 1]
    for j in range(12):
        out = sched.schedule()
        step = step_features(out.scheduled, 4)
        for name in FEATURE_NAMES:
            assert getattr(step, name) == np.broadcast_to(getattr(stretch, name), 12)[j], (name, j)
        sched.update(out)
