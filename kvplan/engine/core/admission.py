"""Admission: whether, and with how many tokens, the waiting queue's head enters the running set.

The rule, in order (the scheduler's module describes why it keeps the scheduler live): a sequence slot for all of
its sequences; a prefix-cache lookup (`KVManager.find_cached_prefix`), then the tokens to compute now within the
budget (`Scheduler.chunk`); under `scheduler_reserve_full_isl`, blocks for its whole prompt beyond the hits
(`fits_whole`); then the blocks for this step with the watermark to spare while anything runs (`allocate`). The
queue is served in order: the first head refused ends the step's admissions. A beam group back from recompute is
admitted all at once or not at all (`beam_group`).

Prefill/decode disaggregation (`remote_kv`): requests holding blocks while they wait (their remote KV received
or arriving) are served before the queue; a head that receives its prompt's KV takes blocks for it and parks.

Cache-aware admission (vLLM 0.34's `cache_aware_admission_window` N and `_threshold` u): before a step's
admissions, once KV usage is at least u, the plain waiting requests (status WAITING, nothing computed) among the
first N of the queue are put in order of their cached prefix on the GPU, deepest first, ties by position; every
other request of the window keeps its slot, and the queue beyond the window is untouched (`reorder_window`).

LoRA (`lora`, vLLM's max_loras rule): a waiting request whose adapter would make the adapters of the running
requests (and of this step's admissions) exceed `max_loras` is skipped: set aside for the step, the requests
behind it still tried, and put back at its place afterwards. Base requests are never skipped, and without
adapters nothing here changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.engine.core.lora import lora_skipped, running_loras
from kvplan.engine.core.remote_kv import wants_remote_prefill
from kvplan.engine.core.request import Request, RequestStatus
from kvplan.engine.core.request_queue import FCFSQueue

if TYPE_CHECKING:
    from kvplan.engine.core.kv_interface import PrefixHits
    from kvplan.engine.core.outputs import SchedulerOutput
    from kvplan.engine.core.scheduler import Scheduler


class Admission:
    """The scheduler's admissions (see the module), owned by one `Scheduler` and working on its public state.
    Invariant kept: a request leaves `waiting` only with the blocks for its step allocated and its prefix hits
    taken."""

    __slots__ = ("sched",)

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched

    def plan(self, request: Request, budget: int) -> tuple[PrefixHits, int] | None:
        """(prefix hits, tokens to compute now) for admitting waiting `request` within `budget`, or None when
        sequence room or budget stops it (block room is `allocate`'s to decide)."""
        sched = self.sched
        if not sched.has_seq_room(request.seq_slots):
            return None
        hits = sched.kv.find_cached_prefix(request)
        n = sched.chunk(request.num_tokens - len(hits) * sched.block_size, budget)
        return (hits, n) if n else None

    def reorder_window(self) -> None:
        """Cache-aware admission's reordering of the queue's first `cache_aware_admission_window` requests (see
        the module); the caller checks that the window is on."""
        sched = self.sched
        waiting = sched.waiting
        assert isinstance(waiting, FCFSQueue)  # the window needs the fcfs policy (SchedulerConfig checks it)
        if len(waiting) < 2 or sched.kv.usage() < sched.config.cache_aware_admission_threshold:
            return
        head = waiting.head(sched.cache_aware_window)
        slots = [i for i, r in enumerate(head) if r.status is RequestStatus.WAITING and not r.num_computed_tokens]
        if len(slots) < 2:
            return
        cached = {i: sched.kv.num_cached_tokens(head[i]) for i in slots}
        order = sorted(slots, key=lambda i: (-cached[i], i))
        if order != slots:
            reordered = list(head)
            for slot, source in zip(slots, order, strict=True):
                reordered[slot] = head[source]
            waiting.replace_head(reordered)

    def schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        """Admit waiting requests in queue order while the rule lets the head in (see the module)."""
        sched = self.sched
        kv, waiting = sched.kv, sched.waiting
        if sched.remote.holding:
            left = sched.remote.admit_held(out, budget)
            if left is None:
                return
            budget = left
        if sched.cache_aware_window:
            self.reorder_window()
        admitted: dict[str, int] = {}  # this step's admissions and their tokens (an async load's reservation)
        rows, spec = sched.draft_slots, sched.spec_steps  # speculative decoding's budget rows and lookahead slots
        # LoRA (`lora`): the adapters running or admitted in this step, counted once a waiting adapter is met (a
        # queue of base requests never counts them); the requests skipped for max_loras, back in place after
        loras: set[int] | None = None
        skipped: list[Request] = []
        while len(waiting) and budget > rows:
            request = waiting.peek()
            if request.lora_id:
                if loras is None:
                    loras = running_loras(sched.running)
                if lora_skipped(request.lora_id, loras, sched.config.max_loras):
                    skipped.append(waiting.pop())
                    continue
                loras.add(request.lora_id)  # admitted or not, the set already holds it or has room: only a
                # request admitted below keeps it, and one refused ends the loop
            if request.kv_transfer_params is not None and wants_remote_prefill(request):
                # a decode-side request: it takes a sequence slot only once its KV has arrived, and no budget
                if not sched.has_seq_room(request.seq_slots) or not sched.remote.park(request, out, admitted):
                    break
                waiting.pop()
                continue
            if request.beam and request.grouped:  # a beam group back from recompute: all of it or none
                left = sched.beams.admit_group(request, out, budget)
                if left is None:
                    break
                budget = left
                if loras is not None and request.lora_id:
                    loras.add(request.lora_id)
                continue
            plan = self.plan(request, budget - rows)
            if plan is None:
                break
            hits, n = plan
            cached_tokens = len(hits) * sched.block_size
            reserve = sched.admission_reserve()
            if sched.reserve_full_isl and not kv.fits_whole(request, hits, reserve):
                break
            slots = n if spec is None else spec.slots(cached_tokens or request.num_computed_tokens, n)
            copies = kv.allocate(request, slots, hits, reserve)
            if copies is None:
                break
            waiting.pop()
            kv.record_admission(request, len(hits))
            if request.status is RequestStatus.WAITING:
                request.num_cached_tokens = cached_tokens
            sched.start_running(request)
            budget -= n + rows
            sched.emit(out, request, n, copies, cached_tokens)
            admitted[request.request_id] = n
            if loras is not None and request.lora_id:
                loras.add(request.lora_id)
        for request in reversed(skipped):  # vLLM's prepend_requests: at the head, in their order
            waiting.push_front(request)

    def head_blocked(self) -> bool:
        """Whether the head of the waiting queue stays waiting through every step in which each running request
        decodes one token, until one of them finishes (or a request arrives, or anything is swapped): what lets
        the decode fast path run with a backlog (`decode_steps`).

        What admission needs - a sequence slot, token budget, free blocks above the watermark (for the whole
        prompt under `scheduler_reserve_full_isl`), prefix hits - only shrinks while decodes allocate and evict and
        nobody finishes, so the head refused now is refused then. (The blocks decodes register hold generated
        tokens, keyed per request in count-only runs, so they never become the head's hits.) The budget it would
        get is what the decodes leave (`mixed`) or the whole budget (`prefill_first`: its prefill step is tried
        first, and waiting requests are not tried again after decodes are scheduled). The check is the rule's own
        (`plan`, the gate's `fits_whole`, then the KV manager's `can_allocate`). The caller checks that something
        waits and nothing is swapped out.

        With prefix tiers below the GPU the argument fails - a decode's eviction demotes a block the head's lookup
        then promotes back (touching its GPU hits), so each step's lookup moves blocks - and so it does under
        cache-aware admission with two or more waiting: every step re-sorts the window by cached depths that the
        decodes' evictions and the usage threshold change, and a request it brings forward may fit where the head
        did not. Then the head never counts as blocked: the fast path still runs the stretches in which nothing
        waits. Nor does a head with cached hits admitted by its first chunk (`scheduler_reserve_full_isl` off): an
        eviction that breaks its prefix at an early block (FIFO evicts by age, not from a chain's tail) turns its
        later hits into evictable room, and a budget-sized first chunk may then fit where the hits' one new block
        did not."""
        sched = self.sched
        kv = sched.kv
        if kv.tiers or (sched.cache_aware_window and len(sched.waiting) > 1):
            return False
        request = sched.waiting.peek()
        if request.kv_transfer_params is not None or sched.remote.holding:
            return False  # P/D admissions are not planned here: never counted as blocked
        if request.lora_id and lora_skipped(request.lora_id, running_loras(sched.running), sched.config.max_loras):
            return len(sched.waiting) == 1  # skipped for max_loras: a request behind it may still be admitted
        sched.refresh_prefill_cap()  # the cap the next `schedule` plans with, not the last one's
        budget = sched.max_num_batched_tokens
        if not sched.prefill_first:
            budget -= len(sched.running)
        if budget <= 0:
            return True
        # A head whose every block fits beside the watermark (with a block to spare) is admitted by the next step
        # whatever its prefix hits: not blocked, without looking them up - the common case right after an arrival.
        pool = kv.pool
        if (pool is not None and len(kv.groups) == 1 and sched.has_seq_room(request.seq_slots)
                and (sched.chunked_prefill or request.num_tokens <= budget)
                and pool.num_free > kv.groups[0].request_blocks(request.num_tokens)  # (the one group: the cache)
                + sched.admission_reserve()):
            return False
        plan = self.plan(request, budget)
        if plan is None:
            return True
        if not sched.reserve_full_isl and len(plan[0]):
            return False  # an eviction could break its hits (the docstring says how)
        reserve = sched.admission_reserve()
        if sched.reserve_full_isl and not kv.fits_whole(request, plan[0], reserve):
            return True
        return not kv.can_allocate(request, plan[1], plan[0], reserve)
