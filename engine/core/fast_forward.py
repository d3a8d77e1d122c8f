"""Batched advance of a pure-decode stretch: k scheduler cycles in one call, for the simulator.

When every running request is decoding one token per step and nothing else can happen - no arrival (the caller
bounds k by the next one), nobody waiting or swapped out, no completion before the last of the k steps, no
copy-on-write, no block allocation beyond the empty blocks (so no eviction and no allocation failure), no sliding
window - then k cycles of `schedule()` + `update()` are predictable. `advance_decode` applies them in one pass
and leaves exactly the state k single cycles would leave: the same block ids (allocations replayed in step
order, then request order), the same prefix-cache registrations and, in the last step, the same completions in
the same order (the eviction policies see the same sequence), the same counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.core.outputs import UpdateOutput
from engine.core.request import Request, RequestStatus

if TYPE_CHECKING:
    from engine.core.scheduler import Scheduler

ALLOCATE, UPDATE = 0, 1  # within a step, schedule() allocates before update() registers and finishes
REGISTER, FINISH = 0, 1  # update() handles one request at a time: its registrations, then its completion


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
        k = min(k, request.max_tokens - request.num_output_tokens)  # completions only in the last step
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
    if _blocks_needed(sched, k) <= pool.num_empty:
        return k  # the common case: empty blocks are plentiful
    lo, hi = 0, k - 1  # new blocks needed grows with k: find the largest k served by empty blocks alone
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


def advance_decode(sched: Scheduler, k: int) -> list[Request]:
    """Apply k pure-decode cycles at once (k from `decode_horizon`); returns the requests that finished in the
    last of them, in the order `update()` would have finished them."""
    if k <= 0:
        return []
    running = sched.running
    for request in running:
        request.num_computed_tokens += k
        request.num_output_tokens += k
    finishing = [idx for idx, r in enumerate(running) if r.num_output_tokens >= r.max_tokens]
    pool = getattr(sched.kv, "pool", None)
    events = _block_events(sched, pool, k) if pool is not None else []
    events += [(k - 1, UPDATE, idx, FINISH, 0) for idx in finishing]
    events.sort()
    result = UpdateOutput()
    tables, ids = sched.kv.tables, sched.kv.block_ids
    for _, phase, idx, kind, j in events:
        request = running[idx]
        if phase == ALLOCATE:
            block = pool.allocate()
            tables[request.request_id].append(block)
            ids[request.request_id].append(block.block_id)
        elif kind == REGISTER:
            block = tables[request.request_id][j]
            if block.key is None:
                pool.register(block, request.block_keys.key(j))
            request.num_hashed_blocks = j + 1
        else:
            sched._finish(request, "length", result)
    if result.finished:
        sched.running = [r for r in running if r.status is RequestStatus.RUNNING]
    sched.step_id += k
    sched.stats.num_steps += k
    return result.finished


def _block_events(sched: Scheduler, pool, k: int) -> list[tuple[int, int, int, int, int]]:
    """(step, phase, running index, kind, logical block) of every allocation and registration in the k steps;
    the counts were already advanced by k."""
    bs, registering = sched.block_size, pool.enable_caching
    events = []
    for idx, request in enumerate(sched.running):
        pos = request.num_computed_tokens - k  # before the stretch
        # Step t writes position pos + t; a new block is allocated whenever that position starts one.
        for start in range(-(-pos // bs) * bs, pos + k, bs):
            events.append((start - pos, ALLOCATE, idx, 0, start // bs))
        if registering and request.block_keys is not None:
            # After step t, pos + t + 1 tokens are computed; block e // bs - 1 is full when e = pos + t + 1.
            for end in range((pos // bs + 1) * bs, pos + k + 1, bs):
                events.append((end - pos - 1, UPDATE, idx, REGISTER, end // bs - 1))
    return events
