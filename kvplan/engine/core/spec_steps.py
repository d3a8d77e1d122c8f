"""Speculative decoding in the scheduler (vLLM 0.34's `v1/core/sched/scheduler.py`), one component of it.

A step's cycle with speculative decoding on (`SchedulerConfig.speculative`):

1. after `update`, the engine (or the simulator) gives each running request its drafts for the next step,
   `Scheduler.set_drafts` (vLLM's `update_draft_token_ids`); drafts of a request that is still prefilling are
   dropped;
2. `schedule` gives a running request its verified pending tokens plus its drafts (`num_tokens_with_spec`),
   capped so that no position reaches `max_model_len` (`max_model_len - num_computed - 1`); the drafts that fit
   go into `ScheduledRequest.spec_token_ids`, the rest are trimmed, and the request's drafts are cleared;
   `allocate` is asked for `num_lookahead_tokens` more slots (a draft model writes its proposals' KV there),
   capped at `max_model_len` as vLLM's `allocate_slots` caps them; each scheduled request also takes
   `draft_slots` rows of the token budget (`input_budget` in vLLM), and a step stops scheduling when no more than
   `draft_slots` are left;
3. `update` (`verify`) takes what the verifier emitted - the accepted drafts and one bonus (or recovered) token,
   or in count-only runs just how many drafts were accepted - rolls the rejected drafts back out of
   `num_computed_tokens` (vLLM's rule) and appends the tokens one at a time with the length and stop checks, so a
   stop or the output budget inside the accepted run finishes the request and drops the rest.

KV of rejected drafts. vLLM frees nothing when drafts are rejected: the request keeps the blocks, its computed
count falls back, and the next step overwrites the rejected positions (their slots are reused). Blocks wholly
beyond the accepted length stay in the request's table and are reused the same way as it grows; they go back to
the pool when it finishes or is preempted. Only verified tokens are ever keyed in the prefix cache
(`Scheduler.emit` caps the keyed length at `num_tokens`, as vLLM's `allocate_slots` caches only up to
`request.num_tokens`).

What is not done: vLLM's `pad_spec_decode` (a request admitted with one token left is padded with placeholder
drafts to the batch's uniform width) exists to keep full CUDA graphs uniform; kvplan's runners capture no graphs
and its placeholders are always rejected, so admissions schedule the plain token. Swap-ins (kvplan's own; vLLM V1
has no swap) take neither lookahead slots nor draft rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from kvplan.engine.core.decode_steps import DecodeMode
from kvplan.engine.core.outputs import ScheduledRequest, UpdateOutput
from kvplan.engine.core.request import RUNNING, Request
from kvplan.engine.core.speculative import SpeculativeConfig
from kvplan.errors import ConfigError

if TYPE_CHECKING:
    from kvplan.engine.core.scheduler import Scheduler


class SpecSteps:
    """Speculative decoding's part of one `Scheduler` (see the module). Invariants: a request holds drafts only
    while RUNNING with every verified token but its last computed; `num_computed_tokens` never counts a rejected
    draft once `update` has run; `stats` counts every verification (`SchedulerStats.observe_draft`)."""

    __slots__ = ("config", "k", "lookahead", "max_model_len", "sched")

    def __init__(self, sched: Scheduler, config: SpeculativeConfig) -> None:
        self.sched = sched
        self.config = config
        self.k = config.num_speculative_tokens
        self.lookahead = config.num_lookahead_tokens
        self.max_model_len = sched.cache_config.max_model_len

    @staticmethod
    def of(sched: Scheduler) -> SpecSteps | None:
        """The component for `sched`'s configuration (None: speculative decoding off); it turns bulk decodes off
        (a step's length depends on acceptance). Refuses a cache whose blocks leave mid-request."""
        config = sched.config.speculative
        if config is None:
            return None
        if sched.windowed or sched.cache_config.allocator != "paged":
            raise ConfigError("scheduler.speculative_config: rolls rejected drafts back in place, which needs the "
                              "paged allocator without a sink+window cache or sliding-window layers; allowed: null "
                              "with this cache")
        budget = sched.max_num_batched_tokens
        if budget <= config.draft_slots:  # every scheduled request takes its drafting rows: none could ever run
            raise ConfigError(f"scheduler.max_num_batched_tokens: {budget} leaves no token once a request takes its "
                              f"{config.draft_slots} drafting row(s) ({config.method}); allowed: more than "
                              f"{config.draft_slots}")
        sched.decode_mode = DecodeMode.PER_REQUEST
        return SpecSteps(sched, config)

    def set_drafts(self, drafts: Mapping[str, Sequence[int]]) -> None:
        """Drafts for the next step, by request id (vLLM's `update_draft_token_ids`): finished or unknown requests
        and beam-search sequences are skipped, a request still prefilling gets none. (vLLM 0.34 refuses only
        min_p and logit_bias with speculative decoding, which kvplan has not; n > 1 samples get drafts once
        forked, each sequence verified with its own generator.)"""
        requests = self.sched.requests
        for request_id, tokens in drafts.items():
            request = requests.get(request_id)
            if request is None or request.status is not RUNNING or request.beam:
                continue  # (beam search advances one token per beam and step: vLLM's drafts never apply to it)
            if len(tokens) > self.k:
                raise ValueError(f"request {request_id}: {len(tokens)} drafts exceed num_speculative_tokens {self.k}")
            if request.num_computed_tokens < request.num_tokens - 1:  # a prefill chunk: it samples nothing
                request.spec_token_ids = []
                continue
            request.spec_token_ids = list(tokens)

    def drafting(self) -> list[Request]:
        """The running requests that take drafts for the next step, in running order: those whose next step
        samples a generated token (every computed token but the last), an n > 1 request once forked, no beam-search
        sequence - the ones `set_drafts` keeps drafts for. The engine proposes for these (the simulator draws
        their outcomes)."""
        return [r for r in self.sched.running
                if r.num_computed_tokens == r.num_tokens - 1 and (r.n == 1 or r.forked) and not r.beam]

    def cap(self, request: Request, n: int) -> int:
        """`n` scheduled tokens of a running request, capped so that no position reaches max_model_len."""
        return min(n, self.max_model_len - request.num_computed_tokens - 1)

    def slots(self, start: int, n: int) -> int:
        """Slots to allocate for `n` tokens written from position `start`: the lookahead slots too, up to
        max_model_len (vLLM's `allocate_slots`)."""
        return n + max(0, min(self.lookahead, self.max_model_len - start - n))

    def verify(self, item: ScheduledRequest, tokens: Sequence[int] | None, accepted: int | None,
               result: UpdateOutput) -> None:
        """Apply a step that verified `item.spec_token_ids`: `tokens` are what the verifier emitted (the accepted
        drafts, then the bonus or recovered token), or in count-only runs `accepted` says how many drafts were
        kept (`tokens` None)."""
        request = item.request
        drafts = len(item.spec_token_ids)
        if tokens is not None:
            accepted = len(tokens) - 1
        elif accepted is None:
            raise ValueError(f"request {request.request_id}: a count-only step verifying {drafts} drafts needs "
                             "`accepted` (drafts accepted per scheduled request)")
        if not 0 <= accepted <= drafts:
            raise ValueError(f"request {request.request_id}: {accepted} drafts accepted of {drafts} verified")
        if request.num_computed_tokens > 0:
            request.num_computed_tokens -= drafts - accepted
        self.sched.stats.observe_draft(drafts, accepted)
        result.spec[request.request_id] = (drafts, accepted)
        append = self.sched.updates.append
        for j in range(accepted + 1):
            append(request, tokens[j] if tokens is not None else None, result)
            if request.status is not RUNNING:  # a stop or the output budget inside the run: the rest is dropped
                return
