"""Continuous-batching scheduler: one `schedule()` / `update()` cycle per model step.

`schedule()` spends a token budget (`max_num_batched_tokens`) on, in order:

1. running requests - each gets all its pending tokens, or what is left of the budget (chunked prefill); when a
   block cannot be had, a victim (by `victim_policy`) is preempted until it can, by recompute (blocks freed,
   request back to the head of the waiting queue) or swap (blocks copied to the CPU pool);
2. swapped requests, swapped back in first-come first-served - only if nobody was preempted in this step;
3. waiting requests (FCFS or priority) - only if nobody was preempted and nobody is still swapped out, after a
   prefix-cache lookup, keeping `watermark` of the blocks free for running requests.

`update(step, sampled)` advances the computed counts, appends the sampled tokens (count-only when `sampled` is
None, as in the simulator), forks n > 1 requests into siblings after their prompt, registers full blocks in the
prefix cache, releases blocks that left the sink+window, and finishes requests at their output budget or a stop
token, freeing their blocks. Requests that could never fit, even alone in an empty cache, are rejected at
`add_request` and reported in the next step.
"""

from __future__ import annotations

from collections import deque
from itertools import count

from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.kv_manager import KVCacheManager
from engine.core.metrics import SchedulerStats, kv_snapshot, memory_breakdown
from engine.core.outputs import ScheduledRequest, SchedulerOutput, UpdateOutput
from engine.core.request import Request, RequestStatus, attach_block_keys
from engine.core.request_queue import make_queue
from engine.core.reservation import ReservationAllocator
from engine.core.victims import pick_victim

RUNNING = RequestStatus.RUNNING


def make_kv_manager(config: CacheConfig) -> KVCacheManager | ReservationAllocator:
    return KVCacheManager(config) if config.allocator == "paged" else ReservationAllocator(config)


class Scheduler:
    def __init__(self, cache: CacheConfig | None = None, config: SchedulerConfig | None = None) -> None:
        self.cache_config = cache or CacheConfig()
        self.config = config or SchedulerConfig()
        self.kv = make_kv_manager(self.cache_config)
        self.block_size = self.cache_config.block_size
        self.waiting = make_queue(self.config.policy)
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.requests: dict[str, Request] = {}  # live (not finished, aborted or rejected) requests
        self.stats = SchedulerStats()
        self.step_id = 0
        self._seq = count()
        self._rejected: list[tuple[str, str]] = []
        self._keys_wanted = self.cache_config.enable_prefix_caching and self.cache_config.allocator == "paged"
        self._windowed = self.cache_config.windowed  # only then can update() release blocks mid-request

    # -- requests ------------------------------------------------------------------------------------------
    def add_request(self, request: Request) -> bool:
        """Queue a request; False (and reported in the next step's `rejected`) if it can never run."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already live")
        request.seq = next(self._seq)
        if self._keys_wanted and request.block_keys is None:
            attach_block_keys(request, self.block_size)
        reason = self.rejection_reason(request)
        if reason is not None:
            request.status = RequestStatus.ABORTED
            request.finish_reason = f"rejected: {reason}"
            self._rejected.append((request.request_id, reason))
            self.stats.num_rejected += 1
            return False
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self.waiting.push(request)
        return True

    def rejection_reason(self, request: Request) -> str | None:
        """Why `request` could never run under this configuration, or None."""
        limit, budget = self.cache_config.max_model_len, self.config.max_num_batched_tokens
        if request.final_len > limit:
            return (f"prompt ({request.prompt_len}) + max_tokens ({request.max_tokens}) = {request.final_len} "
                    f"exceeds max_model_len {limit}")
        if not self.config.enable_chunked_prefill and request.prompt_len > budget:
            return (f"prompt of {request.prompt_len} tokens exceeds max_num_batched_tokens {budget} and chunked "
                    "prefill is off")
        return self.kv.admission_error(request, min(request.prompt_len, budget))

    def abort(self, request_id: str) -> bool:
        request = self.requests.pop(request_id, None)
        if request is None:
            return False
        if request.status is RUNNING:
            self.running.remove(request)
        elif request.status is RequestStatus.SWAPPED:
            self.swapped.remove(request)
        else:
            self.waiting.remove(request)
        self.kv.free(request)
        request.status = RequestStatus.ABORTED
        request.finish_reason = "abort"
        return True

    def fork(self, parent: Request, child_id: str) -> Request:
        """A running sibling of `parent` sharing all its blocks (n > 1 sampling, beam search). Call between
        `update()` and the next `schedule()`."""
        if child_id in self.requests:
            raise ValueError(f"request id {child_id!r} is already live")
        child = parent.spawn(child_id)
        child.seq = next(self._seq)
        parent.children_ids.append(child_id)
        self.requests[child_id] = child
        if self.kv.fork(parent, child):
            self.running.append(child)
        else:  # a reservation allocator found no room for the child: it recomputes later
            self._requeue_for_recompute(child)
            self.stats.num_preemptions += 1
        return child

    def has_unfinished(self) -> bool:
        return bool(self.running or self.swapped or len(self.waiting))

    @property
    def num_unfinished(self) -> int:
        return len(self.running) + len(self.swapped) + len(self.waiting)

    # -- schedule ------------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(self.step_id)
        self.step_id += 1
        self.stats.num_steps += 1
        if self._rejected:
            out.rejected, self._rejected = self._rejected, []
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        if not out.preempted:
            budget = self._schedule_swapped(out, budget)
            if not self.swapped:
                self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        chunked, kv = self.config.enable_chunked_prefill, self.kv
        for request in list(self.running):
            if budget <= 0:
                break
            if request.status is not RUNNING:
                continue  # preempted as a victim earlier in this loop
            pending = request.num_tokens_to_compute
            n = min(pending, budget)
            if n < pending and not chunked:
                continue
            copies = kv.allocate(request, n)
            while copies is None:
                victim = pick_victim(self.config.victim_policy, self.running)
                budget += self._preempt(victim, out)
                if victim is request:
                    break
                copies = kv.allocate(request, n)
            if copies is None:
                continue
            budget -= n
            self._emit(out, request, n, copies, 0)
        return budget

    def _schedule_swapped(self, out: SchedulerOutput, budget: int) -> int:
        chunked, kv, limit = self.config.enable_chunked_prefill, self.kv, self.config.max_num_seqs
        while self.swapped and budget > 0 and len(self.running) < limit:
            request = self.swapped[0]
            pending = request.num_tokens_to_compute
            n = min(pending, budget)
            if n < pending and not chunked:
                break
            if kv.num_free_blocks - kv.swap_in_cost(request, n) < self.cache_config.watermark_blocks:
                break
            self.swapped.popleft()
            out.swap_in.extend(kv.swap_in(request))
            copies = kv.allocate(request, n)
            request.status = RUNNING
            self.running.append(request)
            budget -= n
            self._emit(out, request, n, copies, 0)
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        chunked, kv, limit = self.config.enable_chunked_prefill, self.kv, self.config.max_num_seqs
        reserve = self.cache_config.watermark_blocks
        while len(self.waiting) and budget > 0 and len(self.running) < limit:
            request = self.waiting.peek()
            hits = kv.find_cached_prefix(request)
            cached_tokens = len(hits) * self.block_size
            pending = request.num_tokens - cached_tokens
            n = min(pending, budget)
            if n < pending and not chunked:
                break
            copies = kv.allocate(request, n, hits, reserve)
            if copies is None:
                break
            self.waiting.pop()
            kv.record_admission(request, len(hits))
            if request.status is RequestStatus.WAITING:
                request.num_cached_tokens = cached_tokens
            request.status = RUNNING
            self.running.append(request)
            budget -= n
            self._emit(out, request, n, copies, cached_tokens)

    def _emit(self, out: SchedulerOutput, request: Request, n: int, copies: tuple, cached_tokens: int) -> None:
        start = request.num_computed_tokens
        samples = start + n == request.num_tokens
        out.scheduled.append(ScheduledRequest(
            request, n, start, cached_tokens, self.kv.block_ids[request.request_id], samples,
            samples and n == 1 and start >= request.prompt_len, copies))
        out.num_batched_tokens += n
        if copies:
            out.copies.extend(copies)

    def _preempt(self, victim: Request, out: SchedulerOutput) -> int:
        """Preempt `victim`; returns the budget it gives back if it was already scheduled in this step."""
        self.running.remove(victim)
        victim.num_preemptions += 1
        self.stats.num_preemptions += 1
        out.preempted.append(victim.request_id)
        refund, undone = 0, ()
        for i, item in enumerate(out.scheduled):
            if item.request is victim:
                refund, undone = item.num_new_tokens, item.copies
                out.num_batched_tokens -= refund
                out.copies = [c for c in out.copies if c not in undone]
                del out.scheduled[i]
                break
        if self.config.preemption_mode == "swap":
            copies = self.kv.swap_out(victim)
            if copies is not None:
                source = {dst: src for src, dst in undone}  # its copy-on-write never ran: read the source
                out.swap_out.extend((source.get(gpu, gpu), cpu) for gpu, cpu in copies)
                victim.status = RequestStatus.SWAPPED
                self.swapped.append(victim)
                self.stats.num_swap_outs += 1
                return refund
        self.kv.free(victim)
        self._requeue_for_recompute(victim)
        return refund

    def _requeue_for_recompute(self, request: Request) -> None:
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        self.waiting.push_front(request)
        self.stats.num_recomputes += 1

    # -- update --------------------------------------------------------------------------------------------
    def update(self, out: SchedulerOutput, sampled: list | None = None) -> UpdateOutput:
        """Apply a step's results. `sampled[i]` is the token for `out.scheduled[i]` (ignored where it samples
        nothing; a list of n tokens for an n > 1 request finishing its prompt); None runs count-only."""
        result = UpdateOutput()
        kv = self.kv
        for i, item in enumerate(out.scheduled):
            request = item.request
            if request.status is not RUNNING:
                continue  # aborted after schedule()
            request.num_computed_tokens += item.num_new_tokens
            if not item.samples:
                kv.commit(request)
                if self._windowed:
                    self._slide_window(request, result)
                continue
            token = sampled[i] if sampled is not None else None
            if request.n > 1 and not request.forked:
                self._fork_after_prompt(request, token, result)
            else:
                self._append(request, token, result)
        if result.finished:
            self.running = [r for r in self.running if r.status is RUNNING]
        return result

    def _append(self, request: Request, token: int | None, result: UpdateOutput) -> None:
        request.append_token(token)
        self.kv.commit(request)
        if request.num_output_tokens >= request.max_tokens:
            self._finish(request, "length", result)
        elif token is not None and token in request.stop_token_ids:
            self._finish(request, "stop", result)
        elif self._windowed:
            self._slide_window(request, result)

    def _fork_after_prompt(self, request: Request, tokens: list | None, result: UpdateOutput) -> None:
        tokens = tokens if tokens is not None else [None] * request.n
        if len(tokens) != request.n:
            raise ValueError(f"request {request.request_id}: expected {request.n} sampled tokens, got {len(tokens)}")
        request.forked = True
        children = [self.fork(request, f"{request.request_id}#{j}") for j in range(1, request.n)]
        result.forked.extend(children)
        for member, token in zip([request, *children], tokens, strict=True):
            if member.status is RUNNING:
                self._append(member, token, result)

    def _slide_window(self, request: Request, result: UpdateOutput) -> None:
        released = self.kv.release_outside_window(request)
        if released:
            result.released[request.request_id] = released

    def _finish(self, request: Request, reason: str, result: UpdateOutput) -> None:
        self.kv.free(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        del self.requests[request.request_id]
        self.stats.num_finished += 1
        result.finished.append(request)

    def kv_metrics(self) -> dict[str, float | int]:
        """vLLM-named gauges and counters plus the memory breakdown at this instant."""
        live = [*self.running, *self.swapped]
        breakdown = memory_breakdown(self.kv, live)
        return {**kv_snapshot(self.kv, self.stats), **breakdown.as_dict(),
                "kv_token_utilization": breakdown.kv_token_utilization}

    # -- cache control -------------------------------------------------------------------------------------
    def reset_prefix_cache(self) -> int:
        """Forget every cached free block; returns how many were dropped."""
        pool = getattr(self.kv, "pool", None)
        return pool.drop_cache() if pool is not None else 0
