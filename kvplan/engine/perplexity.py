"""Perplexity of a text under a KV-cache policy, measured through the engine's decode path.

The text's tokens are fed one per step as a teacher-forced continuation of its first token
(`LLM.add_request(..., teacher_token_ids=...)`), so every prediction is made by a decode step reading the
bounded cache exactly as serving would: a sink+window cache has dropped what left the window, a quantized
cache returns dequantized keys. PPL = exp(mean −log p(token_i | tokens_<i)) over the N − 1 predictions.

A policy is written `dense`, `window=W`, `sinks=S,window=W`, each optionally with `,kv=DTYPE` (a
kv_cache_dtype: fp8_e4m3, int8, ...) and, with a window, `,positions=shifted` (StreamingLLM's positions within
the cache; default `original`): e.g. `sinks=4,window=252,positions=shifted,kv=int8`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvplan.engine.llm import KV_TORCH_DTYPES, LLM
from kvplan.engine.rope import POSITION_MODES
from kvplan.errors import UserError

POLICY_KEYS = ("sinks", "window", "kv", "positions")
SYNTAX = "dense, window=W, sinks=S,window=W, each optionally with ,kv=DTYPE and (with a window) ,positions=MODE"


@dataclass(slots=True)
class CachePolicy:
    name: str
    sink_tokens: int = 0
    window_tokens: int = 0
    kv_cache_dtype: str = "auto"
    position_mode: str = "original"


@dataclass(slots=True)
class PerplexityResult:
    policy: CachePolicy
    tokens: int  # predictions scored (the text's tokens − 1)
    mean_nll: float
    perplexity: float
    peak_blocks: int  # most KV blocks the sequence held in any step
    block_bound: int  # what the cache policy allows it (sink + window blocks + the one being filled)


def parse_policy(text: str) -> CachePolicy:
    """'dense' | 'window=W' | 'sinks=S,window=W', each with an optional ',kv=DTYPE' and ',positions=MODE'."""
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, eq, value = part.strip().partition("=")
        if part.strip() == "dense" and not fields:
            continue
        if not eq or key not in POLICY_KEYS or key in fields or not value:
            raise UserError(f"--policy: {text!r}: {part.strip()!r}; allowed: {SYNTAX}")
        fields[key] = value
    kv = fields.pop("kv", "auto")
    positions = fields.pop("positions", "original")
    if positions not in POSITION_MODES:
        raise UserError(f"--policy: {text!r}: positions={positions}; allowed: {', '.join(POSITION_MODES)}")
    if kv != "auto" and kv not in KV_TORCH_DTYPES:
        raise UserError(f"--policy: {text!r}: kv={kv}; allowed: auto, {', '.join(KV_TORCH_DTYPES)}")
    sizes = {}
    for key, value in fields.items():
        if not value.isdigit() or int(value) < (0 if key == "sinks" else 1):
            raise UserError(f"--policy: {text!r}: {key}={value}; allowed: a whole number of tokens "
                             f"({'>= 0' if key == 'sinks' else '>= 1'})")
        sizes[key] = int(value)
    if "sinks" in sizes and "window" not in sizes:
        raise UserError(f"--policy: {text!r}: sinks need a window (sinks=S,window=W)")
    if positions != "original" and "window" not in sizes:
        raise UserError(f"--policy: {text!r}: positions={positions} needs a window (positions are assigned "
                         "within a sink+window cache)")
    return CachePolicy(text, sizes.get("sinks", 0), sizes.get("window", 0), kv, positions)


def perplexity(model: str, tokens: list[int], policy: CachePolicy, *, dtype: str = "float32", block_size: int = 16,
               attention_backend: str | None = None) -> PerplexityResult:
    """Score `tokens` (at least 2) on a fresh engine configured with `policy`."""
    if len(tokens) < 2:
        raise UserError(f"perplexity: {len(tokens)} token(s); allowed: at least 2")
    llm = LLM(model, dtype=dtype, block_size=block_size, kv_cache_dtype=policy.kv_cache_dtype,
              sink_tokens=policy.sink_tokens, window_tokens=policy.window_tokens, position_mode=policy.position_mode,
              max_model_len=len(tokens) + 1,
              num_blocks=-(-len(tokens) // block_size) + 2, max_num_batched_tokens=64,
              attention_backend=attention_backend)
    rid = llm.add_request(tokens[:1], teacher_token_ids=tokens[1:])
    kv, peak, result = llm.scheduler.kv, 0, None
    while result is None:
        for output in llm.step():
            result = output
        table = kv.block_ids.get(rid, ())
        peak = max(peak, sum(1 for block in table if block >= 0))
    logprobs = result.teacher_logprobs
    mean_nll = -math.fsum(logprobs) / len(logprobs)
    bound = llm.scheduler.cache_config.blocks_per_request(len(tokens))
    return PerplexityResult(policy, len(logprobs), mean_nll, math.exp(mean_nll), peak, bound)
