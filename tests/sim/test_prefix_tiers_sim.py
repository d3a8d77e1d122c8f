"""The simulator with prefix tiers below the GPU: the core's tiers raise the hit rate when the GPU cannot hold the
working set, the summary counts them per tier, and the promotions' copies are priced over their links."""

from __future__ import annotations

import numpy as np

from kvplan.sim.run import SimSpec, simulate
from kvplan.traces import Trace

GROUPS, BLOCKS = 8, 4  # 8 distinct 4-block prompts, cycled: 32 blocks of prefix, more than the GPU holds


def cycling_trace(rounds: int = 4) -> Trace:
    n = GROUPS * rounds
    hashes = [list(range((i % GROUPS) * BLOCKS, (i % GROUPS + 1) * BLOCKS)) for i in range(n)]
    return Trace.build(np.arange(n, dtype=float), [BLOCKS * 16] * n, [4] * n,
                       hash_ids=np.concatenate(hashes), hash_offsets=np.arange(0, n * BLOCKS + 1, BLOCKS),
                       hash_granularity=16)


def run(**tiers):
    return simulate(cycling_trace(), SimSpec(num_blocks=12, block_size=16, max_model_len=128, **tiers)).summary


def test_a_cpu_tier_serves_what_the_gpu_evicted_and_is_counted():
    plain, tiered = run(), run(kv_offloading_blocks=40)
    assert plain["prefix_cache_hit_rate"] == 0.0  # LRU over a cycle longer than the cache: every block is gone
    assert plain["kv_offload_cpu_hits"] is None
    # rounds 2..4 find every prompt's blocks but the last (never cached: its last token is computed) on the CPU
    assert tiered["kv_offload_cpu_hits"] == tiered["kv_offload_cpu_promotions"] == 3 * GROUPS * (BLOCKS - 1)
    assert tiered["prefix_cache_hit_rate"] > 0.5 and tiered["kv_offload_disk_hits"] is None


def test_a_disk_tier_catches_what_a_small_cpu_tier_drops_and_costs_more_per_block():
    cpu_only = run(kv_offloading_blocks=4)
    both = run(kv_offloading_blocks=4, kv_disk_blocks=40)
    assert cpu_only["kv_offload_cpu_dropped"] > 0 and both["kv_offload_cpu_dropped"] == 0
    assert both["kv_offload_disk_hits"] > 0
    assert both["prefix_cache_hit_rate"] > cpu_only["prefix_cache_hit_rate"]
    all_cpu = run(kv_offloading_blocks=40)
    # the same hits; the disk's come over the slower drive, so the first tokens come later
    assert both["prefix_cache_hits"] == all_cpu["prefix_cache_hits"]
    assert both["mean_ttft_ms"] > all_cpu["mean_ttft_ms"]
