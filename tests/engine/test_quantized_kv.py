"""Quantized KV caches in the engine (`kv_cache_dtype` fp8_e4m3, int8): capacity for a byte budget, exact
agreement with a dense reference that quantizes K/V the same way, a bound on the logit error against the
unquantized cache, and scales that travel with their blocks through swaps and copy-on-write."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AutoModelForCausalLM

from kvplan.engine.kv_cache import QUANTIZED_DTYPES, SCALE_BYTES
from kvplan.engine.llm import LLM
from kvplan.engine.sampling import SamplingParams
from kvplan.kernels.checks import QUANT_DTYPES
from kvplan.kernels.quant import dequantize, quantize_rows

PROMPTS = [list(range(3, 40)), list(range(50, 70)), [7] * 30]
QUANTIZED = {"fp8_e4m3": torch.float8_e4m3fn, "int8": torch.int8}
REFERENCE = "kvplan_test_quantized_kv"


def engine(model: str, kv: str, backend: str = "torch", **kw) -> LLM:
    options = dict(dtype="float32", block_size=8, kv_cache_memory=4 << 20, attention_backend=backend)
    return LLM(model, kv_cache_dtype=kv, **{**options, **kw})


def greedy(llm: LLM, prompts=PROMPTS, n: int = 1, max_tokens: int = 12) -> list[list[list[int]]]:
    params = SamplingParams(n=n, temperature=0 if n == 1 else 0.8, seed=5, max_tokens=max_tokens, ignore_eos=True)
    return [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params)]


def test_the_engine_names_the_kernels_quantized_dtypes():
    assert QUANTIZED_DTYPES == QUANT_DTYPES


@pytest.mark.parametrize("kv", list(QUANTIZED))
def test_a_quantized_cache_holds_about_twice_the_blocks_of_a_16_bit_one(tiny_models, kv):
    model = tiny_models["tiny-llama"]
    half = LLM(model, dtype="bfloat16", kv_cache_memory=4 << 20, block_size=16)
    quantized = LLM(model, dtype="bfloat16", kv_cache_dtype=kv, kv_cache_memory=4 << 20, block_size=16)
    layout = quantized.kv_cache.layout
    per_block = 2 * layout.num_layers * 16 * layout.num_kv_heads * (layout.head_dim + SCALE_BYTES)
    assert layout.bytes_per_block == per_block and quantized.num_kv_blocks == (4 << 20) // per_block
    ratio = quantized.num_kv_blocks / half.num_kv_blocks
    assert ratio == pytest.approx(2 * layout.head_dim / (layout.head_dim + SCALE_BYTES), rel=0.01)
    assert quantized.profile_meta["kv_dtype"] == str(QUANTIZED[kv]).removeprefix("torch.")


def _reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Dense causal attention over K/V quantized and dequantized per token per head, as the paged cache
    stores them (query [1, H, T, D], key/value [1, Hkv, S, D])."""
    dtype = _reference_attention.dtype
    k = dequantize(*quantize_rows(key.transpose(1, 2), dtype)).transpose(1, 2)
    v = dequantize(*quantize_rows(value.transpose(1, 2), dtype)).transpose(1, 2)
    out = F.scaled_dot_product_attention(query, k, v, is_causal=query.shape[2] > 1, scale=scaling,
                                         enable_gqa=query.shape[1] != k.shape[1])
    return out.transpose(1, 2), None


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("kv", list(QUANTIZED))
def test_quantized_greedy_tokens_equal_a_dense_reference_with_the_same_quantization(tiny_models, kv, backend):
    model = tiny_models["tiny-llama"]
    AttentionInterface.register(REFERENCE, _reference_attention)
    _reference_attention.dtype = QUANTIZED[kv]
    reference = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, attn_implementation=REFERENCE)
    expected = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            out = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                                     min_new_tokens=12, pad_token_id=0)
            expected.append([out[0, len(prompt):].tolist()])
    assert greedy(engine(model, kv, backend)) == expected


@pytest.mark.parametrize("kv,bound", [("int8", 0.05), ("fp8_e4m3", 0.15)])
def test_the_logit_error_of_a_quantized_cache_is_bounded(tiny_models, kv, bound):
    """First step (the prompts' prefill, read back from the cache): |Δ logit| <= bound × max |logit|."""

    def first_logits(llm: LLM) -> torch.Tensor:
        seen = []
        sample = llm._sample

        def record(out, items, logits, sampled):
            seen.append(logits.float().clone())
            return sample(out, items, logits, sampled)

        llm._sample = record
        llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
        return seen[0]

    model = tiny_models["tiny-llama"]
    exact, quantized = first_logits(engine(model, "auto")), first_logits(engine(model, kv))
    error = (quantized - exact).abs().max().item()
    assert 0 < error <= bound * exact.abs().max().item()


@pytest.mark.parametrize("kv", list(QUANTIZED))
def test_scales_travel_with_their_blocks_through_swaps_and_copy_on_write(tiny_models, kv):
    """A pool so small that parallel samples preempt by swapping gives the tokens of a pool that never does:
    a swapped or copied block must bring its scales (a stale scale would change the dequantized keys)."""
    model = tiny_models["tiny-llama"]
    prompts = [list(range(3, 27)), list(range(40, 60))]
    roomy = greedy(engine(model, kv), prompts, n=2, max_tokens=16)
    tight = engine(model, kv, num_gpu_blocks_override=12, preemption_mode="swap", max_model_len=64,
                   swap_space=1 << 20)
    assert greedy(tight, prompts, n=2, max_tokens=16) == roomy
    assert tight.scheduler.stats.num_swap_outs > 0


@pytest.mark.parametrize("kv,sim_kv", [("int8", "int8"), ("fp8_e4m3", "float8")])
def test_the_simulators_capacity_for_a_quantized_cache_agrees_with_the_engines(tiny_models, tmp_path, kv, sim_kv):
    """A profile measured with a bf16 cache, simulated with a quantized one: the same bytes, re-cut into the
    engine's quantized rows (1-byte values plus a float32 scale per token per head)."""
    from kvplan.sim.cost.calibrated import CalibratedCost, save_profile
    from kvplan.sim.run import build_cost
    from kvplan.sim.spec import SimSpec

    model = tiny_models["tiny-llama"]
    measured = LLM(model, dtype="bfloat16", kv_cache_memory=4 << 20, block_size=16).num_kv_blocks
    quantized = LLM(model, dtype="bfloat16", kv_cache_dtype=kv, kv_cache_memory=4 << 20, block_size=16)
    profile = tmp_path / "p.yaml"
    save_profile(CalibratedCost({"step": 0.01}, kv_capacity_blocks=measured,
                                meta={"model": "tiny", "device": "cpu-local", "dtype": "bfloat16", "block_size": 16}),
                 profile)
    spec = SimSpec(model=model, cost="calibrated", profile=str(profile), block_size=16, kv_cache_dtype=kv)
    assert abs(build_cost(spec)[1] - quantized.num_kv_blocks) <= 1  # both floor the same bytes once
    assert build_cost(SimSpec(model=model, cost="calibrated", profile=str(profile), block_size=16))[1] == measured
