"""Greedy tokens from the engine equal HF `generate`, whatever the batch, block size, chunking, prefix caching or
preemption."""

from __future__ import annotations

import pytest
import torch

from kvplan.engine.llm import LLM
from kvplan.engine.sampling import SamplingParams
from tests.engine.conftest import ARCHS

MAX_NEW = 12


def mixed_prompts(vocab: int = 256) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    base = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (5, 17, 33, 48)]
    shared = base[3][:32]  # prompts sharing a 32-token prefix with prompt 3, and with each other
    return [*base, [*shared, 7, 8, 9], [*shared, *base[0]], [3]]


# (block size, token budget, max seqs, prefix caching, KV blocks or None, preemption mode)
CASES = {
    "b1": (1, 2048, 2, True, None, "recompute"),
    "b8_chunks_split_prompts": (8, 16, 3, True, None, "recompute"),
    "b16_no_prefix_cache": (16, 2048, 8, False, None, "recompute"),
    "b32_tiny_chunks": (32, 7, 2, True, None, "recompute"),
    "b8_preempt_recompute": (8, 64, 8, True, 12, "recompute"),
    "b8_preempt_swap": (8, 64, 8, True, 12, "swap"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_equal_hf_generate(arch, case, tiny_models, hf_greedy):
    block_size, budget, max_seqs, caching, blocks, mode = CASES[case]
    path = tiny_models[arch]
    kv_memory = 4 << 20 if blocks is None else blocks * _bytes_per_block(path, block_size)
    llm = LLM(path, block_size=block_size, kv_cache_memory=kv_memory, max_num_batched_tokens=budget,
              max_num_seqs=max_seqs, enable_prefix_caching=caching, preemption_mode=mode, max_model_len=96)
    prompts = mixed_prompts()
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True))
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.outputs[0].token_ids == hf_greedy(path, prompt, MAX_NEW), f"{arch} {case} prompt {prompt[:4]}"
    stats, kv = llm.scheduler.stats, llm.scheduler.kv
    if blocks is not None:
        assert stats.num_preemptions > 0, "the small KV budget did not force a preemption"
        assert (stats.num_swap_outs > 0) == (mode == "swap")
    if caching and max_seqs <= 3:
        assert kv.prefix_hits > 0, "shared prefixes were not served from the cache"
    assert kv.pool.num_used == 0


def _bytes_per_block(path: str, block_size: int) -> int:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    layers = config.num_hidden_layers
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = config.hidden_size // config.num_attention_heads
    return 2 * layers * block_size * heads * head_dim * 4


@pytest.mark.parametrize("schedule", ["mixed", "prefill_first"])
def test_chunking_off_with_a_pool_a_few_requests_wide_finishes(schedule, tiny_models, hf_greedy):
    """A request preempted after generating tokens has prompt + generated > the token budget: with chunking off
    it used to block the waiting queue forever. Now its recompute is chunked and every request finishes with
    HF's greedy tokens."""
    path = tiny_models["tiny-llama"]
    llm = LLM(path, block_size=16, kv_cache_memory=8 * _bytes_per_block(path, 16), max_num_batched_tokens=64,
              enable_chunked_prefill=False, enable_prefix_caching=False, max_model_len=128, schedule=schedule)
    g = torch.Generator().manual_seed(3)
    shapes = [(48, 60), (60, 40), (8, 4)]
    prompts = [torch.randint(0, 256, (length,), generator=g).tolist() for length, _ in shapes]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for _, m in shapes]
    outputs = llm.generate(prompts, params)
    assert llm.scheduler.stats.num_preemptions > 0, "the small pool did not force a preemption"
    for prompt, (_, max_tokens), output in zip(prompts, shapes, outputs, strict=True):
        assert output.outputs[0].token_ids == hf_greedy(path, prompt, max_tokens)
    assert llm.scheduler.kv.pool.num_used == 0
