"""Batched advance of a pure-decode stretch: k scheduler cycles in one call, for the simulator.

When every running request is decoding one token per step and nothing else can happen - no arrival (the caller
bounds k by the next one), nobody waiting or swapped out, no completion, no copy-on-write, no block allocation
beyond the empty blocks (so no eviction and no allocation failure), no sliding window - then k cycles of
`schedule()` + `update()` are predictable. `advance_decode` applies them in one pass and leaves exactly the
state k single cycles would leave: the same block ids (allocations replayed in step order, then request
order), the same prefix-cache registrations in the same order (the eviction policies see the same sequence),
the same counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.core.scheduler import Scheduler

ALLOCATE, REGISTER = 0, 1  # within a step, schedule() allocates before update() registers


def decode_horizon(sched: Scheduler, limit: int) -> int:
    """Largest k <= limit for which `advance_decode(sched, k)` is exact (0 when no fast path applies)."""
    if limit <= 0 or not sched.running or sched.swapped or len(sched.waiting) or sched._rejected:
        return 0
    if sched.cache_config.windowed or len(sched.running) > sched.config.max_num_batched_tokens:
        return 0
    k = limit
    for request in sched.running:
        if request.token_ids is not None or request.num_tokens_to_compute != 1:
            return 0  # the engine samples real tokens (stop tokens possible); only count-only runs qualify
        if request.n > 1 and not request.forked:
            return 0
        k = min(k, request.max_tokens - request.num_output_tokens - 1)  # nobody may finish inside the stretch
    if k <= 0:
        return 0
    pool = getattr(sched.kv, "pool", None)
    if pool is None:  # contiguous reservation: decode never allocates
        return k
    bs, tables = sched.block_size, sched.kv.tables
    registering = pool.enable_caching
    for request in sched.running:
        pos = request.num_computed_tokens
        table = tables[request.request_id]
        if len(table) != -(-pos // bs) or (pos % bs and table[pos // bs].ref_cnt > 1):
            return 0  # the next write needs copy-on-write (or the table is not in its steady decode shape)
        if registering and request.block_keys is not None and request.num_hashed_blocks != pos // bs:
            return 0
    lo, hi = 0, k  # new blocks needed grows with k: find the largest k served by empty blocks alone
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _blocks_needed(sched, mid) <= pool.num_empty:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _blocks_needed(sched: Scheduler, k: int) -> int:
    bs = sched.block_size
    # Positions pos .. pos+k-1 are written; a block starts at every multiple of bs among them.
    return sum((r.num_computed_tokens + k - 1) // bs - (r.num_computed_tokens - 1) // bs for r in sched.running)


def advance_decode(sched: Scheduler, k: int) -> None:
    """Apply k pure-decode cycles at once. The caller obtained k from `decode_horizon`."""
    if k <= 0:
        return
    kv, bs = sched.kv, sched.block_size
    pool = getattr(kv, "pool", None)
    if pool is not None:
        _replay_block_events(sched, kv, pool, bs, k)
    for request in sched.running:
        request.num_computed_tokens += k
        request.num_output_tokens += k
    sched.step_id += k
    sched.stats.num_steps += k


def _replay_block_events(sched: Scheduler, kv, pool, bs: int, k: int) -> None:
    registering = pool.enable_caching
    events: list[tuple[int, int, int, int]] = []  # (step, phase, running index, logical block)
    for idx, request in enumerate(sched.running):
        pos = request.num_computed_tokens
        # Step t writes position pos + t; a new block is allocated whenever that position starts one.
        for start in range(-(-pos // bs) * bs, pos + k, bs):
            events.append((start - pos, ALLOCATE, idx, start // bs))
        if registering and request.block_keys is not None:
            # After step t, pos + t + 1 tokens are computed; block e // bs - 1 is full when e = pos + t + 1.
            for end in range((pos // bs + 1) * bs, pos + k + 1, bs):
                events.append((end - pos - 1, REGISTER, idx, end // bs - 1))
    events.sort()
    running = sched.running
    for _, phase, idx, j in events:
        request = running[idx]
        table = kv.tables[request.request_id]
        if phase == ALLOCATE:
            block = pool.allocate()
            table.append(block)
            kv.block_ids[request.request_id].append(block.block_id)
        else:
            block = table[j]
            if block.key is None:
                pool.register(block, request.block_keys.key(j))
            request.num_hashed_blocks = j + 1
