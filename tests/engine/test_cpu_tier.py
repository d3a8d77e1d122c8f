"""The CPU prefix tier on the live engine holds real KV: a system prompt pushed out of a small GPU cache into the
tier and hit again is copied back and read, and greedy decoding gives exactly HF `generate`'s tokens; a runner that
skips the copy-in reads another prompt's KV and does not. `kv_offloading_size` (GiB, vLLM's) sizes the same tier."""

from __future__ import annotations

import pytest
import torch

from kvplan.engine.core.prefix_tiers import GIB
from kvplan.engine.kv_cache import PagedKVCache
from kvplan.engine.llm import LLM
from kvplan.engine.sampling import SamplingParams
from kvplan.errors import ConfigError
from tests.engine.conftest import ARCHS

MAX_NEW = 6
BLOCK = 8


def waves(vocab: int = 256) -> list[list[list[int]]]:
    """Three waves of three requests: system prompt A (4 blocks), then B, then A again, each with its own
    question. 12 GPU blocks hold one wave (4 shared + 2 private blocks per request), so B's wave evicts A's
    cached blocks: into the CPU tier, from which the last wave's prefix hits are copied back."""
    g = torch.Generator().manual_seed(7)
    a, b = (torch.randint(0, vocab, (4 * BLOCK,), generator=g).tolist() for _ in range(2))

    def wave(system: list[int]) -> list[list[int]]:
        return [[*system, *torch.randint(0, vocab, (5,), generator=g).tolist()] for _ in range(3)]

    return [wave(a), wave(b), wave(a)]


def run_waves(llm: LLM) -> tuple[list[list[int]], list[int]]:
    """The greedy tokens of every request, and the prompt tokens each one found cached."""
    tokens, cached = [], []
    for prompts in waves():
        for out in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)):
            tokens.append(out.outputs[0].token_ids)
            cached.append(out.metrics.num_cached_tokens)
    return tokens, cached


def tiered(path: str, **settings) -> LLM:
    settings.setdefault("kv_offloading_blocks", 64)
    return LLM(path, dtype="float32", block_size=BLOCK, num_blocks=12, max_num_seqs=3, max_model_len=96,
               **settings)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_prefix_hits_promoted_from_the_cpu_tier_decode_exactly_hf_generate(arch, tiny_models, hf_greedy):
    path = tiny_models[arch]
    llm = tiered(path)
    tokens, cached = run_waves(llm)
    prompts = [p for wave in waves() for p in wave]
    assert tokens == [hf_greedy(path, p, MAX_NEW) for p in prompts]
    m = llm.scheduler.kv_metrics()
    assert m["kv_offload_cpu_demotions"] > 0 and m["kv_offload_cpu_promotions"] > 0, m
    assert m["kv_offload_cpu_hits"] == m["kv_offload_cpu_promotions"]
    assert min(cached[6:]) >= 4 * BLOCK - BLOCK  # the last wave read A's promoted blocks (the first, at least 3)
    assert llm.scheduler.kv.pool.num_used == 0


def test_a_runner_that_skips_the_copy_in_decodes_other_tokens(tiny_models, hf_greedy, monkeypatch):
    """The test above can fail: with promotions left out (demotions still copied), the promoted GPU blocks hold
    whatever they held before - B's KV - and the last wave's tokens differ from HF's."""
    path = tiny_models["tiny-llama"]
    real = PagedKVCache.tier_transfers

    def without_promotions(self, transfers):
        real(self, [t for t in transfers if t.dst_tier != "gpu"])

    monkeypatch.setattr(PagedKVCache, "tier_transfers", without_promotions)
    llm = tiered(path)
    tokens, _ = run_waves(llm)
    prompts = [p for wave in waves() for p in wave]
    assert tokens[:6] == [hf_greedy(path, p, MAX_NEW) for p in prompts[:6]]
    assert llm.scheduler.kv_metrics()["kv_offload_cpu_promotions"] > 0
    assert tokens[6:] != [hf_greedy(path, p, MAX_NEW) for p in prompts[6:]]


def test_a_quantized_cache_moves_its_scales_with_the_blocks(tiny_models):
    """int8 KV (values plus per-token scales): the tier's copies give the tokens of the same engine without a
    tier, which recomputes the evicted prefix instead."""
    path = tiny_models["tiny-llama"]
    with_tier, tier_cached = run_waves(tiered(path, kv_cache_dtype="int8"))
    without, cached = run_waves(tiered(path, kv_cache_dtype="int8", kv_offloading_blocks=0))
    assert with_tier == without
    assert tier_cached[6] > cached[6]  # the last wave's first request read promoted blocks the other recomputed


def test_kv_offloading_size_is_the_tier_in_gib_of_the_models_kv_blocks(tiny_models):
    path = tiny_models["tiny-llama"]
    llm = tiered(path, kv_offloading_blocks=0, kv_offloading_size=0.001)
    per_block = llm.kv_cache.layout.bytes_per_block
    blocks = int(0.001 * GIB) // per_block
    assert llm.scheduler.cache_config.kv_offloading_blocks == blocks == llm.profile_meta["kv_offloading_blocks"]
    assert len(llm.kv_cache.tier_layers[0].key) == blocks
    assert tiered(path, kv_offloading_blocks=blocks, kv_offloading_size=0.001).scheduler.kv.tiers[0].pool.num_blocks \
        == blocks
    with pytest.raises(ConfigError, match=rf"kv_offloading_size: 0.001 GiB holds {blocks} blocks of {per_block} "
                                          r"bytes but kv_offloading_blocks is 7; allowed: one of the two"):
        tiered(path, kv_offloading_blocks=7, kv_offloading_size=0.001)
    with pytest.raises(ConfigError, match=r"kv_offloading_size: 1e-09 GiB holds no KV block"):
        tiered(path, kv_offloading_size=1e-9)


def test_the_live_engine_refuses_the_disk_tier(tiny_models):
    with pytest.raises(ConfigError, match=r"kv_disk_blocks: 4: the disk prefix tier is simulator-only .*; allowed "
                                          r"on the live engine: 0"):
        tiered(tiny_models["tiny-llama"], kv_disk_blocks=4)
