"""Deployment shapes: MoE and MLA specs against hand-computed bytes and FLOPs, tensor and pipeline parallelism
(what a rank holds, what it pays, what is refused), and config.json's MoE / MLA / sliding-window keys."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvplan.errors import UserError
from kvplan.sim.cost import StepFeatures
from kvplan.sim.cost.analytic import AnalyticCost, kv_capacity_blocks
from kvplan.sim.cost.features import decode_stretch_features
from kvplan.sim.cost.moe import expected_touched
from kvplan.sim.cost.parallel import Shape
from kvplan.sim.gpu import attention as attention_law
from kvplan.sim.gpu import custom_allreduce as car
from kvplan.sim.run import build_cost
from kvplan.sim.spec import SimSpec
from kvplan.sim.specs.hardware import get_hardware
from kvplan.sim.specs.models import MODELS, get_model

# DeepSeek-V2-Lite by hand (config.json): 27 layers, hidden 2048, 16 heads; MLA: q 2048 -> 16 x (128 nope + 64
# rope), kv_a 2048 -> 512 latent + 64 rope key, kv_b 512 -> 16 x (128 + 128 v), o 16 x 128 -> 2048; layer 0 dense
# (MLP 10944), 26 MoE layers of 64 routed + 2 shared experts of 1408, 6 routed per token, router 2048 x 64.
ATTN = 2048 * 16 * 192 + 2048 * 576 + 512 * 16 * 256 + 16 * 128 * 2048
EXPERT = 3 * 2048 * 1408
DENSE_LAYER = ATTN + 3 * 2048 * 10944
MOE_FIXED = ATTN + 2048 * 64 + 2 * EXPERT
ROUTED = 26 * 64 * EXPERT
EMBED = 102400 * 2048


def test_deepseek_v2_lite_weights_kv_and_active_params_by_hand():
    m = get_model("deepseek-v2-lite")
    assert (ATTN, EXPERT) == (13_762_560, 8_650_752)
    assert m.attention_params == ATTN and m.expert_params == EXPERT
    assert m.layer_matmul_params == DENSE_LAYER + 26 * MOE_FIXED + ROUTED == 15_286_927_360
    assert m.num_params == 15_706_357_760  # the model card's 15.7B
    assert m.weight_bytes == 2 * m.num_params
    # a token multiplies through the dense part and 6 of the 64 routed experts per MoE layer
    assert m.active_layer_params == DENSE_LAYER + 26 * MOE_FIXED + 26 * 6 * EXPERT == 2_241_593_344
    # MLA: the 512-wide latent and the 64-wide RoPE key, per layer, bf16 - whole on every TP rank
    assert m.kv_bytes_per_token() == 27 * (512 + 64) * 2 == 31_104
    assert m.kv_bytes_per_token(tp=8) == 31_104 and m.kv_bytes_per_token(pp=3) == 9 * 576 * 2
    # decode attends in the latent space: scores over 512 + 64 dims and values of 512 per head
    assert m.decode_pair_flops == 2 * 27 * 16 * (2 * 512 + 64)
    assert m.prefill_pair_flops == 2 * 27 * 16 * (128 + 64 + 128)


def test_deepseek_v3_is_671b_in_fp8_with_bf16_tables():
    m = get_model("deepseek-v3")
    assert 670e9 < m.num_params < 672e9  # the published 671B (the MTP module is not served)
    assert m.weight_bytes == m.layer_matmul_params * 1 + 2 * 129280 * 7168 * 2
    assert m.kv_bytes_per_token() == 61 * 576 * 2  # 70,272 bytes vs a GQA-equivalent's megabytes


def test_gqa_kv_heads_split_then_replicate_across_ranks():
    m = get_model("llama-3.1-70b")  # 8 KV heads of 128, 80 layers
    assert m.kv_bytes_per_token() == 2 * 80 * 8 * 128 * 2
    assert m.kv_bytes_per_token(tp=4) == 2 * 80 * 2 * 128 * 2
    assert m.kv_bytes_per_token(tp=8) == m.kv_bytes_per_token(tp=16) == 2 * 80 * 1 * 128 * 2  # replicated
    assert m.kv_bytes_per_token(pp=3) == 2 * 27 * 8 * 128 * 2  # the largest stage: ceil(80 / 3) layers


def test_moe_expert_gemms_priced_by_tokens_routed():
    model, hw = get_model("qwen3-30b-a3b"), get_hardware("h100-sxm")
    cost = AnalyticCost(model, hw, 16)
    experts = cost._experts
    flop_rate, byte_rate = experts.flop_rate, experts.byte_rate  # the GEMM law's efficiencies
    assert experts.tile == cost.resolved_laws.gemm_tile_m == 128
    expert = 3 * 2048 * 768
    # one token reaches exactly its 8 experts: each a one-row GEMM costing a 128-row tile or its weight read
    assert expected_touched(128, 8, 1) == pytest.approx(8)
    one = 48 * max(2 * expert * 8 * 128 / flop_rate, 8 * expert * 2 / byte_rate)
    assert experts.time(1) == pytest.approx(one, rel=1e-12)
    # 64 decodes touch ~126 of 128 experts for ~4 rows each: the step reads nearly every expert
    touched = 128 * (1 - (120 / 128) ** 64)
    assert 125 < touched < 127
    assert experts.time(64) == pytest.approx(48 * touched * expert * 2 / byte_rate, rel=1e-12)
    # a 16,384-token prefill touches all 128, 1,024 rows each: compute bound over the active experts only
    assert experts.time(16384) == pytest.approx(48 * 2 * 16384 * 8 * expert / flop_rate, rel=1e-9)
    # the arrays of the decode fast path give the same times
    assert np.allclose(experts.time(np.array([1, 64, 16384])),
                       [experts.time(1), experts.time(64), experts.time(16384)])


def test_one_moe_step_by_hand():
    # a decode step of 1 request on Qwen3-30B-A3B, 1 GPU: the dense part, the head, attention, element-wise
    # and the 8 routed experts of each of the 48 layers
    model, hw = get_model("qwen3-30b-a3b"), get_hardware("h100-sxm")
    cost = AnalyticCost(model, hw, 16, step_overhead_s=0.0, request_overhead_s=0.0)
    f = decode_stretch_features(np.array([100]), np.array([1]), 1, 16)
    law = cost.resolved_laws
    byte = 3.35e12 * law.gemm_memory_efficiency
    # attention: sim.gpu.attention's law (docs/attention.md) at head dim 128, one decode of 100 tokens in 7 blocks
    attn = 989e12 * attention_law.PREFILL_LAW[128][0]
    gather, eta, floor = attention_law.GATHER_TOKENS, attention_law.DECODE_ETA, attention_law.KERNEL_S
    attention = 2048 * 128 * (2 * 32 + 2 * 4)
    assert model.dense_part_params == 48 * (attention + 2048 * 128)  # attention and router; no shared expert
    kv_token = 2 * 48 * 4 * 128 * 2
    # per layer: the qkv (2048 x 5120), o (4096 x 2048) and router (2048 x 128) GEMMs over one row; the LM head
    gemms = 48 * (law.gemm_time(1, 2048, 5120, hw) + law.gemm_time(1, 4096, 2048, hw)
                  + law.gemm_time(1, 2048, 128, hw)) + law.gemm_time(1, 2048, 151936, hw)
    # per layer: two norms (2h elements each, the final norm once more), RoPE on 32 + 4 heads, the residual add
    # (3h), the KV write (K and V read and stored: 2 x 1024 bytes), SiLU-and-multiply over the 8 experts' widths
    elementwise = (49 * law.elementwise_time("input_layernorm", 2 * 2048 * 2, hw)
                   + 48 * law.elementwise_time("post_attention_layernorm", 2 * 2048 * 2, hw)
                   + 48 * law.elementwise_time("attn_rope", 2 * 36 * 128 * 2, hw)
                   + 48 * law.elementwise_time("add", 3 * 2048 * 2, hw)
                   + 48 * law.elementwise_time("add", 2 * kv_token / 48, hw)
                   + 48 * law.elementwise_time("mlp_act", 3 * 8 * 768 * 2, hw)
                   + law.elementwise_time("emb", 2 * 2048 * 2, hw))
    experts = 48 * max(2 * 3 * 2048 * 768 * 8 * 128 / (989e12 * law.gemm_compute_efficiency),
                       8 * 3 * 2048 * 768 * 2 / byte)
    attention_time = max(4 * 48 * 32 * 128 * 100 / attn, 7 * (16 + gather) * kv_token / (3.35e12 * eta)) + 48 * floor
    expected = gemms + attention_time + elementwise + experts
    assert cost.step_times(f)[0] == pytest.approx(expected, rel=1e-12)


def test_tensor_parallel_step_pays_two_all_reduces_per_layer():
    model, hw = get_model("llama-3.1-70b"), get_hardware("h100-sxm")
    f = decode_stretch_features(np.full(32, 1000), np.full(32, 5), 1, 16)
    kw = dict(step_overhead_s=0.0, request_overhead_s=0.0)
    tp4, single = AnalyticCost(model, hw, 16, **kw, shape=Shape(4)), AnalyticCost(model, hw, 16, **kw)
    # 32 tokens x 8192 hidden x 2 bytes per all-reduce, NVLink SHARP on H100: latency + S / (eta x 450 GB/s)
    law = tp4.resolved_laws
    latency = law.allreduce_latency_s + 3 * law.allreduce_hop_latency_s
    reduce = latency + 32 * 8192 * 2 / (law.allreduce_efficiency * 450e9)
    assert law.allreduce_time(32 * 8192 * 2, 4, hw) == pytest.approx(reduce)
    # on NVLink the step takes the faster of NCCL's law and vLLM's custom kernel (sim.gpu.custom_allreduce)
    custom = car.LAW.time(32 * 8192 * 2, 4, hw)
    assert custom < reduce
    assert tp4._collectives(32) == pytest.approx(2 * 80 * custom)
    # the rest is the rank's quarter of the weights, heads and KV reads (norms and adds run whole on each rank),
    # plus the kernel floors, which do not shrink with TP (every rank launches every kernel)
    assert 0.25 < (tp4.step_times(f)[0] - 2 * 80 * custom) / single.step_times(f)[0] < 0.31
    # A100 (no SHARP): the ring moves 2 (n - 1) / n of the bytes
    a100 = get_hardware("a100-80gb")
    ring = law.allreduce_latency_s + 7 * law.allreduce_hop_latency_s + 1.75 * 1e6 / (law.allreduce_efficiency * 300e9)
    assert law.allreduce_time(1e6, 8, a100) == pytest.approx(ring)
    across = law.network_latency_s + 1e6 / (law.network_efficiency * 25e9)
    assert law.send_recv_time(1e6, a100, across_nodes=True) == pytest.approx(across)


def test_pipeline_step_is_pp_micro_batches_on_the_busiest_stage():
    model, hw = get_model("llama-3.1-70b"), get_hardware("h100-sxm")
    kw = dict(step_overhead_s=0.0, request_overhead_s=0.0)
    pp2 = AnalyticCost(model, hw, 16, **kw, shape=Shape(1, 2))
    f = StepFeatures(64, 0, 0, 64, 64_000, 1000, 64 * 63, 64, 1)
    half = StepFeatures(32.0, 0.0, 0.0, 32.0, 32_000.0, 500.0, 32 * 63.0, 32.0, 0.5)
    law = pp2.resolved_laws
    hop = law.p2p_latency_s + 32 * 8192 * 2 / (law.p2p_efficiency * 450e9)
    assert pp2.step_times(f) == pytest.approx(2 * pp2._stage_time(half) + hop, rel=1e-12)
    # one request cannot be split: its step crosses both stages one after the other
    one = StepFeatures(1, 0, 0, 1, 1000, 1000, 63, 1, 0)
    hop = law.p2p_latency_s + 8192 * 2 / (law.p2p_efficiency * 450e9)
    assert pp2.step_times(one) == pytest.approx(2 * pp2._stage_time(one) + hop)


def test_capacity_per_rank_and_what_does_not_fit():
    model, hw = get_model("llama-3.1-70b"), get_hardware("h100-sxm")
    assert kv_capacity_blocks(model, hw, 16) == 0  # 141 GB of weights on an 80 GB card
    tp2, tp4 = (kv_capacity_blocks(model, hw, 16, shape=Shape(t)) for t in (2, 4))
    assert 0 < tp2 < tp4 and tp4 > 4 * tp2  # TP 4: a quarter of the weights, half the KV heads per rank
    with pytest.raises(UserError, match=r"TP 1 x PP 1: no memory left for the KV cache \(the weights alone need "
                                         r"131.4 GiB .*it fits at --tensor-parallel-size 2 \(2 GPUs per replica\)"):
        build_cost(SimSpec(model="llama-3.1-70b", hardware="h100-sxm"))
    with pytest.raises(UserError, match="no tensor-parallel degree of one 8-GPU node fits it at PP 1"):
        build_cost(SimSpec(model="llama-3.1-405b", hardware="h100-sxm", tensor_parallel_size=8))
    _, blocks = build_cost(SimSpec(model="llama-3.1-405b", hardware="h100-sxm", tensor_parallel_size=8,
                                   pipeline_parallel_size=2))  # two nodes
    assert blocks > 0
    with pytest.raises(UserError, match=r"--tensor-parallel-size: 3 does not divide llama-3.1-70b's 64 attention "
                                         r"heads; allowed: 1, 2, 4, 8"):
        build_cost(SimSpec(model="llama-3.1-70b", hardware="h100-sxm", tensor_parallel_size=3))
    with pytest.raises(UserError, match="exceeds the 8 GPU"):
        build_cost(SimSpec(model="llama-3.1-70b", hardware="h100-sxm", tensor_parallel_size=16))
    with pytest.raises(UserError, match=r"1 GPU.*states no network"):
        build_cost(SimSpec(model="llama-3-8b", hardware="rtx-4090", pipeline_parallel_size=2))
    with pytest.raises(UserError, match="the calibrated cost model was measured on one device"):
        build_cost(SimSpec(model="llama-100m", hardware="cpu-local", tensor_parallel_size=2))


def test_mla_holds_many_times_the_tokens_of_gqa():
    hw = get_hardware("h200")
    v2 = kv_capacity_blocks(get_model("deepseek-v2-lite"), hw, 16)
    dense = kv_capacity_blocks(get_model("qwen2.5-7b"), hw, 16)  # 7.6B GQA, 57 KiB per token
    assert v2 > dense  # 15.7B of weights, but 31 KB of KV per token


def _config(tmp_path, **keys) -> str:
    base = {"hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4, "num_hidden_layers": 48,
            "intermediate_size": 6144, "vocab_size": 151936, "head_dim": 128, "max_position_embeddings": 40960}
    (tmp_path / "config.json").write_text(json.dumps({**base, **keys}))
    return str(tmp_path / "config.json")


def test_config_json_moe_mla_and_layer_kinds(tmp_path):
    moe = get_model(_config(tmp_path, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                            decoder_sparse_step=1, mlp_only_layers=[]))
    builtin = MODELS["qwen3-30b-a3b"]
    assert (moe.num_params, moe.active_layer_params, moe.kv_bytes_per_token()) == (
        builtin.num_params, builtin.active_layer_params, builtin.kv_bytes_per_token())
    mla = get_model(_config(tmp_path, num_attention_heads=16, num_key_value_heads=16, num_hidden_layers=27,
                            kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=128,
                            v_head_dim=128, n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6,
                            moe_intermediate_size=1408, first_k_dense_replace=1, intermediate_size=10944,
                            vocab_size=102400))
    assert (mla.layer_matmul_params, mla.kv_bytes_per_token()) == (15_286_927_360, 31_104)
    gemma = get_model(_config(tmp_path, text_config={"hidden_size": 64, "num_attention_heads": 4,
                                                     "num_hidden_layers": 12, "intermediate_size": 128,
                                                     "vocab_size": 512, "sliding_window": 1024,
                                                     "sliding_window_pattern": 6}, hidden_size=None))
    assert gemma.layer_types == tuple("full_attention" if i in (5, 11) else "sliding_attention" for i in range(12))
    assert gemma.sliding_window == 1024
    oss = get_model(_config(tmp_path, layer_types=["sliding_attention", "full_attention"] * 24, sliding_window=128,
                            quantization_config={"quant_method": "mxfp4"}, num_local_experts=32,
                            experts_per_token=4, intermediate_size=2880))
    assert oss.layer_types[:2] == ("sliding_attention", "full_attention") and oss.expert_dtype_bytes == 0.53125
    qwen = get_model(_config(tmp_path, sliding_window=4096, use_sliding_window=False))
    assert qwen.layer_types is None and qwen.sliding_window is None


@pytest.mark.parametrize(("keys", "message"), [
    ({"ssm_state_size": 16}, r"config.json: ssm_state_size: the model has state-space \(Mamba\) layers, which kvplan "
                             r"cannot price; allowed:"),
    ({"layer_types": ["linear_attention"] * 48}, r"layer_types: 'linear_attention' at index 0, which kvplan cannot "
                                                 r"price; allowed: full_attention, sliding_attention"),
    ({"num_experts": 8}, r"lacks 'num_experts_per_tok' beside num_experts"),
    ({"num_experts": 8, "num_experts_per_tok": 9}, r"num_experts_per_tok: 9 exceeds num_experts 8; allowed: 1 to 8"),
    ({"num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 2}, r"decoder_sparse_step: 2: dense layers "
                                                                            r"between MoE layers"),
    ({"kv_lora_rank": 512}, r"lacks 'qk_rope_head_dim' beside kv_lora_rank"),
    ({"quantization_config": {"quant_method": "bitsandbytes"}}, r"quantization_config.quant_method: 'bitsandbytes', "
                                                                r"whose bytes per weight kvplan does not know; "
                                                                r"allowed: fp8, awq, gptq, mxfp4"),
    ({"quantization_config": {"quant_method": "awq", "bits": 3}}, r"quantization_config.bits: 3, which vLLM's Marlin "
                                                                  r"kernels do not run; allowed: 4, 8"),
    ({"layer_types": ["sliding_attention"] * 48}, r"sliding_window: not given"),
    ({"num_experts": 8.5, "num_experts_per_tok": 2}, r"num_experts: must be an integer >= 1, got 8.5"),
])
def test_config_json_it_cannot_price_is_one_line_naming_the_key(tmp_path, keys, message):
    with pytest.raises(UserError, match=message) as info:
        get_model(_config(tmp_path, **keys))
    assert "\n" not in str(info.value)



@pytest.mark.parametrize("spec", [dict(model="qwen3-30b-a3b", tensor_parallel_size=2, enable_expert_parallel=True),
                                  dict(model="deepseek-v2-lite", pipeline_parallel_size=2),
                                  dict(model="llama-3.1-405b", tensor_parallel_size=8, pipeline_parallel_size=2)])
def test_a_shape_prices_a_stretch_as_its_steps_and_the_fast_path_agrees(spec):
    from kvplan.sim.cost.features import FEATURE_NAMES
    from kvplan.sim.run import simulate
    from kvplan.traces import Trace

    cost, _ = build_cost(SimSpec(hardware="h100-sxm", **spec))
    rng = np.random.default_rng(0)
    f = decode_stretch_features(rng.integers(10, 5000, 50), rng.integers(1, 40, 50), 40, 16)  # some steps empty
    steps = [StepFeatures(*(int(v[j]) if isinstance(v, np.ndarray) else v for v in
                            (getattr(f, n) for n in FEATURE_NAMES))) for j in range(40)]
    assert list(cost.step_times(f)) == [cost.step_times(s) for s in steps]  # bit-identical
    trace = Trace.build(np.arange(12) * 0.05, rng.integers(50, 900, 12), rng.integers(5, 60, 12))
    fast, slow = (simulate(trace, SimSpec(hardware="h100-sxm", num_blocks=400, fast_path=p, **spec)) for p in
                  (True, False))
    assert fast.requests.equals(slow.requests)
