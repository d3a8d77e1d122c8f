"""Hand-worked eviction orders for every policy, on the block pool directly; the LRU queue against a linked list."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.engine.core.block_pool import BlockPool, KVBlock
from kvplan.engine.core.config import ConfigError
from kvplan.engine.core.eviction import EVICTION_POLICIES, lru


def cache_chain(pool: BlockPool, keys: list[int]) -> list:
    blocks = [pool.allocate() for _ in keys]
    for block, key in zip(blocks, keys, strict=True):
        assert pool.register(block, key)
    return blocks


def release_tail_first(pool: BlockPool, blocks: list) -> None:
    for block in reversed(blocks):
        pool.release(block)


def hit(pool: BlockPool, block, times: int = 1) -> None:
    for _ in range(times):
        pool.acquire(block)
        pool.release(block)


def eviction_order(pool: BlockPool, count: int) -> list[int]:
    """Block ids in the order allocations evict them (empty blocks are used first and not reported)."""
    while pool.num_empty:
        pool.allocate()
    order = []
    for _ in range(count):
        key_before = {b.block_id: b.key for b in pool.blocks}
        block = pool.allocate()
        assert key_before[block.block_id] is not None and block.key is None
        order.append(block.block_id)
    return order


def two_chains(policy: str) -> tuple[BlockPool, list, list]:
    pool = BlockPool(num_blocks=6, block_size=4, eviction_policy=policy)
    a = cache_chain(pool, [100, 101, 102])  # blocks 0, 1, 2: one request's chain
    b = cache_chain(pool, [200, 201])  # blocks 3, 4
    return pool, a, b


def test_lru_evicts_deepest_block_of_the_least_recently_freed_chain_first():
    pool, a, b = two_chains("lru")
    release_tail_first(pool, a)
    release_tail_first(pool, b)
    assert eviction_order(pool, 5) == [2, 1, 0, 4, 3]
    assert pool.num_evictions == 5


def test_lru_hit_on_a_free_block_refreshes_it():
    pool, a, b = two_chains("lru")
    release_tail_first(pool, a)
    release_tail_first(pool, b)
    hit(pool, a[0])
    assert eviction_order(pool, 5) == [2, 1, 4, 3, 0]


def test_fifo_evicts_in_cache_insertion_order_ignoring_hits():
    pool, a, b = two_chains("fifo")
    release_tail_first(pool, b)
    release_tail_first(pool, a)
    hit(pool, a[0], times=3)
    assert eviction_order(pool, 5) == [0, 1, 2, 3, 4]


def test_lfu_evicts_fewest_uses_then_earliest_freed():
    pool, a, b = two_chains("lfu")
    for _ in range(2):  # two hits on block 0 while it is in use
        pool.acquire(a[0])
    pool.release(a[0])
    pool.release(a[0])
    pool.acquire(b[0])  # one hit on block 3
    pool.release(b[0])
    release_tail_first(pool, a)
    release_tail_first(pool, b)
    assert eviction_order(pool, 5) == [2, 1, 4, 3, 0]


def test_s3fifo_promotes_a_block_hit_in_the_small_queue_and_evicts_one_hit_wonders_first():
    pool = BlockPool(num_blocks=4, block_size=4, eviction_policy="s3fifo")
    x, y, z = cache_chain(pool, [1, 2, 3])
    pool.acquire(x)  # a hit while x is in use
    pool.release(x)
    for block in (x, y, z):  # freed oldest first: LRU would evict x first
        pool.release(block)
    assert eviction_order(pool, 3) == [y.block_id, z.block_id, x.block_id]


def test_s3fifo_ghost_hit_goes_straight_to_main():
    pool = BlockPool(num_blocks=3, block_size=4, eviction_policy="s3fifo")
    (y,) = cache_chain(pool, [7])
    pool.release(y)
    pool.allocate(), pool.allocate()  # exhaust empty blocks
    evicted = pool.allocate()  # evicts y: key 7 is remembered in the ghost queue
    assert evicted is y and 7 in pool.policy._ghost
    assert pool.register(evicted, 7)  # the same contents come back
    assert evicted.block_id in pool.policy._in_main
    others = [b for b in pool.blocks if b is not evicted]
    assert pool.register(others[0], 8)
    pool.release(evicted)
    pool.release(others[0])
    # the small queue (key 8) is drained before main (key 7), although 7 was freed first
    assert eviction_order(pool, 2) == [others[0].block_id, evicted.block_id]


@pytest.mark.parametrize("policy", sorted(EVICTION_POLICIES))
def test_every_policy_counts_evictions_and_drops_keys(policy):
    pool, a, b = two_chains(policy)
    release_tail_first(pool, a)
    release_tail_first(pool, b)
    order = eviction_order(pool, 5)
    assert sorted(order) == [0, 1, 2, 3, 4]
    assert pool.num_evictions == 5 and not pool.cached


def test_unknown_policy_lists_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"cache.eviction_policy: unknown policy 'mru'; allowed: fifo, lfu, lru"):
        BlockPool(4, 4, eviction_policy="mru")


def test_every_copy_of_duplicate_contents_is_keyed_as_vllm():
    pool = BlockPool(4, 4)
    first, second = pool.allocate(), pool.allocate()
    assert pool.register(first, 5)
    assert pool.register(second, 5)  # vLLM keys every copy (BlockHashToBlockMap), the first one is found
    assert pool.lookup(5) is first and pool.duplicates[5] == [second]
    pool.release(second)
    assert pool.num_empty == 2 and pool.num_cached_free == 1  # the copy is a cached free block, not an empty one
    pool.release(first)
    # Evicting the copy a lookup finds hands the key to the other copy: the contents stay hit-able.
    pool.allocate(), pool.allocate()
    evicted = pool.allocate()
    assert evicted is second and pool.lookup(5) is first and not pool.duplicates
    pool.allocate()
    assert pool.lookup(5) is None and not pool.cached


def test_evicting_the_first_copy_promotes_the_next():
    pool = BlockPool(3, 4)
    first, second = pool.allocate(), pool.allocate()
    pool.register(first, 5), pool.register(second, 5)
    pool.release(first)
    pool.allocate()  # the empty block
    assert pool.allocate() is first  # evicts the only free copy
    assert pool.lookup(5) is second and not pool.duplicates


def test_unregister_takes_a_block_out_of_the_cache():
    for policy in ("lru", "fifo", "lfu", "s3fifo"):
        pool = BlockPool(3, 4, eviction_policy=policy)
        first, second = pool.allocate(), pool.allocate()
        pool.register(first, 5), pool.register(second, 5)
        pool.unregister(first)
        assert first.key is None and pool.lookup(5) is second and not pool.duplicates
        pool.release(first)
        assert pool.num_empty == 2, policy  # an unkeyed block frees as empty




@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["insert", "remove", "evict", "evict_many"]), st.integers(0, 5)),
                max_size=120), st.sampled_from([4, 12, 40, 100_000]))
def test_lru_queue_is_a_linked_list_in_free_order(ops, capacity):
    """The lazy-removal queue (`eviction.lru`) against the doubly linked list it stands for (an ordered dict):
    the same candidates, evicted in the same order, whatever inserts, hits and evictions come in between, with
    a compaction after every stale entry (capacity 4: slack 0) as with rare ones (100,000: 1,024); the queue stays
    within four entries per block plus three slacks."""
    blocks = [KVBlock(i) for i in range(6)]
    policy, reference = lru.LRUPolicy(capacity), OrderedDict()
    evicted = 0
    for op, block_id in ops:
        block = blocks[block_id]
        if op == "insert" and block_id not in reference:
            policy.insert(block)
            reference[block_id] = block
        elif op == "remove" and block_id in reference:
            policy.remove(block)
            del reference[block_id]
        elif op == "evict" and reference:
            assert policy.evict() is reference.popitem(last=False)[1]
            evicted += 1
        elif op == "evict_many":
            n = min(block_id, len(reference))
            assert policy.evict_many(n) == [reference.popitem(last=False)[1] for _ in range(n)]
            evicted += n
        assert len(policy) == len(reference)
        assert len(policy._queue) <= 4 * len(blocks) + 3 * policy._slack + 1
    assert policy.num_evictions == evicted
    assert [policy.pop_victim() for _ in range(len(policy))] == list(reference.values())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["allocate", "allocate_many", "release", "register", "insert_free",
                                           "drop_cache"]), st.integers(0, 7)), max_size=60),
       st.integers(1, 12), st.sampled_from(sorted(EVICTION_POLICIES)))
def test_blocks_created_on_first_use_are_handed_out_as_a_pool_built_whole(ops, num_blocks, policy):
    """A pool creates its blocks on first use; one whose blocks were all created up front (`blocks` read at once)
    hands out the same block ids, evicts the same ones and reports the same counts after every operation."""
    lazy, whole = BlockPool(num_blocks, 4, policy), BlockPool(num_blocks, 4, policy)
    assert [b.block_id for b in whole.blocks] == list(range(num_blocks))
    held: list[list] = [[], []]  # each pool's blocks in use, in the same order
    next_key = 1
    for op, arg in ops:
        for pool, mine in zip((lazy, whole), held, strict=True):
            if op == "allocate" and pool.num_free:
                mine.append(pool.allocate())
            elif op == "allocate_many":
                mine.extend(pool.allocate_many(min(arg, pool.num_free)))
            elif op == "release" and mine:
                pool.release_all(mine[-arg - 1:])
                del mine[-arg - 1:]
            elif op == "register":
                for block in mine[:arg]:
                    if block.key is None:
                        pool.register(block, next_key + block.block_id)
            elif op == "insert_free" and (next_key + 1000) not in pool.cached:
                pool.insert_free(next_key + 1000)
            elif op == "drop_cache":
                pool.drop_cache()
        next_key += 100
        assert [[b.block_id for b in mine] for mine in held[:1]] == [[b.block_id for b in held[1]]]
        assert (lazy.num_free, lazy.num_empty, lazy.num_used, lazy.num_evictions, lazy.empty_order()) == (
            whole.num_free, whole.num_empty, whole.num_used, whole.num_evictions, whole.empty_order())
        assert sorted(lazy.cached) == sorted(whole.cached)
    assert [(b.block_id, b.ref_cnt, b.key) for b in lazy.blocks] == [(b.block_id, b.ref_cnt, b.key)
                                                                    for b in whole.blocks]
