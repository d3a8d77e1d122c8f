"""Perplexity through the engine's decode path (`engine.perplexity`, `kvplan eval-ppl`) against a pure-torch
reference: one HF forward over the whole text whose attention sees exactly the tokens a cache policy keeps
(all of them; the sinks and the recent window), with K/V quantized as the cache stores them, and the retained
tokens at their original positions - or, in `shifted` mode, at their positions within the cache: the reference
takes every key back to before RoPE and rotates it, and the query, to its index among the retained tokens. The
block count of a sink+window request never exceeds its bound."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AutoModelForCausalLM

from kvplan.cli import main
from kvplan.engine.perplexity import CachePolicy, parse_policy, perplexity
from kvplan.kernels.quant import dequantize, quantize_rows

REFERENCE = "kvplan_test_policy_reference"
QUANTIZED = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}


def _policy_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Dense attention over one whole sequence: query position q sees key k <= q that the policy retains
    (k < sinks or k > q - window), K/V quantized and dequantized per token per head when the cache is."""
    policy: CachePolicy = _policy_attention.policy
    if policy.kv_cache_dtype in QUANTIZED:
        dtype = QUANTIZED[policy.kv_cache_dtype]
        key = dequantize(*quantize_rows(key.transpose(1, 2), dtype)).transpose(1, 2)
        value = dequantize(*quantize_rows(value.transpose(1, 2), dtype)).transpose(1, 2)
    n = query.shape[2]
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    visible = k <= q
    if policy.window_tokens:
        visible &= (k < policy.sink_tokens) | (k > q - policy.window_tokens)
    if policy.position_mode == "shifted":
        return _cache_position_attention(query, key, value, visible, scaling), None
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=visible, scale=scaling,
                                         enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2), None


def _rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """RoPE (rotate-half layout) of x [..., n, d] at `positions` [n], from the model's inverse frequencies."""
    angles = positions.float()[:, None] * _policy_attention.inv_freq[None, :]
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def _cache_position_attention(query, key, value, visible, scaling):
    """Query by query: its retained keys, taken back to before RoPE (they arrive rotated at original positions)
    and rotated to their index among the retained tokens; the query to the last index."""
    n, group = query.shape[2], query.shape[1] // key.shape[1]
    positions = torch.arange(n)
    key = _rotate(key, -positions).repeat_interleave(group, dim=1)
    value = value.repeat_interleave(group, dim=1)
    query = _rotate(query, -positions)
    out = torch.empty_like(query)
    for t in range(n):
        kept = visible[t].nonzero().squeeze(1)
        index = torch.arange(len(kept))
        k_cache = _rotate(key[:, :, kept], index)
        q_cache = _rotate(query[:, :, t:t + 1], index[-1:])
        scores = (q_cache @ k_cache.transpose(-1, -2)) * scaling
        out[:, :, t] = (torch.softmax(scores, dim=-1) @ value[:, :, kept])[:, :, 0]
    return out.transpose(1, 2)


def reference_nll(model: str, tokens: list[int], policy: CachePolicy) -> float:
    AttentionInterface.register(REFERENCE, _policy_attention)
    _policy_attention.policy = policy
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, attn_implementation=REFERENCE).eval()
    _policy_attention.inv_freq = hf.model.rotary_emb.inv_freq.float()
    with torch.inference_mode():
        logits = hf(torch.tensor([tokens])).logits[0, :-1].float()
    logprobs = torch.log_softmax(logits, dim=-1)[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])]
    return float(-logprobs.double().mean())


TOKENS = np.random.default_rng(7).integers(1, 500, 90).tolist()


@pytest.mark.slow  # 11 cases, 47 s together
@pytest.mark.parametrize("arch,spec", [
    *(("tiny-llama", spec) for spec in ("dense", "window=24", "sinks=4,window=20", "sinks=3,window=17",
                                        "dense,kv=int8", "sinks=4,window=20,kv=fp8_e4m3")),
    *((arch, "sinks=4,window=20,positions=shifted") for arch in ("tiny-llama", "tiny-qwen2")),
    ("tiny-llama", "sinks=3,window=17,positions=shifted"), ("tiny-llama", "window=24,positions=shifted"),
    ("tiny-llama", "sinks=4,window=20,positions=shifted,kv=int8")])
def test_decode_path_perplexity_equals_the_dense_reference(tiny_models, arch, spec):
    model = tiny_models[arch]
    policy = parse_policy(spec)
    result = perplexity(model, TOKENS, policy, block_size=8, attention_backend="torch")
    assert result.tokens == len(TOKENS) - 1
    assert result.mean_nll == pytest.approx(reference_nll(model, TOKENS, policy), rel=1e-5, abs=1e-6)
    assert result.perplexity == pytest.approx(math.exp(result.mean_nll))
    assert result.peak_blocks <= result.block_bound  # the bounded cache held at most sink + window blocks + 1
    if policy.window_tokens:
        assert result.block_bound < -(-len(TOKENS) // 8)  # and that is less than the whole text


@pytest.mark.parametrize("spec", ["sinks=4,window=20", "sinks=4,window=20,positions=shifted"])
def test_the_cpu_backend_scores_as_the_torch_backend(tiny_models, spec):
    model, policy = tiny_models["tiny-llama"], parse_policy(spec)
    torch_nll = perplexity(model, TOKENS, policy, block_size=8, attention_backend="torch").mean_nll
    assert perplexity(model, TOKENS, policy, block_size=8).mean_nll == pytest.approx(torch_nll, rel=1e-5)


def test_shifted_positions_change_what_the_sinks_contribute(tiny_models):
    """Not a no-op: with sinks, the two position modes score differently (both matching their references, above);
    without sinks the cache-position differences are the original ones, so window-only scores the same."""
    model = tiny_models["tiny-llama"]

    def nll(spec: str) -> float:
        return perplexity(model, TOKENS, parse_policy(spec), block_size=8, attention_backend="torch").mean_nll

    assert abs(nll("sinks=4,window=20") - nll("sinks=4,window=20,positions=shifted")) > 1e-3
    assert nll("window=24") == pytest.approx(nll("window=24,positions=shifted"), rel=1e-5)


def test_shifted_positions_need_rope_a_window_and_a_backend_that_rotates(tiny_models):
    from kvplan.engine.llm import LLM

    with pytest.raises(ValueError, match="no rotary embedding"):
        LLM(tiny_models["tiny-gpt2"], dtype="float32", sink_tokens=4, window_tokens=20, position_mode="shifted")
    with pytest.raises(ValueError, match="window_tokens > 0"):
        LLM(tiny_models["tiny-llama"], dtype="float32", position_mode="shifted")
    with pytest.raises(ValueError, match="torch and cpu attention backends"):
        LLM(tiny_models["tiny-llama"], dtype="float32", sink_tokens=4, window_tokens=20, position_mode="shifted",
            attention_backend="triton")
    with pytest.raises(ValueError, match="allowed: original, shifted"):
        LLM(tiny_models["tiny-llama"], dtype="float32", sink_tokens=4, window_tokens=20, position_mode="absolute")


@pytest.mark.parametrize("bad,message", [
    ("window", "allowed: dense, window=W"), ("sinks=4", "sinks need a window"), ("window=0", "window=0"),
    ("dense,kv=fp4", "kv=fp4"), ("window=8,window=9", "'window=9'"), ("heads=2", "'heads=2'"),
    ("dense,positions=shifted", "needs a window"), ("window=8,positions=rotated", "positions=rotated"),
])
def test_bad_policies_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        parse_policy(bad)


@pytest.mark.slow
def test_eval_ppl_cli_on_the_real_small_model(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 12)
    assert main(["eval-ppl", "--model", "smollm2-135m", "--text", str(text), "--tokens", "100", "--policy", "dense",
                 "--policy", "sinks=4,window=28", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    dense, streaming = doc["policies"]
    assert dense["tokens"] == streaming["tokens"] == 99
    assert dense["perplexity"] < 10  # a repeated sentence is easy to predict
    assert streaming["peak_blocks"] <= streaming["block_bound"] < dense["peak_blocks"]
    text.write_bytes(b"\xff\xfe bad")
    assert main(["eval-ppl", "--model", "smollm2-135m", "--text", str(text)]) == 2
    assert "not UTF-8" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["original", "shifted"])
def test_a_long_sink_window_generation_never_holds_more_than_its_bound(tiny_models, mode):
    """400 generated tokens (sampled, not teacher-forced) over a 4 + 20 token cache of 8-token blocks: after every
    step the request holds at most the sink blocks, the window's blocks and the one being filled."""
    from kvplan.engine.llm import LLM
    from kvplan.engine.sampling import SamplingParams

    llm = LLM(tiny_models["tiny-llama"], dtype="float32", block_size=8, kv_cache_memory=4 << 20, sink_tokens=4,
              window_tokens=20, position_mode=mode, attention_backend="torch")
    rid = llm.add_request(TOKENS[:30], SamplingParams(temperature=1.0, seed=1, max_tokens=400, ignore_eos=True))
    bound, peak, done = llm.scheduler.cache_config.blocks_per_request(10**9), 0, []
    while not done:
        done = llm.step()
        table = llm.scheduler.kv.block_ids.get(rid, ())
        peak = max(peak, sum(1 for block in table if block >= 0))
        assert peak <= bound
    assert len(done[0].outputs[0].token_ids) == 400 and bound < (30 + 400) // 8
