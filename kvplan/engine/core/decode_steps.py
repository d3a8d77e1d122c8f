"""One decode step, applied to one step or to k at once: the scheduler's decode fast paths for count-only runs.

A *plain decode* is a running request generating its next token: count-only (no token ids, so no stop token), one
token pending past its prompt, n = 1 or already forked, its next write into no shared block. Its step's effects -
a new block when its position starts one, the keys of the block it fills, and one more token with the finish at
its output budget - are made here in one place (`decode_events.block_events`, then `replay`, in the events'
order: the order the general loop makes them in) whether one step or k are applied. Two entry points use it:

* bulk (`DecodeMode.BULK`: `schedule_leading`, then `update`) - in a step that also prefills or admits (the step
  after every arrival under load) the *leading* run of plain decodes in `running` is scheduled as one list,
  `SchedulerOutput.decodes`, ahead of the general loop, so their allocations, registrations and completions keep
  their places before everything else in the step::

      running:  [d d d d d d d | p d D]       d: plain decode, p: anything else (a prefill chunk, a recompute, a
                 └── bulk ───┘  └ general loop ┘      copy-on-write, an n > 1 prompt about to fork), D: a plain
                                   (d: bulk)          decode opening or filling a block

  The run ends before a decode that needs a block when none is free (the general loop preempts for it), so each
  of its allocations succeeds as it would in the general loop. Behind the run, the general loop hands each plain
  decode whose step opens no block and fills none back to the bulk (`schedule_inline`: the decodes admitted
  behind a long prompt still in its chunks); touching no block, its place among the loop's allocations does not
  matter, and each scheduled item records how many bulk decodes come before it (`decodes_before`), so that
  `update()` and the simulator keep running order. The rest of the step may still have to preempt: a victim
  among the bulk decodes (any victim policy but vLLM's FCFS one can pick a request scheduled earlier in the
  step) is taken out of `out.decodes` again, as the general loop's would be out of `out.scheduled`
  (`GroupPreemption._unschedule`). Most of a run is *quiet* from one step to the next: a decode's step opens a
  block or fills one to key once in a block's worth of steps. So `update` leaves the next step the run as it
  stays (the finished dropped), the places of the requests whose next step is not quiet (`Request.quiet_until`,
  set where `schedule_leading` last checked a request), and the others' sums; `schedule_leading` then checks only
  those places and takes the rest by their sums, in the step right after that update and with the run still in
  place.
* fast-forward - k whole cycles of `schedule()` + `update()` at once, in a pure-decode stretch
  (`decode_stretch`), replayed here.

Sink+window and hybrid caches use neither (their requests release blocks mid-request).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, cast

from kvplan.engine.core.decode_events import ALLOCATE, REGISTER, SCHEDULE, Event, allocations_before_finish
from kvplan.engine.core.outputs import SchedulerOutput, UpdateOutput
from kvplan.engine.core.request import RUNNING, Request

if TYPE_CHECKING:
    from mypy_extensions import i64  # native 64-bit locals in the compiled build (no tag checks); int when interpreted

    from kvplan.engine.core.block_pool import KVBlock
    from kvplan.engine.core.scheduler import Scheduler



class DecodeMode(enum.Enum):
    """How `Scheduler.schedule` steps decodes - what differs between a token-sampling and a count-only run."""

    PER_REQUEST = "per_request"  # every request through the general loop (the live engine samples real tokens)
    BULK = "bulk"  # count-only runs (the simulator): the leading plain decodes as one list (see the module)


class DecodeSteps:
    """The scheduler's decode stepping (see the module), owned by one `Scheduler` and working on its public
    state; it keeps only the cache's constants (its pool, the one group's block tables of a paged cache, and the
    block size as a shift when it is a power of two)."""

    __slots__ = ("block_shift", "bulk_step", "group", "lead_blocks", "lead_context", "pool", "quiet_blocks",
                 "quiet_context", "quiet_count", "quiet_last", "quiet_longest", "quiet_marks", "quiet_step", "sched",
                 "tracking")

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        kv = sched.kv
        self.pool = kv.pool  # None: a reservation cache, whose decodes never allocate
        self.group = kv.groups[0] if len(kv.groups) == 1 else None  # the tables a paged cache's decodes extend
        # (one group is a whole paged cache, which keeps each table on its request too: the paths below read it)
        assert self.group is None or self.group.tables_on_requests
        # log2 of a power-of-two block size, else -1: the per-request block numbers below are then shifts (x >> s
        # is x // 2**s for every int), where the compiled build's // calls a helper (about 20 instructions)
        bs = sched.block_size
        self.block_shift: i64 = bs.bit_length() - 1 if bs & (bs - 1) == 0 else -1
        # The quiet run (see `update`): the first `quiet_count` requests of `running`, the last `quiet_last`, as
        # the last bulk update left them for step `quiet_step` (the next one's id); `quiet_marks` the places of
        # those whose step is not quiet, and the others' sums then (Σ of computed tokens, of their // block_size,
        # and their max)
        self.quiet_step: i64 = -1
        self.quiet_count: i64 = 0
        self.quiet_last: Request | None = None
        self.quiet_marks: list[int] = []
        self.quiet_context: i64 = 0
        self.quiet_blocks: i64 = 0
        self.quiet_longest: i64 = 0
        self.lead_context: i64 = 0  # the last leading run's sums, as scheduled (what `update` starts the above from)
        self.lead_blocks: i64 = 0
        # Quiet runs are kept only across consecutive bulk steps (`tracking`: this step's run follows the last
        # one's, `bulk_step` the step after that), where the next step is likely bulk too; a run between
        # stretches (the step after an arrival, under light load) would pay for one never used
        self.bulk_step: i64 = -1
        self.tracking = False

    # -- one step: the leading plain decodes of a mixed step -----------------------------------------------
    def schedule_leading(self, out: SchedulerOutput, budget: int) -> int:
        """Schedule the leading plain decodes of `running` (at most `budget`) into `out.decodes`, allocating
        and registering their blocks in running order; returns how many (0: the general loop schedules all)."""
        sched = self.sched
        if sched.windowed:
            return 0
        running, pool = sched.running, self.pool
        bs: i64 = sched.block_size
        shift: i64 = self.block_shift
        registering = sched.keys_wanted
        count: i64 = 0
        new: i64 = 0
        context: i64 = 0  # `out.decode_sums`, summed here while each request is at hand
        blocks: i64 = 0
        longest: i64 = 0
        free: i64 = pool.num_free if pool is not None else 0
        events: list[Event] = []  # of the few that open a block or fill one in this step
        # (an index loop, as a native int: the compiled build's list access is then direct; over a Python int it
        # takes the generic path, about twice the cost per request)
        scan: i64 = min(len(running), budget)
        # The requests the last step's update() found quiet (`update`) would pass every check below and allocate
        # and register nothing: only their sums are needed, which it left. Valid for the step right after it, with
        # the run still in place (since that update only an abort can have taken a request out of `running`, and
        # taking one out of the run moves its last one); its marked requests go through the checks.
        quiet: i64 = 0
        if (self.quiet_step == sched.step_id - 1 and 0 < self.quiet_count <= scan
                and running[self.quiet_count - 1] is self.quiet_last):
            quiet = self.quiet_count
            context, blocks, longest = self.quiet_context, self.quiet_blocks, self.quiet_longest
        self.quiet_step = -1
        marks = self.quiet_marks
        tracking = self.bulk_step == sched.step_id - 1
        marked: i64 = 0  # the marks passed
        i: i64 = 0
        while i < scan:
            if i < quiet:  # on to the next marked request, or past the quiet run
                i = marks[marked] if marked < len(marks) else quiet
                marked += 1
                count = i
                if i == quiet:
                    continue
            request = running[i]
            pos: i64 = request.num_computed_tokens
            output: i64 = request.num_output_tokens
            # A decode has one token pending past its prompt: pos == prompt + output - 1 with output >= 1 (output 0
            # would be the prompt's last token)
            if (output == 0 or pos != request.prompt_len + output - 1 or request.token_ids is not None
                    or (request.n > 1 and not request.forked)):
                break
            # the block its token goes into (a new one where pos is a multiple of bs)
            block: i64 = pos >> shift if shift >= 0 else pos // bs
            if pool is not None:
                # `block_events(events, count, pos, 1, held, request.num_hashed_blocks, bs, registering)`, inlined
                # (once per running request per step): its one step's allocation, then its registration. Off a
                # block boundary its table is not read: the block it writes also holds position pos - 1, computed,
                # so the table has it (no holes: a cache that releases blocks mid-request never takes this path)
                # and nothing is allocated - unless it is forked. Only a fork shares a block a request still writes
                # (a prefix hit is a full block below its computed tokens), so only a forked request can need
                # copy-on-write.
                if pos == block * bs or request.forked:
                    table = request.kv_table
                    assert table is not None  # a paged cache's running request holds its table
                    held: i64 = len(table) * bs
                    if pos < held:
                        if request.forked and table[block].ref_cnt != 1:  # type: ignore[union-attr]
                            break  # copy-on-write first: the general loop's case
                    elif pos == held:
                        if new == free:
                            break  # no block left for it: the general loop preempts for it
                        new += 1
                        events.append((0, SCHEDULE, count, ALLOCATE, block))
                    else:
                        break
                if registering and pos + 1 >= (request.num_hashed_blocks + 1) * bs:
                    events.append((0, SCHEDULE, count, REGISTER, (pos + 1) // bs - 1))
            if tracking:
                # Its steps are quiet up to its next block boundary and the position whose step fills its next
                # block to key (a forked one's never: it may share the block it writes). A registration made now
                # only moves the latter on, and is followed by a boundary, so the registrations it knows of do.
                # (A request in a quiet run was last checked in a tracking step: the run is noted only after one.)
                edge: i64 = (block + 1) * bs
                hashed: i64 = request.num_hashed_blocks
                if request.forked:
                    edge = 0
                elif registering and (hashed + 1) * bs - 1 < edge:
                    edge = (hashed + 1) * bs - 1
                request.quiet_until = edge
            count += 1
            context += pos
            blocks += block
            if pos > longest:
                longest = pos
            i += 1
        if count < quiet:  # stopped at a marked request: the sums are those of the requests before it
            context = blocks = longest = 0
            for j in range(count):
                pos = running[j].num_computed_tokens
                context += pos
                blocks += pos >> shift if shift >= 0 else pos // bs
                if pos > longest:
                    longest = pos
        self.tracking = tracking
        if count == 0:
            return 0
        if events:
            # (in order: all in step 0, appended in running order; `new` of them allocate, and none finishes)
            self.replay(events, None, None, 0, None, allocations=new)
        out.decodes = running[:count]
        out.decode_context, out.decode_blocks, out.decode_longest = context, blocks, longest
        self.lead_context, self.lead_blocks = context, blocks
        self.bulk_step = sched.step_id
        out.leading_decodes = count
        out.num_batched_tokens += count
        return count

    def schedule_inline(self, out: SchedulerOutput, request: Request) -> bool:
        """Schedule `request`, met by the general loop behind the leading run, into `out.decodes` when it is a
        plain decode whose step opens no block and fills none (no allocation, copy-on-write or registration, so
        that its place among the loop's allocations does not matter); False: the general loop schedules it."""
        pos = request.num_computed_tokens
        output = request.num_output_tokens
        bs = self.sched.block_size
        # a plain decode, as `schedule_leading` takes one, off a block boundary and not forked (which could share
        # the block it writes), its write not filling a block it would key
        if (output == 0 or pos != request.prompt_len + output - 1 or request.token_ids is not None
                or request.n > 1 or request.forked or pos % bs == 0
                or (self.sched.keys_wanted and pos + 1 >= (request.num_hashed_blocks + 1) * bs)):
            return False
        if not out.decodes:  # the first bulk decode (or the first since a victim emptied them): new sums
            out.decode_context = out.decode_blocks = out.decode_longest = 0
            out.decode_sums_known = True
        if out.decode_sums_known:  # (else a victim left them: they stay unknown)
            out.decode_context += pos
            out.decode_blocks += pos // bs
            if pos > out.decode_longest:
                out.decode_longest = pos
        out.decodes.append(request)
        out.num_batched_tokens += 1
        return True

    def update(self, decodes: list[Request], start: i64, stop: i64, result: UpdateOutput, leading: int,
               finished_at: list[int]) -> None:
        """`update()` for the bulk decodes decodes[start:stop]: one token each, output budgets finished (their full
        blocks were registered when they were scheduled). The index of each that finishes below `leading` (the
        leading run, each at its index in `running`) goes to `finished_at`.

        Passing over the leading run, it leaves the next step's `schedule_leading` the *quiet run*: the requests
        that stay in it (in their places once the finished ones are dropped), the places of those whose next step
        is not quiet (`Request.quiet_until`: it opens a block, fills one to key, or is a forked request's), and
        the sums of the others then - from the run's sums as scheduled, less the requests that left it or are
        marked, plus one token each."""
        sched = self.sched  # (its `finish` called as a method: a bound method in a local is a Python call)
        shift: i64 = self.block_shift
        bs: i64 = sched.block_size
        # (the whole leading run is updated by the first call: nothing is scheduled before it)
        noting: i64 = leading if self.tracking and start == 0 and stop >= leading and not sched.windowed else 0
        left: i64 = 0  # the run's requests that leave it (finished, aborted)
        lost: i64 = 0  # the computed tokens, as scheduled, of those and of the marked ones
        lost_blocks: i64 = 0
        longest: i64 = 0
        marks = self.quiet_marks  # (read by the step's `schedule_leading`, which is over)
        if noting:
            marks.clear()
        # (over the list, not by index: the compiled build reads a list's item inline where it iterates it, and
        # calls a bounds-checking helper per index; most calls take the whole list, from 0)
        i: i64 = -1
        for request in decodes:
            i += 1
            if i < start:
                continue
            if i >= stop:
                break
            pos: i64 = request.num_computed_tokens
            if request.status is RUNNING:  # (else aborted after schedule())
                request.num_computed_tokens = pos + 1
                output: i64 = request.num_output_tokens + 1
                request.num_output_tokens = output
                if output < request.max_tokens:
                    if i < noting:
                        if pos + 1 >= request.quiet_until:
                            marks.append(i - left)  # its place once the requests that left before it are dropped
                            lost += pos
                            lost_blocks += pos >> shift if shift >= 0 else pos // bs
                        elif pos + 1 > longest:
                            longest = pos + 1
                    continue
                sched.finish(request, "length", result)
                if i < leading:
                    finished_at.append(i)
            if i < noting:  # it leaves the run: finished, or aborted
                left += 1
                lost += pos
                lost_blocks += pos >> shift if shift >= 0 else pos // bs
        if left < noting:
            kept: i64 = noting - left
            last: i64 = noting - 1
            while decodes[last].status is not RUNNING:
                last -= 1
            self.quiet_count, self.quiet_last = kept, decodes[last]
            # each quiet request one token further on, its block the same (no boundary before `quiet_until`)
            self.quiet_context = self.lead_context - lost + kept - len(marks)
            self.quiet_blocks, self.quiet_longest = self.lead_blocks - lost_blocks, longest
            self.quiet_step = sched.step_id

    # -- the one replay of decode steps' effects ---------------------------------------------------------------
    def replay(self, events: list[Event], order: list[int] | None, usage: list[float] | None, steps: int,
               result: UpdateOutput | None, key_at_finish: bool = False,
               allocations: int = -1) -> list[tuple[int, Request]]:
        """Apply `events` in sorted order (see the module), which `order` lists their places in (None: they are in
        it); returns the (step, request) completions. `usage` (when given) gets the KV usage of each of `steps`
        steps while it runs. `key_at_finish`: a completing request's full blocks are registered just before it
        finishes (`advance`'s deferred registrations). `allocations`: how many ALLOCATE events there are, where
        the caller counted them and none completes a request (-1: counted here)."""
        sched, pool = self.sched, self.pool
        running, kv = sched.running, sched.kv
        group = self.group
        ids = group.block_ids if group is not None else {}
        id_objects = pool.id_objects if pool is not None else []
        bs = sched.block_size
        finished = []
        # Usage changes only at events: count allocations (all from the empty stack), re-read it after completions.
        now, recorded = kv.usage() if usage is not None else 0.0, 0  # `recorded`: steps whose usage is in `usage`
        used, total = (pool.num_used, pool.num_blocks) if pool is not None else (0, 1)
        # The allocations up to the next completion in one call (`allocate_many`: the blocks n calls of `allocate`
        # return) where nobody is told of evictions or registrations (no prefix tier): only a completion frees
        # blocks, and the registrations between them key held blocks, which no allocation can take - so only the
        # order of those calls would differ
        batched = pool is not None and pool.spill is None and pool.on_register is None
        taken: list[KVBlock] = []  # the blocks of the allocations before the next completion, handed out in order
        next_taken = 0
        for e in range(len(events)):
            t, phase, idx, kind, j = events[e if order is None else order[e]]
            # A schedule-time event in step t closes steps < t; an update closes step t (SCHEDULE = 0, UPDATE = 1).
            if usage is not None and recorded < t + phase:
                usage.extend([now] * (t + phase - recorded))
                recorded = t + phase
            request = running[idx]
            if kind == ALLOCATE:
                # (block events exist only with a pool; asserted, not ignored: an ignored None case made `block`
                # partly Any, and the compiled build then read its id and indexed `id_objects` generically)
                assert pool is not None
                block: KVBlock
                if not batched:
                    block = pool.allocate()
                else:
                    if next_taken == len(taken):  # the first since a completion: take all up to the next
                        taken = pool.allocate_many(allocations if allocations >= 0
                                                   else allocations_before_finish(events, order, e))
                        next_taken = 0
                    block = taken[next_taken]
                    next_taken += 1
                table = request.kv_table
                assert table is not None  # a paged cache's running request holds its table
                table.append(block)
                cast("list[object]", ids[request.request_id]).append(id_objects[block.block_id])  # (its int object)
                used += 1
                now = used / total  # as BlockPool.usage() computes it
            elif kind == REGISTER:  # block j fills: keyed (with any full block not yet keyed)
                # by the one group, the manager itself (no hybrid cache takes a fast path), called as the paged
                # manager it is (a call through `kv` first picks among the managers' classes)
                assert group is not None and group is kv
                group.commit(request, (j + 1) * bs)
            else:
                if key_at_finish:
                    assert group is not None and group is kv  # (as for REGISTER)
                    group.commit(request, request.num_computed_tokens)
                sched.finish(request, "length", result)
                finished.append((t, request))
                now = kv.usage()
                used = pool.num_used if pool is not None else 0
        if usage is not None and recorded < steps:
            usage.extend([now] * (steps - recorded))
        return finished

