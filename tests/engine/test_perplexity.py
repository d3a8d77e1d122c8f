"""Perplexity through the engine's decode path (`engine.perplexity`, `kvplan eval-ppl`) against a pure-torch
reference: one HF forward over the whole text whose attention sees exactly the tokens a cache policy keeps
(all of them; the sinks and the recent window, at their original positions), with K/V quantized as the cache
stores them. The block count of a sink+window request never exceeds its bound."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AutoModelForCausalLM

from engine.perplexity import CachePolicy, parse_policy, perplexity
from kernels.quant import dequantize, quantize_rows
from kvplan.cli import main

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
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=visible, scale=scaling,
                                         enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2), None


def reference_nll(model: str, tokens: list[int], policy: CachePolicy) -> float:
    AttentionInterface.register(REFERENCE, _policy_attention)
    _policy_attention.policy = policy
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, attn_implementation=REFERENCE).eval()
    with torch.inference_mode():
        logits = hf(torch.tensor([tokens])).logits[0, :-1].float()
    logprobs = torch.log_softmax(logits, dim=-1)[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])]
    return float(-logprobs.double().mean())


TOKENS = np.random.default_rng(7).integers(1, 500, 90).tolist()


@pytest.mark.parametrize("spec", ["dense", "window=24", "sinks=4,window=20", "sinks=3,window=17", "dense,kv=int8",
                                  "sinks=4,window=20,kv=fp8_e4m3"])
def test_decode_path_perplexity_equals_the_dense_reference(tiny_models, spec):
    model = tiny_models["tiny-llama"]
    policy = parse_policy(spec)
    result = perplexity(model, TOKENS, policy, block_size=8, attention_backend="torch")
    assert result.tokens == len(TOKENS) - 1
    assert result.mean_nll == pytest.approx(reference_nll(model, TOKENS, policy), rel=1e-5, abs=1e-6)
    assert result.perplexity == pytest.approx(math.exp(result.mean_nll))
    assert result.peak_blocks <= result.block_bound  # the bounded cache held at most sink + window blocks + 1
    if policy.window_tokens:
        assert result.block_bound < -(-len(TOKENS) // 8)  # and that is less than the whole text


def test_the_cpu_backend_scores_as_the_torch_backend(tiny_models):
    model, policy = tiny_models["tiny-llama"], parse_policy("sinks=4,window=20")
    torch_nll = perplexity(model, TOKENS, policy, block_size=8, attention_backend="torch").mean_nll
    assert perplexity(model, TOKENS, policy, block_size=8).mean_nll == pytest.approx(torch_nll, rel=1e-5)


@pytest.mark.parametrize("bad,message", [
    ("window", "allowed: dense, window=W"), ("sinks=4", "sinks need a window"), ("window=0", "window=0"),
    ("dense,kv=fp4", "kv=fp4"), ("window=8,window=9", "'window=9'"), ("heads=2", "'heads=2'"),
])
def test_bad_policies_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        parse_policy(bad)


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
