"""Plain-data descriptions of one scheduler step, consumed by the model runner (engine) or cost model (sim).

The runner executes a step in this order: `swap_out` (GPU -> CPU), `tier_transfers` (prefix tiers below the GPU,
in their own order: `tier_transfers`), `swap_in` (CPU -> GPU), `copies` (copy-on-write), then the forward pass over
`scheduled`. The order matters: the blocks a victim releases when it is swapped out may be reused in the same step
as copy-on-write or promotion destinations, so they are read first; a GPU block the step evicts is demoted (read)
before a swap-in, a copy or the forward pass overwrites it; and a swapped-in group shares its blocks again, so a
member's first write may copy a block that only the swap-in fills. (Swap-ins only happen in steps without
preemption, so they never meet a swap-out; promotions only at admissions, which also never meet a swap-out, and
into blocks no swap-in or copy of the step writes; a copy's source is in use, so no swap-in overwrites it.) A
victim preempted after it was scheduled in this step loses its copies; if it is swapped out, its swap-out reads
each copy's source instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvplan.engine.core.request import Request
from kvplan.engine.core.tier_transfers import TierTransfer

if TYPE_CHECKING:
    from mypy_extensions import i64  # native 64-bit fields in the compiled build; int when interpreted

    from kvplan.engine.core.remote_kv import KVLoad


@dataclass(slots=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int  # tokens computed for it in this step
    start_pos: int  # position of the first of them (= tokens already computed, prefix hits included)
    num_cached_tokens: int  # tokens served by the prefix cache at this admission (0 if already running)
    block_ids: list[int] | tuple[list[int], ...]  # the live block table (valid until the next schedule); a hybrid
    # cache: one per group (`kv_groups.GroupBlockIds`)
    samples: bool  # this step computes the request's last pending token, so a token is sampled
    is_decode: bool  # a one-token step on a generated token (everything else is prefill or recompute)
    copies: tuple[tuple[int, int], ...] = ()  # this request's copy-on-write pairs (also in SchedulerOutput)
    # speculative decoding: the drafts this step verifies, the last len() of its num_new_tokens (vLLM's
    # scheduled_spec_decode_tokens); a step that verifies drafts samples, at the last verified token and at each
    # draft
    spec_token_ids: Sequence[int] = ()
    # how many of the step's bulk decodes (`SchedulerOutput.decodes`) come before it in running order: its place
    # among them, which `update()` keeps (a bulk decode behind a prefill chunk goes after it)
    decodes_before: int = 0

    @property
    def request_id(self) -> str:
        return self.request.request_id


@dataclass(slots=True)
class SchedulerOutput:
    step_id: int
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    num_batched_tokens: int = 0
    copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) GPU blocks, copy-on-write
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (gpu, cpu)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (cpu, gpu)
    # the copies between the GPU and the tiers below it, in the order the core made them (tier_transfers)
    tier_transfers: list[TierTransfer] = field(default_factory=list)
    # (tier, GPU block) the promotions among them: prefix blocks copied up from a lower tier (prefix_tiers)
    promotions: list[tuple[str, int]] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (request id, reason)
    # Plain count-only decodes scheduled in bulk (one token each, in running order; each item of `scheduled` says
    # how many of them come before it); only under the scheduler's `DecodeMode.BULK` - the simulator's fast path
    # (see `decode_steps`).
    decodes: list[Request] = field(default_factory=list)
    # Σ, Σ of // block_size and max of `decodes`' computed tokens, taken as they were scheduled (`decode_sums`),
    # as native sums (a decode joining from behind adds to them: a tuple of boxed ints would be made each time)
    decode_context: i64 = 0
    decode_blocks: i64 = 0
    decode_longest: i64 = 0
    decode_sums_known: bool = True  # False once an entry of `decodes` is taken back out (a preemption victim)
    # how many of `decodes` lead `running` (`schedule_leading`'s run; the rest joined from behind), so that
    # decodes[i] is running[i] for each of them; 0 once a preemption victim is taken back out of `decodes`
    leading_decodes: int = 0
    # P/D, decode side: the receives to start, one per request that began waiting for remote KV (`remote_kv`)
    kv_loads: list[KVLoad] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled and not self.decodes

    @property
    def decode_sums(self) -> tuple[int, int, int] | None:
        """(Σ, Σ of // block_size, max) of `decodes`' computed tokens, taken as they were scheduled (the attention
        metadata a model runner builds for them: the simulator's cost model reads it, instead of visiting hundreds
        of requests again); None without bulk decodes, or once one is taken back out (a preemption victim)."""
        if not self.decodes or not self.decode_sums_known:
            return None
        return self.decode_context, self.decode_blocks, self.decode_longest

    def in_running_order(self) -> list[Request | ScheduledRequest]:
        """The step's batch in running order: each bulk decode (a `Request`) and each scheduled item, the bulk
        decodes each before the items behind them (`ScheduledRequest.decodes_before`)."""
        batch: list[Request | ScheduledRequest] = []
        done = 0
        for item in self.scheduled:
            batch.extend(self.decodes[done:item.decodes_before])
            done = max(done, item.decodes_before)
            batch.append(item)
        batch.extend(self.decodes[done:])
        return batch


@dataclass(slots=True)
class UpdateOutput:
    finished: list[Request] = field(default_factory=list)
    forked: list[Request] = field(default_factory=list)  # children created for n > 1 in this update
    released: dict[str, list[int]] = field(default_factory=dict)  # sink+window: request id -> block ids
    # P/D, prefill side: request id -> the block ids it finished holding for a remote decode to read (`remote_kv`)
    kv_sends: dict[str, list[int]] = field(default_factory=dict)
    # speculative decoding: request id -> (drafts verified, drafts accepted) for each request whose step verified
    # drafts (the replay records and the simulator's validation read it)
    spec: dict[str, tuple[int, int]] = field(default_factory=dict)
