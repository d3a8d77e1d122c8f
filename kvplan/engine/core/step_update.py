"""The scheduler's second half: `update(step, sampled)` applies a step's results once the model has run it.

It advances the computed counts, appends the sampled tokens (count-only when `sampled` is None, as in the
simulator), forks n > 1 requests into siblings after their prompt, releases blocks that left the sink+window,
and finishes requests at their output budget or a stop token, freeing their blocks (tail first). Beam-search
groups get their tokens from `advance_beams` instead (`beam_group`).

It registers nothing in the prefix cache: full blocks were registered when the step was scheduled (as vLLM
does), so a request admitted later in the same step could already hit them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.engine.core.bulk_decode import update_decodes
from kvplan.engine.core.outputs import SchedulerOutput, UpdateOutput
from kvplan.engine.core.request import Request, RequestStatus, child_id

if TYPE_CHECKING:
    from kvplan.engine.core.kv_manager import KVCacheManager
    from kvplan.engine.core.metrics import SchedulerStats
    from kvplan.engine.core.reservation import ReservationAllocator

RUNNING = RequestStatus.RUNNING


class StepUpdate:
    """Mixed into `Scheduler`, whose state it works on."""

    kv: KVCacheManager | ReservationAllocator
    running: list[Request]
    requests: dict[str, Request]
    stats: SchedulerStats
    num_running_seqs: int
    _windowed: bool

    def update(self, out: SchedulerOutput, sampled: list | None = None) -> UpdateOutput:
        """Apply a step's results. `sampled[i]` is the token for `out.scheduled[i]` (ignored where it samples
        nothing; a list of n tokens for an n > 1 request finishing its prompt); None runs count-only."""
        result = UpdateOutput()
        if out.decodes:
            update_decodes(self, out, result)
        for i, item in enumerate(out.scheduled):
            request = item.request
            if request.status is not RUNNING:
                continue  # aborted after schedule()
            request.num_computed_tokens += item.num_new_tokens
            if not item.samples:
                if self._windowed:
                    self._slide_window(request, result)
                continue
            if request.beam:  # its token waits for the whole group's step (`advance_beams`)
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
        if request.token_ids is None:
            request.num_output_tokens += 1  # append_token, inlined for count-only runs (the simulator)
        else:
            request.append_token(token)
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
        self.num_running_seqs -= request.n - 1  # its samples' slots pass to the children
        request.forked = True
        children = [self.fork(request, child_id(request.request_id, j)) for j in range(1, request.n)]
        result.forked.extend(children)
        for member, token in zip([request, *children], tokens, strict=True):
            if member.status is RUNNING:
                self._append(member, token, result)

    def _slide_window(self, request: Request, result: UpdateOutput) -> None:
        released = self.kv.release_outside_window(request)
        if released:
            result.released[request.request_id] = released

    def _finish(self, request: Request, reason: str, result: UpdateOutput) -> None:
        """End a running request; the caller drops finished requests from `running`."""
        self.kv.free(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        del self.requests[request.request_id]
        self.num_running_seqs -= request.seq_slots
        self.stats.num_finished += 1
        result.finished.append(request)
