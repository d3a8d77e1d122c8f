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

from collections import deque
from typing import TYPE_CHECKING

from kvplan.engine.core.request import Request, RequestStatus

if TYPE_CHECKING:
    from kvplan.engine.core.config import SchedulerConfig
    from kvplan.engine.core.kv_manager import KVCacheManager
    from kvplan.engine.core.metrics import SchedulerStats
    from kvplan.engine.core.outputs import SchedulerOutput
    from kvplan.engine.core.request_queue import FCFSQueue, PriorityQueue
    from kvplan.engine.core.reservation import ReservationAllocator


class GroupPreemption:
    """Mixed into `Scheduler`, whose state it works on."""

    config: SchedulerConfig
    kv: KVCacheManager | ReservationAllocator
    running: list[Request]
    swapped: deque[Request]
    waiting: FCFSQueue | PriorityQueue
    stats: SchedulerStats

    def _group_of(self, request: Request, members: list[Request]) -> list[Request]:
        """`request`'s sequence group among `members` (in their order); a lone request is its own group."""
        if not request.grouped:
            return [request]
        key = request.group
        return [r for r in members if r.group == key]

    def _swapped_head_group(self) -> list[Request]:
        head = self.swapped[0]
        if not head.grouped:
            return [head]
        group = []
        for request in self.swapped:  # a group's members are adjacent
            if request.group != head.group:
                break
            group.append(request)
        return group

    def _preempt(self, victim: Request, out: SchedulerOutput) -> int:
        """Preempt `victim` with its whole sequence group; returns the budget they give back if they were
        already scheduled in this step."""
        group = self._group_of(victim, self.running)
        refund, undone = 0, set()
        for request in group:
            self._stop_running(request)
            request.num_preemptions += 1
            self.stats.num_preemptions += 1
            out.preempted.append(request.request_id)
            refund += self._unschedule(request, out, undone)
        if self.config.preemption_mode == "swap":
            copies = self.kv.swap_out(group)
            if copies is not None:
                source = {dst: src for src, dst in undone}  # their copy-on-write never ran: read the source
                out.swap_out.extend((source.get(gpu, gpu), cpu) for gpu, cpu in copies)
                for request in group:
                    request.status = RequestStatus.SWAPPED
                    self.swapped.append(request)
                self.stats.num_swap_outs += len(group)
                return refund
        for request in group:
            self.kv.free(request)
        self._requeue_group(group)
        return refund

    def _unschedule(self, request: Request, out: SchedulerOutput, undone: set) -> int:
        """Take `request` out of this step's batch, if it is in it; returns its tokens. The blocks its scheduling
        registered in the prefix cache lose their keys again: this step will not compute them. (vLLM's FCFS
        victim is the last running request, never one already scheduled in the step; other victim policies can
        pick one.)"""
        for i, item in enumerate(out.scheduled):
            if item.request is request:
                self.kv.unregister_since(request, item.start_pos // self.kv.block_size)
                out.num_batched_tokens -= item.num_new_tokens
                if item.copies:
                    undone.update(item.copies)
                    out.copies = [c for c in out.copies if c not in undone]
                del out.scheduled[i]
                return item.num_new_tokens
        return 0

    def _recompute_swapped(self, group: list[Request]) -> None:
        for request in group:
            self.swapped.remove(request)
            self.kv.free(request)  # its CPU copy
        self._requeue_group(group)

    def _requeue_group(self, group: list[Request]) -> None:
        """Recompute: the members go back to the head of the waiting queue in group order, each a group of its
        own from now on (prefix caching may still share their prompt)."""
        for request in reversed(group):
            if len(group) > 1 and not request.beam:  # beams advance together: they stay one group
                request.group_id = request.request_id
            self._requeue_for_recompute(request)

    def _requeue_for_recompute(self, request: Request) -> None:
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        self.waiting.push_front(request)
        self.stats.num_recomputes += 1
