"""Beam-search groups: k sequences that advance in lockstep over shared, copy-on-write blocks.

A beam request is admitted as one sequence with n = k slots. Its members never get tokens from `update()`: a
member that has computed all its tokens waits (nothing left to schedule) until every member of its group has,
and then the caller - who holds the logits - decides the step with `advance_beams` or ends it with
`finish_beams`. Waiting is what lets a step's budget or a preemption split a group across model steps without
ever letting one beam run ahead of the others.

`advance_beams(members, plan)`: member j continues member `plan[j][0]`'s sequence with token `plan[j][1]`. A
member that is no beam's parent any more is pruned - its blocks are released - and its slot takes a fork of the
parent it was assigned, sharing every block; its first write into the shared partial tail block copies it
(copy-on-write, `KVCacheManager.allocate`)::

    step t:   beam0 ─[p0][p1][a·]        plan: 0 <- (0, x), 1 <- (0, y), 2 <- (2, z)
              beam1 ─[p0][p1][b·]              beam1 is pruned: [b·] released, [p0][p1][a·] shared
              beam2 ─[p0][p1][c·]        step t+1: beams 0 and 1 write into [a·]: beam1 copies it first

Liveness: a group is accepted only if all its beams fit an empty cache with no sharing at all (k times one
sequence's peak); a group preempted by recompute stays a group and is re-admitted all at once, only when every
member's whole recompute fits the free blocks, so a group never holds blocks while siblings it waits for can
never come in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.engine.core.kv_manager import cdiv
from kvplan.engine.core.outputs import SchedulerOutput, UpdateOutput
from kvplan.engine.core.request import Request, RequestStatus

if TYPE_CHECKING:
    from kvplan.engine.core.kv_interface import PrefixHits
    from kvplan.engine.core.scheduler import Scheduler


class BeamGroups:
    """The scheduler's beam-search groups (see the module), owned by one `Scheduler` and working on its public
    state. Invariant kept: no member of a group runs a token ahead of another."""

    __slots__ = ("sched",)

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched

    def advance(self, members: list[Request], plan: list[tuple[int, int]]) -> UpdateOutput:
        """One beam-search step for a group whose members have all computed their tokens (see the module).
        Before the first step the group is its head alone, and every beam's source is 0: it forks then."""
        self._check_waiting_group(members)
        sched = self.sched
        result = UpdateOutput()
        head = members[0]
        if not head.forked:
            if any(source != 0 for source, _ in plan):
                raise ValueError(f"beam group {head.request_id}: its first step can only continue the prompt")
            sched.updates.fork_after_prompt(head, [token for _, token in plan], result)
            return self._drop_finished(result)
        if len(plan) != len(members):
            raise ValueError(f"beam group {head.request_id}: {len(plan)} beams planned for {len(members)} members")
        moved = [(j, source) for j, (source, _) in enumerate(plan) if source != j]
        for j, source in moved:
            if plan[source][0] != source:
                raise ValueError(f"beam group {head.request_id}: member {j} continues member {source}, which "
                                 "itself continues another (a parent keeps its own sequence)")
            sched.kv.free(members[j])  # the pruned beam's blocks go back (shared ones lose a reference)
        for j, source in moved:
            members[j].continue_from(members[source])
            sched.kv.fork(members[source], members[j])
        for member, (_, token) in zip(members, plan, strict=True):
            sched.updates.append(member, token, result)
        return self._drop_finished(result)

    def finish(self, members: list[Request], reason: str) -> UpdateOutput:
        """End a beam group whose search is over (its hypotheses are the caller's), releasing every block."""
        self._check_waiting_group(members)
        result = UpdateOutput()
        for member in members:
            self.sched.finish(member, reason, result)
        return self._drop_finished(result)

    @staticmethod
    def ready(members: list[Request]) -> bool:
        """Whether every member of a beam group has computed all its tokens: the group's step can be decided."""
        return all(_waiting_for_step(member) for member in members)

    @staticmethod
    def _check_waiting_group(members: list[Request]) -> None:
        for member in members:
            if not _waiting_for_step(member):
                raise ValueError(f"beam member {member.request_id} is not waiting for its group's step "
                                 f"(status {member.status.name}, {member.num_tokens_to_compute} tokens to compute)")

    def _drop_finished(self, result: UpdateOutput) -> UpdateOutput:
        if result.finished:
            self.sched.drop_finished()
        return result

    def admit_group(self, head: Request, out: SchedulerOutput, budget: int) -> int | None:
        """Re-admit a beam group preempted by recompute, all of it or none: the budget left, or None when the
        sequence slots or the free blocks (every member's whole recompute, no sharing assumed) are not there."""
        sched = self.sched
        members = [r for r in sched.waiting if r.group == head.group]
        bs, kv = sched.block_size, sched.kv
        need = sum(cdiv(r.num_tokens, bs) for r in members)
        if not sched.has_seq_room(len(members)) or kv.num_free_blocks - need < sched.admission_reserve():
            return None
        for request in members:
            hits: PrefixHits = kv.find_cached_prefix(request)
            n = sched.chunk(request.num_tokens - len(hits) * bs, budget)  # may be 0: computed in later steps
            copies = kv.allocate(request, n, hits)
            sched.waiting.remove(request)
            kv.record_admission(request, len(hits))
            sched.start_running(request)
            if n:
                assert copies is not None  # `need` counted every member's whole recompute, nothing shared
                budget -= n
                sched.emit(out, request, n, copies, len(hits) * bs)
        return budget


def _waiting_for_step(member: Request) -> bool:
    return member.beam and member.status is RequestStatus.RUNNING and not member.num_tokens_to_compute
