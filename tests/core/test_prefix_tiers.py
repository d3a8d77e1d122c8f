"""Prefix tiers below the GPU: demotion on eviction, promotion on a hit, counters, and the chain's invariants."""

from __future__ import annotations

from dataclasses import replace

import hypothesis.strategies as st
from hypothesis import given, settings

from kvplan.engine.core import CacheConfig
from kvplan.engine.core.config import ConfigError
from kvplan.engine.core.kv_manager import KVCacheManager
from kvplan.engine.core.prefix_tiers import TierSpec, TierView, build_tiers
from tests.core.invariants import check_pool, check_tiers


def test_an_evicted_gpu_block_is_demoted_and_a_full_tier_demotes_further():
    kv = KVCacheManager(CacheConfig(block_size=4, num_blocks=2, max_model_len=8, kv_offloading_blocks=1,
                                    kv_disk_blocks=1))
    cpu, disk = kv.tiers
    pool = kv.pool
    for key in (10, 11, 12, 13):  # each allocation past the second evicts the oldest cached block
        block = pool.allocate()
        pool.register(block, key)
        pool.release(block)
    assert set(pool.cached) == {12, 13} and 11 in cpu and 10 in disk
    assert (cpu.stats.demotions, disk.stats.demotions, disk.stats.dropped) == (2, 1, 0)
    block = pool.allocate()
    pool.register(block, 14)
    pool.release(block)  # 12 -> cpu, 11 -> disk, 10 off the end
    assert 12 in cpu and 11 in disk and 10 not in disk and disk.stats.dropped == 1


def test_tiers_off_leave_the_pool_without_a_spill_hook():
    kv = KVCacheManager(CacheConfig(block_size=4, num_blocks=4, max_model_len=8))
    assert kv.tiers == [] and kv.pool.spill is None


def test_a_repeated_tier_is_refused():
    try:
        build_tiers([TierSpec("cpu", 2), TierSpec("cpu", 2)], 4)
    except ConfigError as e:
        assert "repeats a tier" in str(e)
    else:
        raise AssertionError("a repeated tier was accepted")


@settings(max_examples=150, deadline=None)
@given(gpu=st.integers(1, 6), cpu=st.integers(1, 6), disk=st.integers(0, 6),
       policy=st.sampled_from(["lru", "fifo", "lfu", "s3fifo"]),
       ops=st.lists(st.tuples(st.booleans(), st.integers(0, 15)), max_size=60))
def test_demotions_and_promotions_keep_every_tier_within_capacity_and_unique(gpu, cpu, disk, policy, ops):
    """Random stores (compute a block, register, free it) and lookups through `_promote`: every key is in at
    most one slot per tier, no tier exceeds its capacity, ref counts return to 0, a promoted key is in the GPU."""
    kv = KVCacheManager(CacheConfig(block_size=1, num_blocks=gpu, max_model_len=1, kv_offloading_blocks=cpu,
                                    kv_offloading_eviction=policy, kv_disk_blocks=disk))
    pool = kv.pool
    for store, key in ops:
        if store and key not in pool.cached:
            block = pool.allocate()
            pool.register(block, key)
            pool.release(block)
        elif not store:
            held = pool.cached.get(key)
            was_below = held is None and any(key in t for t in kv.tiers)
            count = sum(t.stats.promotions for t in kv.tiers)
            promoted = kv._promote([key], [])
            if was_below or held is not None:  # promoted, or found in the GPU (not copied again)
                assert [b.key for b in promoted] == [key] and pool.cached[key] is promoted[0]
                assert sum(t.stats.promotions for t in kv.tiers) == count + was_below
            else:
                assert promoted == []
        check_pool(pool, {})
        check_tiers(kv)
    moved = kv.take_promotions()
    assert sum(t.stats.promotions for t in kv.tiers) == len(moved) and kv.take_promotions() == []


def test_a_probe_counts_tier_blocks_without_moving_them_and_a_lookup_promotes_them():
    from kvplan.engine.core.request import attach_block_keys, make_request

    kv = KVCacheManager(CacheConfig(block_size=4, num_blocks=8, max_model_len=32, kv_offloading_blocks=8))
    first = make_request("a", max_tokens=1, prompt_token_ids=list(range(17)))
    attach_block_keys(first, 4)
    keys = [first.block_keys.key(i) for i in range(4)]
    pool = kv.pool
    for key in keys[2:]:  # the prompt's last two full blocks are on the CPU, its first two nowhere
        kv.tiers[0].store(key, 0)  # as if GPU block 0 had held it
    again = make_request("b", max_tokens=1, prompt_token_ids=list(range(17)))
    attach_block_keys(again, 4)
    assert kv.cached_prefix_blocks(again) == 0 and kv.find_cached_prefix(again) == []  # stops at the first miss
    for key in keys[:2]:
        block = pool.allocate()
        pool.register(block, key)
        pool.release(block)
    before = (dict(pool.cached), kv.tiers[0].stats.promotions)
    assert kv.cached_prefix_blocks(again) == 4
    assert (dict(pool.cached), kv.tiers[0].stats.promotions) == before  # the probe moved nothing
    hits = kv.find_cached_prefix(again)
    assert [b.key for b in hits] == keys and kv.tiers[0].stats.promotions == 2
    assert [tier for tier, _ in kv.take_promotions()] == ["cpu", "cpu"]
    check_pool(pool, {})
    check_tiers(kv)


def store_block(kv: KVCacheManager, key: int) -> None:
    """A block computed, registered and freed on `kv`'s GPU (what a finished request leaves)."""
    block = kv.pool.allocate()
    kv.pool.register(block, key)
    kv.pool.release(block)


@settings(max_examples=150, deadline=None)
@given(gpu=st.integers(1, 5), cpu=st.integers(0, 4), disk=st.integers(0, 4), shared=st.integers(1, 6),
       policy=st.sampled_from(["lru", "fifo", "lfu", "s3fifo"]), write_through=st.booleans(),
       ops=st.lists(st.tuples(st.integers(0, 2), st.booleans(), st.integers(0, 15)), max_size=60))
def test_replicas_sharing_one_store_keep_every_tier_within_capacity_and_unique(gpu, cpu, disk, shared, policy,
                                                                               write_through, ops):
    """Three replicas whose chains end in one shared store, write-back or write-through: random stores and
    lookups on any replica keep a key at most once per tier and every tier within capacity, pin nothing between
    operations; a key another replica published is promoted here; write-through puts a new block in every tier;
    the views' counters add up to what the store holds."""
    config = CacheConfig(block_size=1, num_blocks=gpu, max_model_len=1, kv_offloading_blocks=cpu,
                         kv_disk_blocks=disk, kv_shared_blocks=shared, kv_shared_eviction=policy,
                         kv_offloading_write_through=write_through)
    store = build_tiers([TierSpec("shared", shared, policy)], 1)[0]
    replicas = [KVCacheManager(replace(config, kv_shared_blocks=0)) for _ in range(3)]
    views = [TierView(store) for _ in replicas]
    for kv, view in zip(replicas, views, strict=True):
        kv.share_tier(view)
    for kv in replicas:
        assert [t.name for t in kv.tiers] == [n for n, size in (("cpu", cpu), ("disk", disk), ("shared", 1)) if size]
    for which, is_store, key in ops:
        kv = replicas[which]
        if is_store and key not in kv.pool.cached:
            store_block(kv, key)
            if write_through:
                assert all(key in tier for tier in kv.tiers), "write-through left a tier without the block"
        elif not is_store:
            elsewhere = key not in kv.pool.cached and key in store and not any(key in t for t in kv.tiers[:-1])
            promoted = kv._promote([key], [])
            if elsewhere:  # only the shared store had it: fetched from there (maybe another replica's block)
                assert [b.key for b in promoted] == [key]
                assert kv.take_promotions()[-1][0] == "shared"
        for replica in replicas:
            check_pool(replica.pool, {})
            check_tiers(replica)
    held = len(store)
    stored = sum(v.stats.demotions for v in views)
    assert held <= shared and held <= stored
    assert all(v.stats.promotions == v.stats.hits for v in views)


def test_a_block_one_replica_published_is_a_hit_on_another():
    config = CacheConfig(block_size=1, num_blocks=1, max_model_len=1, kv_shared_blocks=4)
    store = build_tiers([TierSpec("shared", 4)], 1)[0]
    a, b = (KVCacheManager(replace(config, kv_shared_blocks=0)) for _ in range(2))
    view_a, view_b = TierView(store), TierView(store)
    a.share_tier(view_a)
    b.share_tier(view_b)
    store_block(a, 7)
    store_block(a, 8)  # evicts 7 from a's one GPU block: published to the shared store
    assert 7 in store and view_a.stats.demotions == 1 and view_b.stats.demotions == 0
    assert [blk.key for blk in b._promote([7], [])] == [7]
    assert b.take_promotions()[0][0] == "shared" and (view_b.stats.hits, view_a.stats.hits) == (1, 0)


def test_write_through_stores_a_block_in_every_tier_when_it_is_computed():
    kv = KVCacheManager(CacheConfig(block_size=1, num_blocks=2, max_model_len=1, kv_offloading_blocks=2,
                                    kv_disk_blocks=3, kv_offloading_write_through=True))
    store_block(kv, 5)
    assert all(5 in tier for tier in kv.tiers) and kv.pool.spill is None
    cpu, disk = kv.tiers
    for key in (6, 7):  # the CPU tier's LRU drops 5 (its own copy): the larger disk tier still has its own
        store_block(kv, key)
    assert 5 not in cpu and 5 in disk and (cpu.stats.dropped, disk.stats.dropped) == (1, 0)
    assert (cpu.stats.demotions, disk.stats.demotions) == (3, 3)


@settings(max_examples=150, deadline=None)
@given(cpu=st.integers(1, 5), disk=st.integers(0, 4), policy=st.sampled_from(["lru", "fifo", "lfu", "s3fifo"]),
       batches=st.lists(st.tuples(st.lists(st.integers(0, 12), max_size=8, unique=True), st.integers(-1, 12)),
                        max_size=25))
def test_a_batch_of_stores_is_the_stores_one_at_a_time(cpu, disk, policy, batches):
    """What a GPU allocation's evictions hand the chain in one call (`store_many`) ends as the same calls one key at
    a time would leave it: each tier's keys in its policy's eviction order, its counters (the last tier's drops
    counted from its evictions: the evictions its pool reports key by key), the logged copies; `pin` holds a key
    through a batch (a promotion in flight)."""
    chains = []
    for _ in range(2):
        log: list = []
        chains.append((build_tiers([TierSpec("cpu", cpu, policy), TierSpec("disk", disk, policy)], 1, log=log), log))
    lost: list[tuple[int, int]] = []  # the one-at-a-time chain's last tier: what its pool evicts, told key by key
    chains[1][0][-1].pool.spill = lost.extend
    for keys, pinned in batches:
        batch = [(key, 100 + key) for key in keys]
        for tiers, _ in chains:
            slot = tiers[0].pin(pinned) if pinned >= 0 else None
            if tiers is chains[0][0]:
                tiers[0].store_many(batch)
            else:
                for key, block in batch:
                    tiers[0].store(key, block)
            if slot is not None:
                tiers[0].unpin(slot)
    (batched, batched_log), (single, single_log) = chains
    assert batched_log == single_log
    if disk:  # a drop from an unpinned last tier is an eviction from it (the top one may drop a store when pinned)
        assert single[-1].stats.dropped == len(lost)
    for a, b in zip(batched, single, strict=True):
        assert (a.stats, a.name) == (b.stats, b.name)
        order = [[block.key for block in t.pool.policy.evict_many(len(t.pool.policy))] for t in (a, b)]
        assert order[0] == order[1]
