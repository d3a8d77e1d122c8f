"""Preemption of sequence groups, all or nothing (the scheduler's half that frees memory).

A sequence group is a request and the siblings forked from it (n > 1 samples, beams); its members share blocks
(the prompt, and whatever they had in common when forked). A victim is preempted with every running member of its
group, so a group never runs half-resident:

* swap - the group's distinct blocks go to the CPU pool once, and the members are queued as adjacent entries of
  `swapped`; swap-in brings them back together with their sharing intact (`KVCacheManager.swap_out/swap_in`);
* recompute - every member's blocks are freed and the members return to the head of the waiting queue in group
  order. Their shared blocks are gone, so from then on each is a group of its own: a member that alone could run
  to completion is then never preempted together with siblings that cannot fit beside it. Beams are the
  exception: they advance in lockstep, so they stay one group and are re-admitted together (`beam_group`).

A swapped group that could not come back even into an empty cache (members' shared partial tail blocks need
copy-on-write copies on top of what they held) drops its CPU copy and is recomputed the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.engine.core.request import Request, RequestStatus

if TYPE_CHECKING:
    from kvplan.engine.core.outputs import SchedulerOutput
    from kvplan.engine.core.scheduler import Scheduler


class GroupPreemption:
    """The scheduler's preemption (see the module), owned by one `Scheduler` and working on its public state.
    Invariant kept: a sequence group is resident all together or not at all, and members of a swapped group are
    adjacent in `swapped`, in group order."""

    __slots__ = ("sched",)

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched

    @staticmethod
    def group_of(request: Request, members: list[Request]) -> list[Request]:
        """`request`'s sequence group among `members` (in their order); a lone request is its own group."""
        if not request.grouped:
            return [request]
        key = request.group
        return [r for r in members if r.group == key]

    def swapped_head_group(self) -> list[Request]:
        """The group at the head of `swapped` (its members are adjacent)."""
        swapped = self.sched.swapped
        head = swapped[0]
        if not head.grouped:
            return [head]
        group = []
        for request in swapped:
            if request.group != head.group:
                break
            group.append(request)
        return group

    def preempt(self, victim: Request, out: SchedulerOutput) -> int:
        """Preempt `victim` with its whole sequence group; returns the budget they give back if they were
        already scheduled in this step."""
        sched = self.sched
        group = self.group_of(victim, sched.running)
        refund, undone = 0, set[tuple[int, int]]()
        for request in group:
            sched.stop_running(request)
            request.num_preemptions += 1
            if request.spec_token_ids:  # drafts of a sequence that is no longer computed (vLLM drops them too)
                request.spec_token_ids = []
            sched.stats.num_preemptions += 1
            out.preempted.append(request.request_id)
            refund += self._unschedule(request, out, undone)
        for request in group:  # each will look its blocks up again (once re-admitted, or swapped back in)
            sched.kv.publish(request)
        if sched.config.preemption_mode == "swap":
            copies = sched.kv.swap_out(group)
            if copies is not None:
                source = {dst: src for src, dst in undone}  # their copy-on-write never ran: read the source
                out.swap_out.extend((source.get(gpu, gpu), cpu) for gpu, cpu in copies)
                for request in group:
                    request.status = RequestStatus.SWAPPED
                    sched.swapped.append(request)
                sched.stats.num_swap_outs += len(group)
                return refund
        for request in group:
            sched.kv.free(request)
        self._requeue_group(group)
        return refund

    def _unschedule(self, request: Request, out: SchedulerOutput, undone: set) -> int:
        """Take `request` out of this step's batch, if it is in it; returns its tokens. The blocks its scheduling
        registered in the prefix cache lose their keys again: this step will not compute them. (vLLM's FCFS
        victim is the last running request, never one already scheduled in the step; other victim policies can
        pick one.)"""
        kv = self.sched.kv
        for i, decode in enumerate(out.decodes):  # a bulk-scheduled decode (`decode_steps`): one token
            if decode is request:
                kv.unregister_since(request, request.num_computed_tokens // kv.block_size)
                out.num_batched_tokens -= 1
                del out.decodes[i]
                out.decode_sums_known = False  # (they counted it)
                # nor do the ones left line up with `running` (`leading_decodes`), even should a decode joining
                # from behind (`schedule_inline`) start new sums once this empties the list
                out.leading_decodes = 0
                for item in out.scheduled:  # the items behind it have one bulk decode fewer before them
                    if item.decodes_before > i:
                        item.decodes_before -= 1
                return 1 + self.sched.draft_slots
        for i, item in enumerate(out.scheduled):
            if item.request is request:
                kv.unregister_since(request, item.start_pos // kv.block_size)
                out.num_batched_tokens -= item.num_new_tokens
                if item.copies:
                    undone.update(item.copies)
                    out.copies = [c for c in out.copies if c not in undone]
                del out.scheduled[i]
                return item.num_new_tokens + self.sched.draft_slots  # (its drafting rows: vLLM's input budget)
        return 0

    def schedule_swapped(self, out: SchedulerOutput, budget: int) -> int:
        """Swap groups back in, first come first served, while their sequences, budget and blocks (with the
        watermark while anything runs) fit; returns the budget left. A group that could not come back even into
        an empty cache is recomputed instead."""
        sched = self.sched
        kv, swapped = sched.kv, sched.swapped
        while swapped and budget > 0:
            group = self.swapped_head_group()
            if not sched.has_seq_room(sum(r.seq_slots for r in group)):
                break
            chunks, left = [], budget
            for request in group:
                chunks.append(sched.chunk(request.num_tokens_to_compute, left))
                left -= chunks[-1]
            if not any(chunks):
                break
            if kv.num_free_blocks - kv.swap_in_cost(group, chunks) < sched.admission_reserve():
                if sched.running:
                    break  # room comes back as running requests finish
                self.recompute_swapped(group)  # could never come back, even into an empty cache
                continue
            for _ in group:
                swapped.popleft()
            out.swap_in.extend(kv.swap_in(group))
            for request, n in zip(group, chunks, strict=True):
                sched.start_running(request)
                if n:
                    copies = kv.allocate(request, n)
                    assert copies is not None  # `swap_in_cost` counted the blocks of every member's chunk
                    sched.emit(out, request, n, copies, 0)
            budget = left
        return budget

    def recompute_swapped(self, group: list[Request]) -> None:
        """Drop a swapped group's CPU copy and queue its members for recompute."""
        sched = self.sched
        for request in group:
            sched.swapped.remove(request)
            sched.kv.free(request)  # its CPU copy
        self._requeue_group(group)

    def _requeue_group(self, group: list[Request]) -> None:
        """Recompute: the members go back to the head of the waiting queue in group order, each a group of its
        own from now on (prefix caching may still share their prompt)."""
        for request in reversed(group):
            if len(group) > 1 and not request.beam:  # beams advance together: they stay one group
                request.group_id = request.request_id
            self.requeue_for_recompute(request)

    def requeue_for_recompute(self, request: Request) -> None:
        """Put a request that holds no blocks back at the head of the waiting queue, to compute from scratch."""
        sched = self.sched
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        sched.waiting.push_front(request)
        sched.stats.num_recomputes += 1
