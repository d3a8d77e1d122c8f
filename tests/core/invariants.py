"""Checks of the DESIGN.md invariants over a live Scheduler, shared by the property and unit tests."""

from __future__ import annotations

from collections import Counter

from kvplan.engine.core import RequestStatus, Scheduler
from kvplan.engine.core.block_keys import PRIVATE_KEY
from kvplan.engine.core.block_pool import BlockPool
from kvplan.engine.core.metrics import _table_slots


def check_pool(pool: BlockPool, tables: dict) -> None:
    holders: Counter[int] = Counter()
    for table in tables.values():
        for block in table:
            if block is not None:
                holders[block.block_id] += 1
    order = pool.empty_order()
    empty = set(order)
    assert len(empty) == len(order) == pool.num_empty, "a block is twice in the empty list"
    assert len(empty) + len(pool.policy) + pool.num_used == pool.num_blocks
    for block in pool.blocks:
        assert block.ref_cnt == holders[block.block_id], f"block {block.block_id}: ref {block.ref_cnt} != holders"
        if block.ref_cnt == 0 and block.key is None:
            assert block.block_id in empty, f"free unkeyed block {block.block_id} not in the empty list"
        else:
            assert block.block_id not in empty, f"block {block.block_id} is in the empty list but used or keyed"
        if block.private:  # keyed by a placeholder, not entered: its request has not looked it up since
            assert block.key == PRIVATE_KEY and block.key not in pool.cached  # (`check_private`)
        elif block.key is not None:  # every keyed block is findable: the one a lookup returns or a later copy
            assert pool.cached[block.key] is block or block in pool.duplicates[block.key]
    assert all(b.key == k for k, b in pool.cached.items())
    for key, copies in pool.duplicates.items():
        assert copies and key in pool.cached and all(b.key == key for b in copies)
        assert pool.cached[key] not in copies and len({b.block_id for b in copies}) == len(copies)
    cached_free = sum(1 for b in pool.blocks if b.ref_cnt == 0 and b.key is not None)
    assert cached_free == len(pool.policy), "eviction candidates != cached free blocks"


def check_private(sched: Scheduler) -> None:
    """A private block in use is its request's alone, in its own run, and that request is running: a request that
    will look its blocks up again (waiting, swapped) had them entered when it was preempted."""
    for rid, table in sched.kv.tables.items():
        request = sched.requests[rid]
        for i, block in enumerate(table):
            if block is not None and block.private:
                assert request.status is RequestStatus.RUNNING, f"{rid} cannot find its own blocks"
                assert i >= request.private_from and block.ref_cnt == 1


def check_scheduler(sched: Scheduler, mid_step: bool = False) -> None:
    """`mid_step`: between schedule() and update(), when a step's new blocks are held but the blocks that left
    the window are not yet released."""
    kv = sched.kv
    live = set(sched.requests)
    assert set(kv.tables) <= live
    check_tiers(kv)
    if hasattr(kv, "extents"):  # a contiguous reservation allocator
        assert kv.reserved_slots == sum(length for _, length in kv.extents.values()) <= kv.total_slots
    else:
        _check_paged(sched, mid_step)
        check_private(sched)
    for request in sched.running:
        assert request.status is RequestStatus.RUNNING and request.request_id in kv.tables
    for request in sched.waiting:
        assert request.request_id not in kv.tables and request.num_computed_tokens == 0
    assert len(sched.running) + len(sched.swapped) + len(sched.waiting) == len(sched.requests)
    assert sched.num_running_seqs == sum(r.seq_slots for r in sched.running) <= sched.config.max_num_seqs


def _check_paged(sched: Scheduler, mid_step: bool) -> None:
    kv = sched.kv
    assert set(kv.cpu_tables) <= set(sched.requests)
    for rid, table in kv.tables.items():
        assert kv.block_ids[rid] == [-1 if b is None else b.block_id for b in table]
    on_requests = getattr(kv, "tables_on_requests", False)  # (a hybrid cache's groups keep theirs to themselves)
    for rid, request in sched.requests.items():  # a request's own table is the one its cache holds under its id
        assert request.kv_table is (kv.tables.get(rid) if on_requests else None), f"{rid}: kv_table is stale"
    check_pool(kv.pool, kv.tables)
    if kv.cpu_pool is not None:
        check_pool(kv.cpu_pool, kv.cpu_tables)
    for request in sched.running:
        table = kv.tables[request.request_id]
        assert len(table) * kv.block_size >= request.num_computed_tokens
        if kv.config.windowed:
            held = sum(1 for b in table if b is not None)
            bound = (kv.config.peak_blocks(request.final_len - 1, sched.config.max_num_batched_tokens) if mid_step
                     else kv.config.blocks_per_request(10**9))
            assert held <= bound, f"{request.request_id} holds {held} > {bound} blocks in window mode"
    if not mid_step:
        check_shared_blocks_lead(sched)
    groups = [r.group for r in sched.swapped]
    for request in sched.swapped:
        assert request.request_id in kv.cpu_tables and request.request_id not in kv.tables
    assert len(set(groups)) == len([g for i, g in enumerate(groups) if i == 0 or groups[i - 1] != g]), \
        "a swapped group's members are not adjacent"


def check_shared_blocks_lead(sched: Scheduler) -> None:
    """With one group of blocks and no window, in every table a block of one reference whose key has one copy in
    the pool (or none) is followed by no block of more than one reference - the memory breakdown's shortcut
    (`metrics._table_slots`) - and the breakdown's sums agree with and without it."""
    kv = sched.kv
    if len(kv.groups) != 1 or kv.config.windowed:
        return
    duplicates = kv.pool.duplicates
    for rid, table in kv.tables.items():
        own = next((i for i, block in enumerate(table) if block is not None and block.ref_cnt == 1
                    and block.key not in duplicates), len(table))
        after = [i for i, block in enumerate(table[own:], own) if block is not None and block.ref_cnt > 1]
        assert not after, f"{rid}: blocks {after} shared after block {own}, its own with a single-copy key"
    args = (kv.groups[0].tables, [*sched.running, *sched.swapped], kv.block_size, kv.config.num_blocks)
    assert _table_slots(*args, True, duplicates) == _table_slots(*args, False)


def check_tiers(kv) -> None:
    """Each lower prefix tier: a key in at most one slot, never over capacity, no slot pinned between steps."""
    for tier in getattr(kv, "tiers", ()):
        pool = tier.pool
        assert not pool.duplicates, f"tier {tier.name}: a key is in two slots"
        assert len(pool.cached) <= pool.num_blocks, f"tier {tier.name} exceeds its capacity"
        assert all(b.ref_cnt == 0 for b in pool.blocks), f"tier {tier.name}: a slot is still pinned"
        assert len(pool.cached) == pool.num_cached_free
        check_pool(pool, {})


def check_all_free(sched: Scheduler) -> None:
    """After every request ended: no leak; after dropping the cache every block is empty."""
    if hasattr(sched.kv, "extents"):
        assert not sched.kv.extents and sched.kv.reserved_slots == 0
        assert sched.kv.largest_free_extent() == sched.kv.total_slots
        return
    pool = sched.kv.pool
    assert all(b.ref_cnt == 0 for b in pool.blocks), "leaked block references"
    assert pool.num_free == pool.num_blocks
    sched.reset_prefix_cache()
    assert pool.num_empty == pool.num_blocks and not pool.cached and not pool.duplicates
    if sched.kv.cpu_pool is not None:
        assert sched.kv.cpu_pool.num_free == sched.kv.cpu_pool.num_blocks
