"""Continuous-batching scheduler: one `schedule()` / `update()` cycle per model step.

`schedule()` spends a token budget (`max_num_batched_tokens`) on, in order:

1. running requests - each gets all its pending tokens, or what is left of the budget (chunked prefill); when a
   block cannot be had, a victim (by `victim_policy`) is preempted with its whole sequence group until it can,
   by recompute (blocks freed, requests back to the head of the waiting queue) or swap (blocks copied to the CPU
   pool, the group all or nothing);
2. swapped groups, swapped back in first-come first-served - only if nobody was preempted in this step;
3. waiting requests (FCFS or priority) - only if nobody was preempted and nobody is still swapped out, after a
   prefix-cache lookup.

Under `schedule="prefill_first"` a step first tries prefills alone (prompt chunks of running requests, then
waiting requests); decodes and swap-ins run only in steps where no prefill could be scheduled.

Liveness. A request is accepted only if it can run to completion alone in an empty cache (its peak block need
over any step of at most the token budget, see `CacheConfig.peak_blocks`), so:

* the watermark (`CacheConfig.watermark`) is headroom against thrashing among running requests and is asked of
  an admission or swap-in only while something is running - it never holds back the only request that could run;
* a recompute longer than the whole budget is chunked even with chunked prefill off (no step could hold it);
* a swapped group that cannot come back even into an empty cache (its members' shared tail blocks need copies)
  is dropped from the CPU and recomputed, its members from then on independent sequences;
* `max_num_seqs` counts sequences: an n > 1 request needs room for n at admission.

Hence every `schedule()` with unfinished requests schedules work, preempts, or reports rejections.

Prefix-cache registration happens when a request is scheduled (`emit`), as in vLLM V1: the full blocks its step
computes are keyed at once, so a request admitted later in the same step hits them (the engine writes a step's KV
before attending). A victim preempted after it was scheduled in the step loses those keys again.

Versions (`vllm_version`, `engine.core.vllm_versions`): from 0.34 the long-prefill cap applies only with chunked
prefill on, and cache-aware admission may reorder the head of the waiting queue (`admission`).

Admission gate (`scheduler_reserve_full_isl`, vLLM's name and default): a waiting request is admitted only when
the blocks for its whole prompt (and output to recompute) beyond its prefix hits fit in the free blocks with the
watermark to spare, not just its first chunk; off, the first chunk decides (vLLM <= 0.10).

Prefill/decode disaggregation (`remote_kv`, vLLM's P/D): a request with `kv_transfer_params` either receives its
prompt's KV (decode side: WAITING_FOR_REMOTE_KVS holding its blocks, `SchedulerOutput.kv_loads`, then
`finished_recving`) or keeps its blocks after finishing for the decode side to read (prefill side:
`UpdateOutput.kv_sends`, then `finished_sending`). Without such requests nothing here changes.

`update(step, sampled)` (`step_update`) applies the step's results. Decodes can be stepped in bulk, one step or
k at once, in count-only runs (`decode_steps`, `decode_stretch`). Requests that could never run are rejected at
`add_request` and reported in the next step.

Speculative decoding (`speculative_config`, vLLM's; `spec_steps`): running requests' drafts (`set_drafts`) are
scheduled after their verified tokens, with lookahead slots and draft rows of the budget as vLLM takes them, and
`update(step, sampled, accepted)` rolls the rejected drafts back. Off, nothing here changes.
"""

from __future__ import annotations

from collections import deque
from itertools import count
from typing import Final

from kvplan.engine.core.admission import Admission
from kvplan.engine.core.beam_group import BeamGroups
from kvplan.engine.core.config import CacheConfig, ConfigError, HybridCacheConfig, SchedulerConfig
from kvplan.engine.core.decode_steps import DecodeMode, DecodeSteps
from kvplan.engine.core.decode_stretch import DecodeStretch
from kvplan.engine.core.kv_groups import HybridKVCacheManager
from kvplan.engine.core.kv_manager import KVCacheManager
from kvplan.engine.core.metrics import SchedulerStats, kv_snapshot, memory_breakdown
from kvplan.engine.core.outputs import ScheduledRequest, SchedulerOutput, UpdateOutput
from kvplan.engine.core.preemption import GroupPreemption
from kvplan.engine.core.remote_kv import RemoteKV
from kvplan.engine.core.request import RUNNING, Request, RequestStatus, attach_block_keys
from kvplan.engine.core.request_queue import make_queue
from kvplan.engine.core.reservation import ReservationAllocator
from kvplan.engine.core.spec_steps import SpecSteps
from kvplan.engine.core.step_update import StepUpdate
from kvplan.engine.core.tier_transfers import promotions_of
from kvplan.engine.core.victims import pick_victim

NO_CAP: Final = 1 << 60  # the long-prefill cap when none applies: above any token count (an int, as the caps are:
# compared with the tokens of every request the running loop meets, a float made each comparison a generic one)

# The managers `make_kv_manager` builds, each a `KVManager`. Named as a union rather than the protocol so that a
# compiled build calls their methods directly: a protocol's method goes through Python's method lookup and argument
# parsing (about 300 instructions a call, several calls per admission and per finish).
KVManagers = KVCacheManager | HybridKVCacheManager | ReservationAllocator


def make_kv_manager(config: CacheConfig, max_num_batched_tokens: int = 2048) -> KVManagers:
    """The cache's manager: paged (one group, or vLLM's hybrid allocator over several), or a reservation one.
    The token budget bounds what a sliding group holds beyond its window in one step (its admission cap)."""
    if isinstance(config, HybridCacheConfig) and config.hybrid:  # (only a HybridCacheConfig has a layout)
        return HybridKVCacheManager(config, max_num_batched_tokens)
    return KVCacheManager(config) if config.allocator == "paged" else ReservationAllocator(config)


class Scheduler:
    """The continuous-batching scheduler (see the module). It owns the request sets and the KV manager; its
    parts are components it owns, each working through this class's public members: `admissions` (waiting ->
    running), `preemption` (groups preempted and swapped back all or nothing), `beams` (beam-search groups),
    `updates` (`update`), `decode_steps` (decodes stepped in bulk) and `decode_stretch` (k decode steps at once).

    Invariants between calls:

    * every live request (`requests`) is in exactly one of `waiting` (WAITING or PREEMPTED, holding no KV),
      `running` (RUNNING, its KV for every computed token in `kv`), `swapped` (SWAPPED, its KV on the CPU) or
      `remote.holding` (WAITING_FOR_REMOTE_KVS, or WAITING once received: holding its prompt's blocks);
      members of a sequence group are adjacent in `swapped`, in group order, and resident all or none;
    * `num_running_seqs` is the running requests' `seq_slots`, at most `max_num_seqs`;
    * the prefix cache keys exactly the full blocks of steps already scheduled (a step's blocks are keyed when it is
      scheduled and unkeyed again if its request is preempted before it runs);
    * `step_id` and `stats.num_steps` count the steps scheduled, a fast-forwarded stretch's included;
    * with speculative decoding on (`spec_steps` not None) decodes are never stepped in bulk or fast-forwarded:
      `decode_mode` is PER_REQUEST and `decode_horizon` 0 (a step's length depends on its acceptances).

    Extension points - what differs between the live engine and the simulator:

    * `decode_mode`: `DecodeMode.PER_REQUEST` (the default: every request through the general loop, as a run
      that samples real tokens needs) or `DecodeMode.BULK` (count-only runs: the leading plain decodes of a step
      as one list, `SchedulerOutput.decodes`); set it before the first `schedule()`;
    * `update(out, sampled, accepted)`: `sampled` None runs count-only (`accepted`: drafts kept per scheduled
      request, where drafts were verified);
    * `set_drafts(drafts)`: speculative decoding's drafts for the next step;
    * `decode_horizon(limit)`, `advance_decodes(k, usage)` and `waiting_head_blocked()`: the decode fast path,
      k pure-decode cycles applied at once, exactly as k `schedule()` + `update()` cycles would.
    """

    def __init__(self, cache: CacheConfig | None = None, config: SchedulerConfig | None = None, *,
                 decode_mode: DecodeMode = DecodeMode.PER_REQUEST) -> None:
        self.cache_config = cache or CacheConfig()
        self.config = config or SchedulerConfig()
        self.kv: KVManagers = make_kv_manager(self.cache_config, self.config.max_num_batched_tokens)
        self.block_size = self.cache_config.block_size
        self.waiting = make_queue(self.config.policy)
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()  # members of a group are adjacent, in group order
        self.requests: dict[str, Request] = {}  # live (not finished, aborted or rejected) requests
        self.num_running_seqs = 0  # sequences the running requests count for under max_num_seqs
        self.stats = SchedulerStats()
        self.step_id = 0
        self.decode_mode = decode_mode
        self._seq = count()
        self._started = count(1)
        self._rejected: list[tuple[str, str]] = []
        if self.config.long_prefill_token_threshold > self.cache_config.max_model_len:  # vLLM refuses it too
            raise ConfigError(f"scheduler.long_prefill_token_threshold: {self.config.long_prefill_token_threshold} "
                              f"exceeds cache.max_model_len {self.cache_config.max_model_len}; allowed: at most "
                              "max_model_len (0: no cap)")
        # vLLM's long_prefill_token_threshold: a prefill's tokens per step, capped before the budget is applied -
        # in steps that start with more than one request (alone, a prefill starves nobody)
        self._long_prefill: int = self.config.long_prefill_token_threshold or NO_CAP
        if self.config.version.long_prefill_needs_chunking and not self.config.enable_chunked_prefill:
            self._long_prefill = NO_CAP  # vLLM >= 0.34: the cap splits prompts, which only chunked prefill may do
        # cache-aware admission (admission.reorder_window): a window on a prefix cache
        self.cache_aware_window = self.config.cache_aware_admission_window
        if self.cache_aware_window and not self.cache_config.enable_prefix_caching:
            raise ConfigError("scheduler.cache_aware_admission_window: orders waiting requests by their cached "
                              "prefix, and cache.enable_prefix_caching is off (vLLM ignores it then); allowed: 0, or "
                              "prefix caching on")
        self._cap: int = NO_CAP
        # Constants of the configuration, public for the components:
        #: whether blocks are keyed for the prefix cache as steps are scheduled
        self.keys_wanted = self.cache_config.enable_prefix_caching and self.cache_config.allocator == "paged"
        #: whether a request's blocks can be released mid-request (sink+window, sliding groups): no fast path then
        self.windowed = self.cache_config.windowed or self.cache_config.hybrid
        self.prefill_first = self.config.schedule == "prefill_first"
        self._watermark_blocks = self.cache_config.watermark_blocks  # (`admission_reserve`, several times a step)
        #: limits read several times a step, kept here: the configuration classes are interpreted, so each read
        #: of theirs from the compiled core was a generic attribute lookup (a few hundred instructions)
        self.max_num_seqs: int = self.config.max_num_seqs
        self.max_num_batched_tokens: int = self.config.max_num_batched_tokens
        self.chunked_prefill: bool = self.config.enable_chunked_prefill
        self.reserve_full_isl = self.config.scheduler_reserve_full_isl
        self.admissions = Admission(self)
        self.preemption = GroupPreemption(self)
        self.beams = BeamGroups(self)
        self.updates = StepUpdate(self)
        self.decode_steps = DecodeSteps(self)
        self.decode_stretch = DecodeStretch(self.decode_steps)
        self.remote = RemoteKV(self)
        #: speculative decoding (None: off) and the budget rows a scheduled request takes for drafting
        self.spec_steps = SpecSteps.of(self)
        self.draft_slots = self.spec_steps.config.draft_slots if self.spec_steps is not None else 0

    # -- requests ------------------------------------------------------------------------------------------
    def add_request(self, request: Request) -> bool:
        """Queue a request; False (and reported in the next step's `rejected`) if it can never run."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already live")
        request.seq = next(self._seq)
        if self.keys_wanted and request.block_keys is None:
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
        """Why `request` could never run to completion under this configuration, or None."""
        limit, budget = self.cache_config.max_model_len, self.max_num_batched_tokens
        if request.final_len > limit:
            return (f"prompt ({request.prompt_len}) + max_tokens ({request.max_tokens}) = {request.final_len} "
                    f"exceeds max_model_len {limit}")
        if request.n > self.max_num_seqs:
            return f"n = {request.n} parallel sequences exceed max_num_seqs {self.max_num_seqs}"
        if request.kv_transfer_params is not None and (request.n > 1 or request.beam):
            return "kv_transfer_params (prefill/decode disaggregation) need n = 1 and no beam search"
        if request.beam and (self.windowed or self.cache_config.allocator != "paged"):
            return ("beam search shares blocks copy-on-write and keeps every beam's whole history: it needs the "
                    "paged allocator without a sink+window cache or sliding-window layers")
        if not self.chunked_prefill and request.prompt_len > budget:
            return (f"prompt of {request.prompt_len} tokens exceeds max_num_batched_tokens {budget} and chunked "
                    "prefill is off")
        return self.kv.admission_error(request, budget)

    @property
    def has_rejections(self) -> bool:
        """Whether requests rejected by `add_request` wait to be reported by the next step."""
        return bool(self._rejected)

    def abort(self, request_id: str) -> bool:
        request = self.requests.pop(request_id, None)
        if request is None:
            return False
        if request.status is RUNNING:
            self.stop_running(request)
        elif request.status is RequestStatus.SWAPPED:
            self.swapped.remove(request)
        elif request in self.remote.holding:
            self.remote.abort(request)  # its blocks: freed now, or once the transfer writing them is over
        else:
            self.waiting.remove(request)
        if request.request_id not in self.remote.aborted_loads:
            self.kv.free(request)
        request.status = RequestStatus.ABORTED
        request.finish_reason = "abort"
        return True

    def fork(self, parent: Request, child_id: str) -> Request:
        """A running sibling of `parent` in its sequence group, sharing all its blocks (n > 1 sampling, beam
        search). Call between `update()` and the next `schedule()`."""
        if child_id in self.requests:
            raise ValueError(f"request id {child_id!r} is already live")
        if not self.has_seq_room(1):
            raise ValueError(f"fork: {self.num_running_seqs} running sequences leave no room under max_num_seqs "
                             f"{self.config.max_num_seqs}")
        child = parent.spawn(child_id)
        child.seq = next(self._seq)
        parent.children_ids.append(child_id)
        self.requests[child_id] = child
        if self.kv.fork(parent, child):
            self.start_running(child, fork=True)
        else:  # a reservation allocator found no room for the child: it recomputes later
            self.preemption.requeue_for_recompute(child)
            self.stats.num_preemptions += 1
        return child

    def has_unfinished(self) -> bool:
        return bool(self.running or self.swapped or len(self.waiting) or self.remote.holding)

    @property
    def num_unfinished(self) -> int:
        return len(self.running) + len(self.swapped) + len(self.waiting) + len(self.remote.holding)

    # -- prefill/decode disaggregation: the engine's reports (`remote_kv`) -----------------------------------
    def finished_recving(self, request_ids: list[str] | set[str] | tuple[str, ...]) -> None:
        """The KV of these WAITING_FOR_REMOTE_KVS requests has arrived: each is admitted from the next
        `schedule()` on, recomputing its last prompt token (vLLM's `finished_recving`)."""
        self.remote.finished_recving(request_ids)

    def finished_sending(self, request_ids: list[str] | set[str] | tuple[str, ...]) -> None:
        """The remote decode side has read these finished prefill-side requests' blocks: free them (vLLM's
        `finished_sending`)."""
        self.remote.finished_sending(request_ids)

    # -- lifecycle transitions and admission rules (the components' API) ------------------------------------
    def start_running(self, request: Request, fork: bool = False) -> None:
        """Append to `running`; `started` records the place (a fork keeps its parent's, as a sibling)."""
        if not fork:
            request.started = next(self._started)
        request.status = RUNNING
        self.running.append(request)
        self.num_running_seqs += request.seq_slots

    def stop_running(self, request: Request) -> None:
        running = self.running
        if running[-1] is request:  # a preemption victim is most often the last (vLLM's FCFS victim policy)
            running.pop()
        else:  # (remove compares each request before it, at about a hundred instructions each when compiled)
            running.remove(request)
        self.num_running_seqs -= request.seq_slots

    def finish(self, request: Request, reason: str, result: UpdateOutput | None) -> None:
        """End a running request, freeing its blocks (a prefill-side P/D request keeps them: `remote_kv`); the
        caller drops it from `running` (`drop_finished`)."""
        if request.kv_transfer_params is None or not self.remote.hold_finished(request, reason, result):
            self.kv.free(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        del self.requests[request.request_id]
        self.num_running_seqs -= request.seq_slots
        self.stats.num_finished += 1
        if result is not None:
            result.finished.append(request)

    def drop_finished(self, at: list[int] | None = None, *, new_list: bool = False) -> None:
        """Drop the requests that are no longer RUNNING from `running`, keeping its order: in place, or into a new
        list when `new_list` (a caller holds the old one: the replica's stretch stamps read the running list from
        before the stretch). `at`, when the caller knows them: the places in `running` of all of them, ascending
        (the decode fast paths, whose requests' places are their indices), so that the others are not visited."""
        running = self.running
        if at is None:
            at = [i for i in range(len(running)) if running[i].status is not RUNNING]
        if not at:
            return
        if not new_list:
            # (once per step that finishes a request, with hundreds running and one or two finished: a deletion
            # moves the pointers behind it in one memmove, where a new list takes and drops a reference to each)
            for n in range(len(at) - 1, -1, -1):
                i = at[n]
                assert running[i].status is not RUNNING  # (a caller's wrong place would drop a live request)
                del running[i]
            return
        kept: list[Request] = []  # the kept runs between the finished ones, copied whole
        start = 0
        for i in at:
            assert running[i].status is not RUNNING
            kept += running[start:i]
            start = i + 1
        kept += running[start:]
        self.running = kept

    def count_steps(self, k: int) -> None:
        """Count k steps run without `schedule()` (a fast-forwarded stretch)."""
        self.step_id += k
        self.stats.num_steps += k

    def has_seq_room(self, slots: int) -> bool:
        return self.num_running_seqs + slots <= self.max_num_seqs

    def admission_reserve(self) -> int:
        """Blocks an admission or swap-in must leave free: the watermark, only while something runs."""
        return self._watermark_blocks if self.running else 0

    def chunk(self, pending: int, budget: int) -> int:
        """Tokens to compute now out of `pending` within `budget`; 0: wait for a step with room."""
        if pending > self._cap:
            pending = self._cap
        if pending <= budget or self.chunked_prefill:
            return min(pending, budget)
        # Chunked prefill off: a prefill runs whole - except a recompute of prompt + generated tokens longer than
        # the whole budget, which no step could hold.
        return budget if pending > self.max_num_batched_tokens else 0

    def emit(self, out: SchedulerOutput, request: Request, n: int, copies: tuple[tuple[int, int], ...],
             cached_tokens: int) -> None:
        """Put `n` tokens of `request` into the step, keying the blocks the step fills (vLLM's timing)."""
        start = request.num_computed_tokens
        end = start + n
        verified = request.prompt_len + request.num_output_tokens  # num_tokens
        drafts: list[int] = []
        if request.spec_token_ids:  # the drafts that fit are verified; the rest are trimmed, all are cleared
            if end > verified:
                drafts = request.spec_token_ids[:end - verified]
            request.spec_token_ids = []
            if end > verified:
                end = verified  # only verified tokens are ever keyed
        if self.keys_wanted and end >= (request.num_hashed_blocks + 1) * self.block_size:
            self.kv.commit(request, end)  # a block fills in this step: key it now
        samples = end == verified  # all of num_tokens
        out.scheduled.append(ScheduledRequest(
            request, n, start, cached_tokens, self.kv.block_ids[request.request_id], samples,
            samples and n == 1 and start >= request.prompt_len, copies, drafts, len(out.decodes)))
        out.num_batched_tokens += n
        if copies:
            out.copies.extend(copies)

    # -- schedule ------------------------------------------------------------------------------------------
    def refresh_prefill_cap(self) -> None:
        """The long-prefill cap of the step about to be scheduled: vLLM applies `long_prefill_token_threshold`
        only when more than one request is in the system (`head_blocked` plans with it before `schedule` runs)."""
        # (vLLM counts the requests holding blocks while they wait for remote KV among the waiting)
        self._cap = self._long_prefill if (len(self.running) + len(self.waiting) + len(self.swapped)
                                           + len(self.remote.holding)) > 1 else NO_CAP

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(self.step_id)
        self.step_id += 1
        self.stats.num_steps += 1
        if self._rejected:
            out.rejected, self._rejected = self._rejected, []
        budget = self.max_num_batched_tokens
        self.refresh_prefill_cap()
        if self.prefill_first and not self.swapped and self._schedule_prefills(out, budget):
            self._collect_tier_transfers(out)
            return out
        budget = self._schedule_running(out, budget)
        if not out.preempted:
            budget = self.preemption.schedule_swapped(out, budget)
            if not self.swapped and not (self.prefill_first and not out.is_empty):
                self.admissions.schedule_waiting(out, budget)
        # (requests receiving remote KV, or blocks held for a remote decode, wait for the engine's report, not for
        # a step: no work may be due then)
        if out.is_empty and not out.preempted and self.has_unfinished() and not self.remote.pending:
            raise RuntimeError(f"scheduler bug: an empty step with {len(self.running)} running, {len(self.swapped)} "
                               f"swapped and {len(self.waiting)} waiting requests ({self.kv.num_free_blocks} of "
                               f"{self.cache_config.num_blocks} blocks free)")
        self._collect_tier_transfers(out)
        return out

    def _collect_tier_transfers(self, out: SchedulerOutput) -> None:
        """The tier copies this step made (demotions of evicted GPU blocks, promotions of lower-tier prefix hits),
        in order: the runner performs them, the cost model prices the promotions. Only a paged manager with tiers
        has any."""
        if self.kv.tiers:
            out.tier_transfers = self.kv.take_transfers()
            out.promotions = promotions_of(out.tier_transfers)

    def _schedule_prefills(self, out: SchedulerOutput, budget: int) -> bool:
        """prefill_first: prompt chunks of running requests and then waiting admissions, alone in the step and
        without preempting anyone. True when any was scheduled (the step then runs only them)."""
        kv = self.kv
        for request in self.running:
            if budget <= 0:
                break
            if request.num_computed_tokens >= request.prompt_len and request.num_tokens_to_compute == 1:
                continue  # decoding: waits for a step without prefills
            n = self.chunk(request.num_tokens_to_compute, budget)
            copies = kv.allocate(request, n) if n else None
            if copies is not None:
                budget -= n
                self.emit(out, request, n, copies, 0)
        self.admissions.schedule_waiting(out, budget)
        return bool(out.scheduled)

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        kv, spec, rows = self.kv, self.spec_steps, self.draft_slots
        bulk = self.decode_mode is DecodeMode.BULK
        first = self.decode_steps.schedule_leading(out, budget) if bulk else 0
        inline = bulk and not self.windowed  # (a sink+window cache releases blocks mid-request: `decode_steps`)
        budget -= first
        for request in self.running[first:]:  # a copy: preemption edits the list
            if budget <= rows:  # (each request takes `rows` more for drafting: 0 without a draft model)
                break
            if request.status is not RUNNING:
                continue  # preempted as a victim earlier in this loop
            if inline and self.decode_steps.schedule_inline(out, request):
                budget -= 1
                continue
            # num_tokens_to_compute, inlined (this loop runs once per running request per step)
            pending: int = request.prompt_len + request.num_output_tokens - request.num_computed_tokens
            room = budget - rows
            if spec is not None:  # its drafts too (num_tokens_with_spec), short of max_model_len
                pending = spec.cap(request, pending + len(request.spec_token_ids))
            n = pending if pending <= room and pending <= self._cap else self.chunk(pending, room)
            if n == 0 and spec is not None and request.spec_token_ids:  # a decode's drafts are trimmed to fit,
                n = min(pending, room, self._cap)  # chunked prefill or not (vLLM's running loop)
            if n == 0:
                continue
            slots = n if spec is None else spec.slots(request.num_computed_tokens, n)
            copies = kv.allocate(request, slots)
            while copies is None and request.status is RUNNING:
                budget += self.preemption.preempt(pick_victim(self.config.victim_policy, self.running), out)
                if request.status is RUNNING:
                    copies = kv.allocate(request, slots)
            if copies is None:
                continue
            budget -= n + rows
            self.emit(out, request, n, copies, 0)
        return budget

    # -- update, beams and the decode fast path (the components' entry points) ------------------------------
    def update(self, out: SchedulerOutput, sampled: list | None = None,
               accepted: list[int] | None = None) -> UpdateOutput:
        """Apply a step's results. `sampled[i]` is the token for `out.scheduled[i]` (ignored where it samples
        nothing; a list of n tokens for an n > 1 request finishing its prompt; the list of tokens the verifier
        emitted - accepted drafts, then one more - where the item verified drafts); None runs count-only, with
        `accepted[i]` the drafts kept where `out.scheduled[i]` verified any (`spec_token_ids`)."""
        return self.updates.update(out, sampled, accepted)

    def requests_to_draft(self) -> list[Request]:
        """Speculative decoding: the running requests that take drafts for the next step (`SpecSteps.drafting`)."""
        if self.spec_steps is None:
            raise ValueError("requests_to_draft: speculative decoding is off (scheduler.speculative_config is null)")
        return self.spec_steps.drafting()

    def set_drafts(self, drafts: dict[str, list[int]]) -> None:
        """Speculative decoding: each running request's drafts for the next step, by request id (vLLM's
        `update_draft_token_ids`; count-only runs give placeholder ids). Call between `update()` and the next
        `schedule()`."""
        if self.spec_steps is None:
            raise ValueError("set_drafts: speculative decoding is off (scheduler.speculative_config is null)")
        self.spec_steps.set_drafts(drafts)

    def advance_beams(self, members: list[Request], plan: list[tuple[int, int]]) -> UpdateOutput:
        """One beam-search step of a group: member j continues member plan[j][0] with token plan[j][1]."""
        return self.beams.advance(members, plan)

    def finish_beams(self, members: list[Request], reason: str) -> UpdateOutput:
        """End a beam group whose search is over, releasing every block."""
        return self.beams.finish(members, reason)

    @staticmethod
    def beams_ready(members: list[Request]) -> bool:
        """Whether a beam group may step (`BeamGroups.ready`; a method, not an alias, for mypyc)."""
        return BeamGroups.ready(members)

    def decode_horizon(self, limit: int, least: int = 1) -> int:
        """Largest k <= limit for which `advance_decodes(k)` equals k `schedule()` + `update()` cycles (0: none, or
        fewer than `least`)."""
        return self.decode_stretch.horizon(limit, least)

    def advance_decodes(self, k: int, usage: list[float] | None = None) -> list[tuple[int, Request]]:
        """Apply k pure-decode cycles at once; the (step, request) completions in update order (`decode_stretch`)."""
        return self.decode_stretch.advance(k, usage)

    def waiting_head_blocked(self) -> bool:
        """Whether the waiting queue's head stays waiting until a running request finishes (`admission`)."""
        return self.admissions.head_blocked()

    # -- metrics and cache control -------------------------------------------------------------------------
    def kv_metrics(self) -> dict[str, float | int | None]:
        """vLLM-named gauges and counters plus the memory breakdown at this instant."""
        live = [*self.running, *self.swapped]
        breakdown = memory_breakdown(self.kv, live)
        return {**kv_snapshot(self.kv, self.stats), **breakdown.as_dict(),
                "kv_token_utilization": breakdown.kv_token_utilization}

    def reset_prefix_cache(self) -> int:
        """Forget every cached free block; returns how many were dropped."""
        pool = self.kv.pool
        return pool.drop_cache() if pool is not None else 0
