"""The scheduler's second half: `update(step, sampled)` applies a step's results once the model has run it.

It advances the computed counts, appends the sampled tokens (count-only when `sampled` is None, as in the
simulator), forks n > 1 requests into siblings after their prompt, releases blocks that left the sink+window,
and finishes requests at their output budget or a stop token, freeing their blocks (tail first). Beam-search
groups get their tokens from `advance_beams` instead (`beam_group`); the bulk decodes of a count-only step
(`SchedulerOutput.decodes`) are the decode stepping's (`decode_steps`).

It registers nothing in the prefix cache: full blocks were registered when the step was scheduled (as vLLM
does), so a request admitted later in the same step could already hit them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.engine.core.outputs import SchedulerOutput, UpdateOutput
from kvplan.engine.core.request import RUNNING, Request, child_id

if TYPE_CHECKING:
    from kvplan.engine.core.scheduler import Scheduler


class StepUpdate:
    """The scheduler's `update` (see the module), owned by one `Scheduler` and working on its public state.
    Invariant kept: after an update, `running` holds only RUNNING requests, and a request that finished holds
    no block."""

    __slots__ = ("sched", "windowed")

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.windowed = sched.windowed  # a constant of the cache: read once, not per request

    def update(self, out: SchedulerOutput, sampled: list | None = None,
               accepted: list[int] | None = None) -> UpdateOutput:
        """Apply a step's results (`Scheduler.update`)."""
        sched = self.sched
        result = UpdateOutput()
        decodes, steps = out.decodes, sched.decode_steps
        done = 0  # bulk decodes updated: in running order, each before the items behind it
        # The leading run's places in `running` are its indices (unless a victim left it): where every request
        # this update finishes is one of them, `drop_finished` is told their places (`finished_at`)
        leading = out.leading_decodes
        finished_at: list[int] = []
        windowed = self.windowed
        for i, item in enumerate(out.scheduled):
            if item.decodes_before > done:
                steps.update(decodes, done, item.decodes_before, result, leading, finished_at)
                done = item.decodes_before
            request = item.request
            if request.status is not RUNNING:
                continue  # aborted after schedule()
            request.num_computed_tokens += item.num_new_tokens
            if not item.samples:
                if windowed:
                    self._slide_window(request, result)
                continue
            if request.beam:  # its token waits for the whole group's step (`advance_beams`)
                continue
            if item.spec_token_ids:  # a speculative step: its drafts verified (`spec_steps`)
                sched.spec_steps.verify(item, sampled[i] if sampled is not None else None,  # type: ignore[union-attr]
                                        accepted[i] if accepted is not None else None, result)
                continue
            token = sampled[i] if sampled is not None else None
            if request.n > 1 and not request.forked:
                self.fork_after_prompt(request, token, result)
            else:
                self.append(request, token, result)
        if done < len(decodes):
            steps.update(decodes, done, len(decodes), result, leading, finished_at)
        if result.finished:
            sched.drop_finished(finished_at if len(finished_at) == len(result.finished) else None)
        return result

    def append(self, request: Request, token: int | None, result: UpdateOutput) -> None:
        """Give a running request its sampled token (None: count-only) and finish it at its output budget or a
        stop token; the caller drops finished requests from `running`."""
        if request.token_ids is None:
            request.num_output_tokens += 1  # append_token, inlined for count-only runs (the simulator)
        else:
            request.append_token(token)
        if request.num_output_tokens >= request.max_tokens:
            self.sched.finish(request, "length", result)
        elif token is not None and token in request.stop_token_ids:
            self.sched.finish(request, "stop", result)
        elif self.windowed:
            self._slide_window(request, result)

    def fork_after_prompt(self, request: Request, tokens: list | None, result: UpdateOutput) -> None:
        """Fork an n > 1 request that just sampled its n first tokens into its n sequences, each with its token."""
        tokens = tokens if tokens is not None else [None] * request.n
        if len(tokens) != request.n:
            raise ValueError(f"request {request.request_id}: expected {request.n} sampled tokens, got {len(tokens)}")
        sched = self.sched
        sched.num_running_seqs -= request.n - 1  # its samples' slots pass to the children
        request.forked = True
        children = [sched.fork(request, child_id(request.request_id, j)) for j in range(1, request.n)]
        result.forked.extend(children)
        for member, token in zip([request, *children], tokens, strict=True):
            if member.status is RUNNING:
                self.append(member, token, result)

    def _slide_window(self, request: Request, result: UpdateOutput) -> None:
        released = self.sched.kv.release_outside_window(request)
        if released:
            result.released[request.request_id] = released
