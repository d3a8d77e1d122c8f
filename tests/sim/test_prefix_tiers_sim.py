"""The simulator with prefix tiers below the GPU: the core's tiers raise the hit rate when the GPU cannot hold the
working set, the summary counts them per tier, and the promotions' copies are priced over their links."""

from __future__ import annotations

import numpy as np
import pytest

from kvplan.sim.run import simulate
from kvplan.sim.spec import SimSpec
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


def run_cluster(replicas: int = 3, **tiers):
    return simulate(cycling_trace(), SimSpec(num_blocks=12, block_size=16, max_model_len=128, replicas=replicas,
                                             **tiers)).summary


def test_a_shared_store_serves_a_prefix_one_replica_computed_to_another():
    """Round robin over 3 replicas cycles each of the 8 prompts over all three: a prompt's next visit is on
    another replica (each GPU holds 3 prompts), which can find its blocks only in the shared store."""
    plain = run_cluster()
    back, through = run_cluster(kv_shared_blocks=40), run_cluster(kv_shared_blocks=40, kv_offloading_write_through=True)
    assert plain["prefix_cache_hit_rate"] == 0.0 and plain["kv_offload_shared_hits"] is None
    assert back["kv_offload_cpu_hits"] is None and back["kv_offload_shared_demotions"] == GROUPS * BLOCKS
    # write-through publishes every block as it is computed: rounds 2..4 find every prompt's blocks but the last
    # (its last token is computed); write-back publishes a block only once its GPU evicts it, so a visit that
    # comes while the blocks are still on the other replica's GPU misses
    assert through["kv_offload_shared_hits"] == through["kv_offload_shared_promotions"] == 3 * GROUPS * (BLOCKS - 1)
    assert 0 < back["kv_offload_shared_hits"] < through["kv_offload_shared_hits"]
    # the bytes its link moved: every block fetched and every block published, at llama-3-8b's 128 KiB a token
    moved = back["kv_offload_shared_promotions"] + back["kv_offload_shared_demotions"]
    assert back["kv_offload_shared_bytes"] == moved * 16 * 128 * 1024


def test_per_replica_cpu_tiers_of_the_same_total_hold_less_than_one_shared_store():
    local = run_cluster(kv_offloading_blocks=14)  # 3 x 14 = 42 blocks, each replica's own: never revisited there
    shared = run_cluster(kv_shared_blocks=42)
    assert local["prefix_cache_hit_rate"] == 0.0 < shared["prefix_cache_hit_rate"]
    assert local["kv_offload_cpu_bytes"] > 0 and local["kv_offload_shared_bytes"] is None


def test_write_through_stores_every_computed_block_at_once():
    back = run(kv_offloading_blocks=40)
    through = run(kv_offloading_blocks=40, kv_offloading_write_through=True)
    # write-back stores what the GPU evicts; write-through every full block once, as it is computed - the same
    # blocks are then found below
    assert through["kv_offload_cpu_demotions"] == GROUPS * BLOCKS
    assert through["kv_offload_cpu_hits"] == back["kv_offload_cpu_hits"]


def test_layer_wise_loading_overlaps_promotions_with_the_prefill():
    serial = run(kv_offloading_blocks=4, kv_disk_blocks=40)
    layered = run(kv_offloading_blocks=4, kv_disk_blocks=40, kv_offloading_layerwise=True)
    assert layered["prefix_cache_hits"] == serial["prefix_cache_hits"]
    assert layered["mean_ttft_ms"] < serial["mean_ttft_ms"]


def test_fetches_on_one_node_queue_on_its_network_link():
    from kvplan.sim.links import Link

    link = Link(seconds_per_block=0.001, latency_s=0.0001)
    assert link.fetch(1.0, 10) == pytest.approx(0.0101)
    assert link.fetch(1.0, 10) == pytest.approx(0.0202)  # asked for at once: waits for the first to cross
    assert link.fetch(5.0, 1) == pytest.approx(0.0011) and link.blocks == 21


def test_a_store_into_the_shared_store_holds_the_node_link_and_a_fetch_waits_behind_it():
    from kvplan.engine.core.prefix_tiers import PrefixTier
    from kvplan.sim.links import Link
    from kvplan.sim.shared_store import SharedView, StoreQueue

    link, clock = Link(seconds_per_block=0.001, latency_s=0.0001), [2.0]
    queue = StoreQueue()
    view = SharedView(PrefixTier("shared", 2, 16), queue, lambda: clock[0], link)
    view.store(7)
    view.store(8)
    view.store(7)  # a key the store has: refreshed, nothing crosses
    assert link.busy_until == pytest.approx(2.002) and link.blocks == 2
    assert link.fetch(2.0, 1) == pytest.approx(0.0031)  # asked for at once: queued behind the two stores
    # a fast-path stretch's store holds the link from its step's start, applied when the store is next read
    view.begin_stretch([])
    view.store(9)  # evicts a key (dropped: the store is the last tier) and takes its slot
    view.end_stretch([5.0])
    clock[0] = 6.0
    assert 9 in view and link.busy_until == pytest.approx(5.001) and link.blocks == 4


def test_a_cpu_tier_sized_in_gib_is_the_blocks_that_many_bytes_hold():
    from kvplan.errors import ConfigError

    # Llama-3-8B in bfloat16: 32 layers x 8 KV heads x 128 x (K, V) x 2 bytes = 128 KiB a token, 2 MiB a 16-token
    # block, so vLLM's --kv-offloading-size 0.08 GiB (83.9 MB) holds 40 whole blocks
    assert run(kv_offloading_size=0.08) == run(kv_offloading_blocks=40)
    assert run(kv_offloading_size=0.08, kv_offloading_blocks=40) == run(kv_offloading_blocks=40)
    with pytest.raises(ConfigError, match="holds 40 blocks of 2097152 bytes but kv_offloading_blocks is 41"):
        run(kv_offloading_size=0.08, kv_offloading_blocks=41)


def test_a_shared_store_keeps_a_run_in_one_process():
    from kvplan.sim.parallel import why_not_parallel

    assert "share one prefix store" in why_not_parallel("round_robin", 4, False, 10**6, shared_tier=True)


def test_the_prefix_aware_router_sees_the_shared_store():
    from kvplan.engine.core.request import attach_block_keys, make_request
    from kvplan.sim.routers import PrefixAware
    from tests.sim.helpers import build

    cluster = build(cycling_trace(), SimSpec(num_blocks=12, block_size=16, max_model_len=128, replicas=2,
                                             kv_shared_blocks=40, router="prefix_aware"))
    request = make_request("probe", max_tokens=1, prompt_len=64, prefix_hashes=[0, 1, 2, 3], hash_granularity=16)
    attach_block_keys(request, 16)
    for j in range(3):
        cluster.replicas[0].shared_view.store(request.block_keys.key(j))
    # both replicas see the published blocks (the last block is never a hit), and the probe moves nothing
    assert [PrefixAware.cached_tokens(request, r) for r in cluster.replicas] == [48, 48]
    assert cluster.replicas[1].sched.kv.take_promotions() == []
    # an equal prefix everywhere: the less loaded replica gets it (not the lowest index)
    busy = make_request("busy", max_tokens=4, prompt_len=16)
    assert cluster.replicas[0].submit(busy, 0)
    assert PrefixAware().pick(request, cluster.replicas) is cluster.replicas[1]


def test_a_nodes_network_link_is_its_gpus_nics_shared_by_its_replicas():
    from kvplan.sim.links import NETWORK_LATENCY_S, UNLISTED_NIC_BANDWIDTH, network_link
    from kvplan.sim.run import build_cost

    a100 = build_cost(SimSpec(model="llama-3-8b", hardware="a100-80gb", block_size=16))[0]
    link, per_node = network_link(a100, 16)
    # 8 GPUs x one 200 Gb/s HDR adapter each; a 16-token block of llama-3-8b is 2 MiB
    assert per_node == 8 and link.latency_s == NETWORK_LATENCY_S
    assert link.seconds_per_block == pytest.approx(16 * 128 * 1024 / (8 * 25e9))
    tp2 = build_cost(SimSpec(model="llama-3-8b", hardware="a100-80gb", block_size=16, tensor_parallel_size=2))[0]
    assert network_link(tp2, 16)[1] == 4 and network_link(tp2, 16)[0].seconds_per_block == link.seconds_per_block
    box = build_cost(SimSpec(model="llama-3-8b", hardware="rtx-4090", block_size=16))[0]
    assert network_link(box, 4)[1] == 1
    assert network_link(box, 4)[0].seconds_per_block == pytest.approx(16 * 128 * 1024 / UNLISTED_NIC_BANDWIDTH)
