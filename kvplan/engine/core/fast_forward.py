"""Batched advance of a pure-decode stretch: k scheduler cycles in one call, for the simulator.

When every running request is decoding one token per step and nothing else can happen - no arrival (the caller
bounds k by the next one), nothing swapped out, no copy-on-write, no allocation failure, no sliding window, and
either nobody waiting or a waiting head that cannot be admitted before the first completion (a backlog) - then
k cycles of `schedule()` + `update()` are predictable, completions included: a request that reaches its output
budget finishes in its step and the others go on decoding. `advance_decode` applies the k cycles in one pass and
leaves exactly the state k single cycles would leave: the same block ids (allocations replayed in step order,
then request order, each one taking an empty block or evicting the policy's victim exactly as a single step
would), the same prefix-cache registrations and completions in the same order (the eviction policies see the
same sequence), the same counts. The horizon asks the free blocks (empty plus cached) to cover every allocation
of the stretch, so none can fail; blocks a completion frees only add to them::

    step        0    1    2    3    4
    request a   ▪    ▪    ▪    ▪    ▪      allocate (maybe evict) / register / finish events, replayed sorted by
    request b   ▪    ▪    ✓               (step, schedule-before-update, running order, allocate-before-register)

A step registers its full blocks when it is scheduled (vLLM's timing, `Scheduler._emit`), so allocations and
registrations are both schedule-time events, each request's allocation before its registration; completions
happen in the update. Nothing in a stretch reads the prefix cache (admissions are excluded), so evicting inside it
changes nothing but the blocks' fate, which the replay reproduces. A step's registrations and evictions all
precede its end, so a cache-aware router reading the cache at an arrival during the stretch's last step sees what
it would see step by step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.engine.core.outputs import UpdateOutput
from kvplan.engine.core.request import Request, RequestStatus

if TYPE_CHECKING:
    from kvplan.engine.core.scheduler import Scheduler

SCHEDULE, UPDATE = 0, 1  # within a step, schedule() allocates and registers before update() finishes
ALLOCATE, REGISTER, FINISH = 0, 1, 2  # schedule() handles one request at a time: its allocation, then its keys


def decode_horizon(sched: Scheduler, limit: int) -> int:
    """Largest k <= limit for which `advance_decode(sched, k)` is exact (0 when no fast path applies)."""
    if limit <= 0 or not sched.running or sched.swapped or sched._rejected:
        return 0
    backlog = len(sched.waiting) > 0
    if backlog and not waiting_head_blocked(sched):
        return 0  # an admission is due
    if sched._windowed or len(sched.running) > sched.config.max_num_batched_tokens:  # windows release
        return 0
    pool = getattr(sched.kv, "pool", None)
    bs, tables = sched.block_size, sched.kv.tables
    registering = pool is not None and pool.enable_caching
    longest, shortest = 0, limit
    needed = 0  # new blocks for `limit` steps (the same as for k, as no request runs longer)
    for request in sched.running:  # once per running request per stretch: properties and helpers inlined
        pos = request.num_computed_tokens
        output = request.num_output_tokens
        if request.token_ids is not None or request.prompt_len + output - pos != 1:
            return 0  # the engine samples real tokens (stop tokens possible); only count-only runs qualify
        if request.n > 1 and not request.forked:
            return 0
        remaining = request.max_tokens - output
        if remaining > longest:
            longest = remaining
        if remaining < shortest:
            shortest = remaining
        if pool is None:
            continue  # contiguous reservation: decode never allocates
        table = tables[request.request_id]
        if len(table) != -(-pos // bs) or (pos % bs and table[pos // bs].ref_cnt > 1):
            return 0  # the next write needs copy-on-write (or the table is not in its steady decode shape)
        if registering and request.block_keys is not None and request.num_hashed_blocks != pos // bs:
            return 0
        # `_new_blocks(pos, min(limit, remaining), bs)`
        needed += (pos + (limit if limit < remaining else remaining) - 1) // bs - (pos - 1) // bs
    k = min(limit, longest)  # past the longest remaining output nobody is left to step
    if backlog:
        k = min(k, shortest)  # the first completion frees a slot and blocks: the head may then be admitted
    if pool is None or needed <= pool.num_free:
        return k  # the common case: free blocks are plentiful
    lo, hi = 0, k  # new blocks needed grows with k: find the largest k served by the free blocks
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _blocks_needed(sched, mid) <= pool.num_free:
            lo = mid
        else:
            hi = mid - 1
    return lo


def waiting_head_blocked(sched: Scheduler) -> bool:
    """Whether the head of the waiting queue stays waiting through every step in which each running request
    decodes one token, until one of them finishes (or a request arrives, or anything is swapped).

    What admission needs - a sequence slot, token budget, free blocks above the watermark (for the whole prompt
    under `scheduler_reserve_full_isl`), prefix hits - only shrinks while decodes allocate and evict and nobody
    finishes, so the head refused now is refused then. (The blocks decodes register hold generated tokens, keyed
    per request in count-only runs, so they never become the head's hits.) The budget it would get is what the
    decodes leave (`mixed`) or the whole budget (`prefill_first`: its prefill step is tried first, and waiting
    requests are not tried again after decodes are scheduled). The check is the scheduler's own (`_admission`,
    the gate's `fits_whole`, then the KV manager's `can_allocate`). The caller checks that something waits and
    nothing is swapped out.

    With prefix tiers below the GPU the argument fails - a decode's eviction demotes a block the head's lookup
    then promotes back (touching its GPU hits), so each step's lookup moves blocks - and the head never counts
    as blocked: the fast path still runs the stretches in which nothing waits."""
    if getattr(sched.kv, "tiers", None):
        return False
    request = sched.waiting.peek()
    budget = sched.config.max_num_batched_tokens
    if not sched._prefill_first:
        budget -= len(sched.running)
    if budget <= 0:
        return True
    plan = sched._admission(request, budget)
    if plan is None:
        return True
    reserve = sched._reserve()
    if sched._full_isl and not sched.kv.fits_whole(request, plan[0], reserve):
        return True
    return not sched.kv.can_allocate(request, plan[1], plan[0], reserve)


def _blocks_needed(sched: Scheduler, k: int) -> int:
    bs = sched.block_size
    return sum(_new_blocks(r.num_computed_tokens, min(k, r.max_tokens - r.num_output_tokens), bs)
               for r in sched.running)


def _new_blocks(pos: int, n: int, bs: int) -> int:
    """Blocks a request with `pos` tokens computed opens while writing positions pos .. pos+n-1: one at every
    multiple of bs among them."""
    return (pos + n - 1) // bs - (pos - 1) // bs


def advance_decode(sched: Scheduler, k: int, usage: list[float] | None = None) -> list[tuple[int, Request]]:
    """Apply k pure-decode cycles at once (k from `decode_horizon`). Returns the requests that finished, each
    with the step (0-based) it finished in, in the order `update()` would have finished them. `usage`, when
    given, receives the KV usage while each step runs (after its allocations, before its completions)."""
    if k <= 0:
        return []
    running = sched.running
    pool = getattr(sched.kv, "pool", None)
    bs = sched.block_size
    registering = pool is not None and pool.enable_caching
    events = []  # see `_block_events`
    for idx, request in enumerate(running):
        n = min(k, request.max_tokens - request.num_output_tokens)  # its steps in the stretch
        pos = request.num_computed_tokens  # before the stretch
        request.num_computed_tokens = pos + n
        request.num_output_tokens += n
        # `_block_events` only for a request whose stretch opens or fills a block (a short stretch often neither)
        if pool is not None and ((pos - 1) // bs != (pos + n - 1) // bs or (pos + n) // bs != pos // bs):
            _block_events(events, idx, pos, n, bs, registering and request.block_keys is not None)
        if request.num_output_tokens >= request.max_tokens:
            events.append((n - 1, UPDATE, idx, FINISH, 0))
    events.sort()
    result, finished = UpdateOutput(), []
    kv = sched.kv
    tables, ids = kv.tables, kv.block_ids
    # Usage changes only at events: count allocations (all from the empty stack), re-read it after completions.
    now, recorded = kv.usage(), 0  # `recorded`: steps whose usage is in `usage`
    used, total = (pool.num_used, pool.num_blocks) if pool is not None else (0, 1)
    for t, phase, idx, kind, j in events:
        # A schedule-time event in step t closes steps < t; an update closes step t (SCHEDULE = 0, UPDATE = 1).
        if usage is not None and recorded < t + phase:
            usage.extend([now] * (t + phase - recorded))
            recorded = t + phase
        request = running[idx]
        if kind == ALLOCATE:
            block = pool.allocate()
            tables[request.request_id].append(block)
            ids[request.request_id].append(block.block_id)
            used += 1
            now = used / total  # as BlockPool.usage() computes it
        elif kind == REGISTER:
            block = tables[request.request_id][j]
            if block.key is None:
                pool.register(block, request.block_keys.key(j))
            request.num_hashed_blocks = j + 1
        else:
            sched._finish(request, "length", result)
            finished.append((t, request))
            now = kv.usage()
            used = pool.num_used if pool is not None else 0
    if usage is not None and recorded < k:
        usage.extend([now] * (k - recorded))
    if finished:
        sched.running = [r for r in running if r.status is RequestStatus.RUNNING]
    sched.step_id += k
    sched.stats.num_steps += k
    return finished


def _block_events(events: list, idx: int, pos: int, n: int, bs: int, registering: bool) -> None:
    """Append (step, phase, running index, kind, logical block) for every allocation and registration of running
    request `idx`, which had `pos` tokens computed and runs n steps."""
    # Step t writes position pos + t; a new block is allocated whenever that position starts one.
    for start in range(-(-pos // bs) * bs, pos + n, bs):
        events.append((start - pos, SCHEDULE, idx, ALLOCATE, start // bs))
    if registering:
        # Step t computes up to pos + t + 1 tokens; block e // bs - 1 fills (and is keyed when the step is
        # scheduled) when e = pos + t + 1.
        for end in range((pos // bs + 1) * bs, pos + n + 1, bs):
            events.append((end - pos - 1, SCHEDULE, idx, REGISTER, end // bs - 1))
