"""k decode steps at once: the scheduler's fast-forward of a pure-decode stretch, for count-only runs.

`horizon`, then `advance`: k whole cycles of `schedule()` + `update()` at once, when every running request is a plain
decode in its steady shape (table of cdiv(pos, b) blocks, every full block keyed) and nothing else can happen: no
arrival (the caller bounds k by the next one), nothing swapped out, no rejection to report, no allocation failure (the
free blocks, empty plus cached, cover every allocation of the stretch; blocks a completion frees only add to them),
and either nobody waiting or a waiting head that cannot be admitted before the first completion (a backlog:
`Admission.head_blocked`). Nothing in a stretch reads the prefix cache (admissions are excluded), so evicting inside
it changes nothing but the blocks' fate, which the replay reproduces. A step's registrations and evictions all precede
its end, so a cache-aware router reading the cache at an arrival during the stretch's last step sees what it would see
step by step. The keys a stretch registers are new to the cache (positions never computed), so where nothing watches
registrations their order does not matter: each request's are then made in one call, before its completion or after
the replay (`advance`)::

    step        0    1    2    3    4
    request a   ▪    ▪    ▪    ▪    ▪      allocate (maybe evict) / register / finish events, replayed sorted
    request b   ▪    ▪    ✓

The stretch's allocations, registrations and completions are one decode step's effects (`decode_steps`),
made k times over and replayed there in the order stepping makes them (`DecodeSteps.replay`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.engine.core.decode_events import FINISH, UPDATE, Event, block_events
from kvplan.engine.core.decode_steps import DecodeSteps
from kvplan.engine.core.outputs import UpdateOutput

if TYPE_CHECKING:
    from mypy_extensions import i64  # native 64-bit locals in the compiled build (no tag checks); int when interpreted

    from kvplan.engine.core.request import Request


class DecodeStretch:
    """The scheduler's decode stretches (see the module), owned by one `Scheduler` beside its `DecodeSteps`, whose
    replay applies them and whose cache constants it keeps (the pool, the one group of a paged cache, the block
    size as a shift)."""

    __slots__ = ("block_shift", "group", "pool", "sched", "steps")

    def __init__(self, steps: DecodeSteps) -> None:
        self.steps = steps
        self.sched = steps.sched
        self.pool = steps.pool
        self.group = steps.group
        self.block_shift: i64 = steps.block_shift

    def horizon(self, limit: int, least: int = 1) -> int:
        """Largest k <= limit for which `advance(k)` is exact; 0 when no fast path applies, or when that k is below
        `least` (the scan then stops at the first request that bounds it below)."""
        sched = self.sched
        # (speculative decoding: a step's length depends on acceptance)
        if (limit < max(least, 1) or not sched.running or sched.swapped or sched.has_rejections
                or sched.remote.admission_due() or sched.spec_steps is not None):
            return 0
        backlog = len(sched.waiting) > 0
        if backlog and not sched.admissions.head_blocked():
            return 0  # an admission is due
        if sched.windowed or len(sched.running) > sched.max_num_batched_tokens:  # windows release
            return 0
        if backlog:
            # the first completion ends the stretch (below): one due before `least` steps rules it out, found by a
            # pass reading two counts per request before the full one (with a backlog, most asks end here)
            fewest: i64 = least
            for request in sched.running:
                if request.max_tokens - request.num_output_tokens < fewest:
                    return 0
        pool = self.pool
        bs: i64 = sched.block_size
        shift: i64 = self.block_shift
        registering = pool is not None and pool.enable_caching
        longest: i64 = 0
        shortest: i64 = limit
        steps: i64 = limit  # (`limit` as a native int, for the per-request sum below)
        needed: i64 = 0  # new blocks for `limit` steps (the same as for k, as no request runs longer)
        for request in sched.running:  # once per running request per stretch: properties and helpers inlined
            pos: i64 = request.num_computed_tokens
            output: i64 = request.num_output_tokens
            # a plain decode, as `schedule_leading` takes one (output 0: the prompt's last token, a prefill)
            if output == 0 or request.token_ids is not None or request.prompt_len + output - pos != 1:
                return 0  # the engine samples real tokens (stop tokens possible); only count-only runs qualify
            if request.n > 1 and not request.forked:
                return 0
            remaining: i64 = request.max_tokens - output
            if remaining > longest:
                longest = remaining
            if remaining < shortest:
                shortest = remaining
            if pool is None:
                continue  # contiguous reservation: decode never allocates
            table = request.kv_table
            assert table is not None  # a paged cache's running request holds its table
            block: i64 = pos >> shift if shift >= 0 else pos // bs  # pos // bs (the other block numbers follow)
            inside = pos != block * bs  # pos % bs != 0: its next write goes into a block it holds
            # (no holes: a cache that releases blocks mid-request never takes the decode fast path)
            # (only a forked request can share the block it writes next: see `schedule_leading`)
            if len(table) != block + inside or (request.forked and inside
                                                and table[block].ref_cnt > 1):  # type: ignore[union-attr]
                return 0  # the next write needs copy-on-write (or the table is not in its steady decode shape)
            if registering and request.block_keys is not None and request.num_hashed_blocks != block:
                return 0
            # `_new_blocks(pos, min(limit, remaining), bs)`: (pos - 1) // bs is `block` less one on a boundary
            last: i64 = pos + (steps if steps < remaining else remaining) - 1
            needed += (last >> shift if shift >= 0 else last // bs) - block + (not inside)
        k = min(limit, longest)  # past the longest remaining output nobody is left to step
        if backlog:
            k = min(k, shortest)  # the first completion frees a slot and blocks: the head may then be admitted
        if k < least:
            return 0
        if pool is None or needed <= pool.num_free:
            return k  # the common case: free blocks are plentiful
        lo, hi = 0, k  # new blocks needed grows with k: find the largest k served by the free blocks
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._blocks_needed(mid) <= pool.num_free:
                lo = mid
            else:
                hi = mid - 1
        return lo if lo >= least else 0

    def _blocks_needed(self, k: int) -> int:
        """New blocks the running requests open in k steps (each `_new_blocks` over its steps; a typed loop: the
        search in `horizon` asks a dozen times, over hundreds of requests)."""
        bs: i64 = self.sched.block_size
        steps: i64 = k
        needed: i64 = 0
        for request in self.sched.running:
            remaining: i64 = request.max_tokens - request.num_output_tokens
            needed += _new_blocks(request.num_computed_tokens, steps if steps < remaining else remaining, bs)
        return needed

    def advance(self, k: int, usage: list[float] | None = None) -> list[tuple[int, Request]]:
        """Apply k pure-decode cycles at once (k from `horizon`). Returns the requests that finished, each with
        the step (0-based) it finished in, in the order `update()` would have finished them. `usage`, when given,
        receives the KV usage while each step runs (after its allocations, before its completions)."""
        if k <= 0:
            return []
        sched = self.sched
        running = sched.running
        pool = self.pool
        bs: i64 = sched.block_size
        shift: i64 = self.block_shift
        caching = pool is not None and pool.enable_caching
        # Where nothing watches registrations or evictions (no prefix tier, no eviction policy that notes when a
        # block is keyed), a request's registrations are made in one call - before its completion, or after the
        # replay - instead of one event per block: a stretch keys only blocks its decodes fill, past every key the
        # request held (those positions were never computed), so each key is new to the cache and its
        # registration commutes with every allocation, eviction, completion and other registration of the
        # stretch; it needs only its block allocated, and must precede its release.
        deferred = (caching and pool is not None and pool.spill is None
                    and not pool.registrations_watched)
        keying: list[Request] = []  # the requests whose registrations wait for the replay's end (`deferred`)
        events: list[Event] = []
        finished_at: list[int] = []  # (their places in `running`, for `drop_finished`)
        for idx, request in enumerate(running):
            n: i64 = request.max_tokens - request.num_output_tokens  # its steps in the stretch: this, or k if fewer
            finishes = n <= k
            if not finishes:
                n = k
            pos: i64 = request.num_computed_tokens  # before the stretch
            request.num_computed_tokens = pos + n
            request.num_output_tokens += n
            # `block_events` only for a request whose stretch opens or fills a block (a short stretch often neither):
            # the block numbers of positions pos - 1, pos, pos + n - 1 and pos + n (shifts where bs is a power of two)
            if pool is not None:
                before: i64 = (pos - 1) >> shift if shift >= 0 else (pos - 1) // bs
                at: i64 = pos >> shift if shift >= 0 else pos // bs
                last: i64 = (pos + n - 1) >> shift if shift >= 0 else (pos + n - 1) // bs
                after: i64 = (pos + n) >> shift if shift >= 0 else (pos + n) // bs
                if before != last or after != at:
                    keyed = caching and request.block_keys is not None
                    block_events(events, idx, pos, n, -(-pos // bs) * bs, request.num_hashed_blocks, bs,
                                  keyed and not deferred)
                    if keyed and deferred and not finishes and after > request.num_hashed_blocks:
                        keying.append(request)
            if finishes:  # its output budget is reached in the stretch's step n - 1
                events.append((n - 1, UPDATE, idx, FINISH, 0))
                finished_at.append(idx)
        finished = self.steps.replay(events, _sorted_order(events), usage, k, UpdateOutput(), deferred)
        group = self.group
        for request in keying:  # (by the one group, the manager itself, as in `DecodeSteps.replay`)
            assert group is not None
            group.commit(request, request.num_computed_tokens)
        if finished:
            sched.drop_finished(finished_at, new_list=True)  # (the replica stamps the stretch on the old list)
        sched.count_steps(k)
        return finished


def _sorted_order(events: list[Event]) -> list[int]:
    """The places of `events` in sorted order, where they were appended request by request in running order, each
    request's allocations before its registrations and at most one event of a kind per step (`_block_events`, then
    its completion): ties of (step, phase) are then already in (running index, kind, block) order, so a sort of
    ints by (step, phase) and place gives the tuples' order (comparing tuples took several times longer)."""
    shift = len(events).bit_length()
    keys = [((event[0] * 2 + event[1]) << shift) | i for i, event in enumerate(events)]
    keys.sort()
    mask = (1 << shift) - 1
    return [key & mask for key in keys]


def _new_blocks(pos: i64, n: i64, bs: i64) -> i64:
    """Blocks a request with `pos` tokens computed opens while writing positions pos .. pos+n-1: one at every
    multiple of bs among them."""
    return (pos + n - 1) // bs - (pos - 1) // bs
