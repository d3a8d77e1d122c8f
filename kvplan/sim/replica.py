"""One serving replica: a SimPy process that owns an `engine.core` Scheduler and advances time by a cost model.

Each loop iteration is one scheduler step and one SimPy event: `schedule()`, price the step, wait, `update()`,
stamp the sampled tokens with the step's end time. Requests are added to the scheduler the moment the router
hands them over (mid-step, exactly as a live engine's queue) and are first scheduled at the next step.

Decode fast path: when `Scheduler.decode_horizon` says the next k steps are pure decode with nothing else happening
(cached blocks may be evicted inside them, and requests may wait as long as the head cannot be admitted before the
first completion - a backlog), the replica prices all k steps in one vectorised call, keeps those that start before
the next arrival this replica may receive (any arrival, as a router may send it here; under round robin, its own
next one) and before the next time-series sample, applies them with `Scheduler.advance_decodes`, and stamps tokens
and completions with the same step-end times that k single steps produce. Requests that reach their output budget
finish inside the stretch. The step running across an arrival may join the stretch unless a request finishes in it
(the completion would show before the arrival); its prefix-cache registrations and evictions happen when it is
scheduled, before the arrival either way, so a cache-aware router sees the same cache.

GPU time by kind of work (what a deployment's cost is split by, `sim.dollars`): `busy_seconds` sums every step's
time; `prefill_seconds` the prefill share of it - each step's time split in proportion to its prompt-token rows
(prefill chunks, a preempted sequence's recompute included) against its decode rows (one per decoding
sequence). A decode-only step, and so a whole fast-path stretch, adds nothing to it, so both paths add the same
floats in the same order.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final

import simpy

from kvplan.engine.core import CacheConfig, Request, RequestStatus, Scheduler, SchedulerConfig, SchedulerOutput
from kvplan.engine.core.decode_steps import DecodeMode
from kvplan.engine.core.kv_groups import HybridKVCacheManager
from kvplan.engine.core.metrics import TIER_COUNTER_KEYS, TIER_NAMES
from kvplan.engine.core.outputs import UpdateOutput
from kvplan.engine.core.request import sample_index
from kvplan.engine.core.timing import SequenceTiming
from kvplan.results.itl import ItlLog
from kvplan.results.request_table import RequestLog
from kvplan.sim.cost import CostModel, reads_spread, sliding_window, step_law_of, step_time
from kvplan.sim.cost.features import decode_stretch_features, first_decode_features
from kvplan.sim.cost.step_sums import stretch_sums
from kvplan.sim.links import TierPricing
from kvplan.sim.lora import LoraServing, lora_serving
from kvplan.sim.shared_store import SharedView
from kvplan.sim.spec_decode import DraftCost, DraftOutcomes, speculation
from kvplan.sim.token_clock import TokenClock

NAN: Final = math.nan
FAST_PATH_CELLS: Final = 1 << 20  # most (request, step) pairs priced in one stretch
MIN_STRETCH: Final = 2  # a one-step stretch makes more passes over the running requests than the step it replaces
SERIES_COLUMNS: Final = ("replica", "time_s", "running", "waiting", "swapped", "kv_usage", "num_cached_free_blocks",
                         "token_states", "reserved_unused", "internal_fragmentation", "external_fragmentation",
                         "free")


class Replica:
    def __init__(self, env: simpy.Environment, index: int, cache: CacheConfig, config: SchedulerConfig,
                 cost: CostModel, log: RequestLog, next_arrival: Callable[[int], float], *,
                 sample_interval_s: float = 1.0, fast_path: bool = True, record_tokens: bool = False) -> None:
        self.env, self.index, self.cost, self.log = env, index, cost, log
        # SimPy's timeout, bound once (an attribute of the interpreted environment, looked up generically)
        self._timeout: Callable[[float], simpy.Timeout] = env.timeout
        # count-only: bulk decodes, unless stepping one step at a time (the reference path)
        self.sched = Scheduler(cache, config, decode_mode=DecodeMode.BULK if fast_path else DecodeMode.PER_REQUEST)
        self.block_size = cache.block_size
        self.attended_limit = cache.sink_tokens + cache.window_tokens if cache.windowed else 0
        self.sliding_window = sliding_window(cost)
        self.spread = reads_spread(cost)  # whether stretches need the features only some cost models read
        # the cost model's step on plain numbers, when it has one: a step, or a stretch in one typed loop (a law has
        # neither window nor spread features: a model that reads them prices its steps itself)
        self.step_law = step_law_of(cost) if not (self.sliding_window or self.spread) else None
        self.next_arrival = next_arrival
        self.sample_interval_s, self.next_sample_s = sample_interval_s, 0.0
        self.fast_path = fast_path
        # Every token time per (row, sample), for comparing with a live run; stretches stamp only their ends.
        self.token_times: dict[tuple[int, int], list[float]] | None = None
        if record_tokens:
            if fast_path:
                raise ValueError("recording every token time needs the step-by-step path (fast_path=False)")
            self.token_times = {}
        # the sequences' token stamps and the inter-token gaps' log (`tokens.itl`); stamped runs (`token_clock`)
        # where a step samples one token per sequence and token times are not kept (see below for drafts)
        self.tokens = TokenClock(runs=not record_tokens)
        # every live request's track by id (a fork finds its parent's, a finish takes it out); each request also
        # carries its own (`Request.timing`), which the per-step loops read
        self.tracks: dict[str, SequenceTiming] = {}
        self.rejected: list[tuple[int, str]] = []
        self.series: list[tuple] = []
        self.clock = 0.0  # exact step-end times, accumulated step by step (env.now may differ in the last ulp)
        self.usage_seconds = 0.0  # ∫ KV block usage dt over busy time
        self.busy_seconds = 0.0  # Σ step times
        self.prefill_seconds = 0.0  # Σ step time x prefill rows / all rows (see the module docstring)
        self.peak_usage = 0.0
        # A hybrid model's blocks in use per attention kind (its groups' tables): ∫ blocks dt and the peak
        self.kv_layout = layout = cache.hybrid_layout
        kinds = [] if layout is None else list(dict.fromkeys(g.kind for g in layout.groups))
        self._kind_of_group = [] if layout is None else [kinds.index(g.kind) for g in layout.groups]
        self.kind_block_seconds = [0.0] * len(kinds)
        kv = self.sched.kv  # the hybrid allocator's blocks in use per group (updated in place)
        self._group_used = kv.group_used if isinstance(kv, HybridKVCacheManager) else []
        self.kind_peak_blocks = [0] * len(kinds)
        self.num_fast_steps = 0
        self._decode_step_s = math.nan  # the last stretch's last step time: how many steps to price (`_fast_forward`)
        self._wake: simpy.Event | None = None
        # Steady-state probes (sim.probe): inter-token gaps count only for tokens sampled inside the measurement
        # window (`tokens.itl_from`, `itl_until`); counters are marked at the first sample at or after each window
        # edge; `on_sample` sees every sample (the overload check); `on_close` every finished sequence (the closed
        # loop's users); and `stop_at_finish` ends a fast-path stretch at its first completion, where a closed-loop
        # user sends its next request.
        self.mark_times: list[float] = []
        self.marks: list[dict[str, int]] = []
        self.on_sample: Callable[[Replica], None] | None = None
        self.on_close: Callable[[int, int, float], None] | None = None
        self.stop_at_finish = False
        # The cluster's stop (`Cluster.run`): a stretch applies only the steps a stepped run completes before it - those
        # ending before the horizon, none once a sample's check has stopped the run (stepping then schedules one
        # more step, which never ends).
        self.stopped: simpy.Event | None = None
        self.stop_at_s = math.inf
        self.busy_until = math.inf  # the end of the step or stretch under way: its completions come no earlier
        self.pricing: TierPricing | None = None  # set by the cluster for a replica with prefix tiers
        self.block_bytes: float | None = None  # a KV block's bytes (every rank's): what tier counters move
        self.shared_view: SharedView | None = None  # this replica's view of the cluster's shared prefix store
        # P/D (`sim.disagg`): sees each scheduled step and its start (the KV loads it starts)
        self.on_schedule: Callable[[SchedulerOutput, float], None] | None = None
        # Speculative decoding (`sim.spec_decode`): the drafts' outcomes and the draft model's price
        self.drafts: DraftOutcomes | None
        self.draft_cost: DraftCost | None
        self.drafts, self.draft_cost = speculation(config, cost, cache.block_size)
        if self.drafts is not None:  # a verification samples several tokens at once
            self.tokens.runs = False
        # LoRA (`sim.lora`): the adapter slots and their prices; the decode fast path has no per-step hook for
        # adapter loads, so a LoRA replica steps one step at a time
        self.lora: LoraServing | None = lora_serving(config, cost)
        if self.lora is not None:
            self.fast_path = False
        self.process = env.process(self._run())

    @property
    def itl(self) -> ItlLog:
        """The inter-token gaps its sequences' tokens made (inside the measurement window)."""
        return self.tokens.itl

    @property
    def num_steps(self) -> int:
        return self.sched.stats.num_steps

    # -- arrivals ------------------------------------------------------------------------------------------
    @property
    def outstanding(self) -> int:
        return self.sched.num_unfinished

    def submit(self, request: Request, row: int) -> bool:
        """Hand a request to the scheduler; False when it rejects it (recorded in `rejected`)."""
        request.timing = self.tracks[request.request_id] = SequenceTiming(
            row, 0, request.arrival_s, token_times_s=None if self.token_times is None else [])
        if not self.sched.add_request(request):
            del self.tracks[request.request_id]
            self.rejected.append((row, request.finish_reason or "rejected"))
            return False
        self.wake(request.arrival_s)
        return True

    def wake(self, now: float) -> None:
        """Resume an idle replica at `now`: a request arrived, or (P/D) a transfer it waits on is over."""
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed(now)

    # -- the step loop -------------------------------------------------------------------------------------
    def _run(self):
        sched = self.sched
        while True:
            if not sched.has_unfinished():
                self._wake = self.env.event()
                self.busy_until = math.inf  # idle: nothing can finish here before a new request arrives
                arrival = yield self._wake
                self._wake = None
                self.clock = max(self.clock, arrival)
                continue
            if self.clock >= self.next_sample_s:
                self._sample()
            if self.fast_path and not (self.stopped is not None and self.stopped.triggered):
                ends = self._fast_forward()
                if ends:
                    self.busy_until = ends[-1]
                    yield self._timeout(max(ends[-1] - self.env.now, 0.0))
                    continue
            step = sched.schedule()  # never empty while requests are unfinished - but for P/D's (`remote_kv`)
            start = self.clock
            if self.on_schedule is not None:
                self.on_schedule(step, start)
                if step.is_empty and not step.preempted:  # only transfers pending: idle until one is over
                    self._wake = self.env.event()
                    self.busy_until = math.inf
                    self.clock = max(self.clock, (yield self._wake))
                    self._wake = None
                    continue
            prefill = chunks = 0  # prompt-token rows, and the items computing them
            for item in step.scheduled:
                track = item.request.timing
                assert track is not None  # every submitted request carries its track
                if track.first_scheduled_s != track.first_scheduled_s:  # NaN: first time scheduled
                    track.first_scheduled_s = start
                if not item.is_decode and not item.spec_token_ids:  # (verifying drafts is decode work)
                    prefill += item.num_new_tokens
                    chunks += 1
            if self.pricing is None:
                dt = step_time(self.cost, step, self.block_size, self.attended_limit, self.sliding_window,
                               self.step_law)
            else:  # promotions over their links (a shared store's network, layer-wise loading)
                dt = self.pricing.step_seconds(self.cost, step, start, self.block_size, self.attended_limit,
                                               self.sliding_window, self.step_law)
            if self.draft_cost is not None:  # the draft model's passes (speculative decoding, draft_model)
                dt += self.draft_cost.seconds(step.scheduled)
            if self.lora is not None:  # adapters loaded into their slots, then the LoRA kernels
                dt += self.lora.seconds(step)
            self._account(sched.kv.usage(), dt)
            self.busy_seconds += dt
            if prefill:  # decode rows: the scheduled items that are not chunks, and the bulk decodes
                self.prefill_seconds += dt * prefill / (prefill + len(step.scheduled) - chunks + len(step.decodes))
            end = start + dt
            self.busy_until = end
            yield self._timeout(max(end - self.env.now, 0.0))
            drafts = self.drafts
            if drafts is None:
                self._finish_step(step, sched.update(step, None), end)
            else:  # speculative decoding: the outcome of the drafts verified, then the next step's drafts
                self._finish_step(step, sched.update(step, None, drafts.accepted(step)), end)
                drafts.propose(sched)
            self.clock = end

    def _account(self, usage: float, dt: float) -> None:
        self.usage_seconds += usage * dt
        if usage > self.peak_usage:
            self.peak_usage = usage
        if self.kv_layout is not None:  # (never on the fast path: a sliding window keeps a model off it)
            used = [0] * len(self.kind_peak_blocks)
            for kind, blocks in zip(self._kind_of_group, self._group_used, strict=True):
                used[kind] += blocks
            for kind, blocks in enumerate(used):
                self.kind_block_seconds[kind] += blocks * dt
                if blocks > self.kind_peak_blocks[kind]:
                    self.kind_peak_blocks[kind] = blocks

    def _finish_step(self, step: SchedulerOutput, update: UpdateOutput, end: float) -> None:
        self.tokens.step(step, self.clock, end)
        if update.spec and self.token_times is not None:  # a verification emits its accepted drafts at once
            for item in step.scheduled:
                track = item.request.timing
                times = track.token_times_s if item.spec_token_ids and track is not None else None
                if times is not None:
                    times.extend([end] * (item.request.num_output_tokens - len(times)))
        for child in update.forked:
            assert child.parent_id is not None  # a forked child names its parent
            parent = self.tracks[child.parent_id]
            sample = sample_index(child.request_id)
            # A sibling that found no room (reservation allocators) samples its first token after a recompute.
            first = end if child.status is RequestStatus.RUNNING or child.status is RequestStatus.FINISHED else NAN
            child.timing = self.tracks[child.request_id] = SequenceTiming(
                parent.row, sample, parent.arrival_s, parent.first_scheduled_s, first, first,
                token_times_s=None if parent.token_times_s is None else [first] if first == first else [])
        for request in update.finished:
            self._close(request, end)

    def _close(self, request: Request, end: float) -> None:
        t = self.tracks[request.request_id]  # (and del: the compiled build's dict.pop is a Python method call)
        del self.tracks[request.request_id]
        self.tokens.settle(t)
        if self.drafts is not None:
            self.drafts.forget(request.request_id)
        if t.token_times_s is not None:
            assert self.token_times is not None  # a track records its token times only when the replica does
            self.token_times[(t.row, t.sample)] = t.token_times_s
        self.log.add(t.row, t.sample, self.index, t.arrival_s, t.first_scheduled_s, t.first_token_s, end,
                     request.prompt_len, request.num_output_tokens, request.num_cached_tokens,
                     request.num_preemptions, t.itl_max_s)
        if self.on_close is not None:
            self.on_close(t.row, t.sample, end)

    # -- fast path -----------------------------------------------------------------------------------------
    def _fast_forward(self) -> list[float]:
        """Apply the longest exact pure-decode stretch before the next arrival and sample; returns its step-end
        times (empty when none applies)."""
        sched = self.sched
        running = sched.running
        if not running or sched.swapped or sched.windowed or (len(sched.waiting) and not sched.waiting_head_blocked()):
            return []  # cheap exits first: an admission or swap-in is due, or windows release blocks
        last = running[-1]  # the latest admitted, the likeliest to be still in its prompt
        if last.num_computed_tokens < last.prompt_len + last.num_output_tokens - 1:
            return []
        arrival = self.next_arrival(self.index)
        sample = self.next_sample_s if self.sample_interval_s else math.inf
        bound = min(arrival, sample)
        limit = max(FAST_PATH_CELLS // len(running), 1)
        first = 0.0  # the stretch's first step time, estimated (when a bound is near)
        if not math.isinf(bound):  # ask only for about as many steps as fit before the bound
            first = self._decode_step_s
            if first != first:  # NaN: no stretch yet - price this one's first step
                first = self.cost.step_times(first_decode_features([r.num_computed_tokens + 1 for r in running],
                                                                   self.block_size, self.sliding_window))
            # Completions make later steps shorter than the first: ask for a quarter more. (Only the work priced
            # depends on the estimate: a stretch that stops short of the bound is followed by another.)
            limit = min(limit, int((bound - self.clock) / first * 1.25) + 2)
        k = sched.decode_horizon(limit, MIN_STRETCH)
        if k == 0:
            return []
        # Every running request is a plain decode now (`decode_horizon`): past its prompt, one token pending
        remaining = [r.max_tokens - r.num_output_tokens for r in running]
        if self.clock + first >= arrival and 1 in remaining:
            # A first step that runs across the arrival and finishes a request never joins a stretch (below): by
            # the estimate, the stretch would be empty, so it is not priced. (A stretch declined is stepped
            # instead, the same way: an estimate that errs costs speed, never a result.)
            return []
        contexts = [r.num_computed_tokens + 1 for r in running]
        times, alive = self._stretch_times(contexts, remaining, k)
        ends, clock = [], self.clock
        for dt in times:
            clock += dt
            ends.append(clock)
            if clock >= bound:
                # The step that runs across the bound may join the stretch: a sample is taken after it anyway,
                # and an arrival during it sees the same counts, block usage and prefix cache (registered when
                # the step was scheduled) - unless a request finishes in it (step by step, its completion would
                # show only after the arrival). Requests finish in step j = len(ends) - 1 when fewer decode in step
                # j + 1 than in step j (`alive`: a list scan of `remaining` was 0.7% of a loaded run); at the
                # stretch's last step, when one has exactly k steps left.
                j = len(ends) - 1
                if clock >= arrival and (alive[j] > alive[j + 1] if j + 1 < k else k in remaining):
                    ends.pop()
                break
        if self.stop_at_finish:
            del ends[min(remaining):]  # the first completion's step ends the stretch
        while ends and ends[-1] >= self.stop_at_s:
            ends.pop()  # a step ending at or after the horizon never ends step by step (the horizon's event is older)
        k = len(ends)
        if k == 0:
            return []
        self._decode_step_s = times[k - 1]
        usage: list[float] = []
        shared = self.shared_view
        if shared is not None:  # the stretch's stores into the shared store take effect at their steps' times
            shared.begin_stretch(usage)
        finished = sched.advance_decodes(k, usage)
        if shared is not None:
            shared.end_stretch([self.clock, *ends[:-1]])
        # `_account` and the busy time per step, inlined (same sum order); decode steps add no prefill time
        seconds, peak, busy = self.usage_seconds, self.peak_usage, self.busy_seconds
        for used, dt in zip(usage, times, strict=False):
            seconds += used * dt
            busy += dt
            if used > peak:
                peak = used
        self.usage_seconds, self.peak_usage, self.busy_seconds = seconds, peak, busy
        self.tokens.stretch(running, remaining, ends, alive, self.clock)
        for step, request in finished:
            self._close(request, ends[step])
        self.clock = ends[-1]
        self.num_fast_steps += k
        return ends

    def _stretch_times(self, contexts: list[int], remaining: list[int], k: int) -> tuple[list[float], list[int]]:
        """(each step's seconds, the requests decoding in it) of k pure-decode steps: by the cost model's step law
        when it has one that covers them (`sim.cost.step_law`), else by its `step_times` on the stretch's arrays.
        Both give the same times, bit for bit."""
        if self.step_law is not None:
            alive, attended, blocks, *_ = stretch_sums(contexts, remaining, k, self.block_size, 0, False)
            times = self.step_law.times(alive, attended, blocks)
            if times is not None:
                return times, alive
        features = decode_stretch_features(contexts, remaining, k, self.block_size, self.sliding_window, self.spread)
        return self.cost.step_times(features).tolist(), features.num_requests.tolist()

    # -- time series ---------------------------------------------------------------------------------------
    def _sample(self) -> None:
        sched = self.sched
        m = sched.kv_metrics()
        self.series.append((self.index, self.clock, len(sched.running), len(sched.waiting), len(sched.swapped),
                            m["kv_usage"], m["num_cached_free_blocks"], m["token_states"], m["reserved_unused"],
                            m["internal_fragmentation"], m["external_fragmentation"], m["free"]))
        if self.sample_interval_s:
            self.next_sample_s = (math.floor(self.clock / self.sample_interval_s) + 1) * self.sample_interval_s
        else:
            self.next_sample_s = math.inf
        while len(self.marks) < len(self.mark_times) and self.clock >= self.mark_times[len(self.marks)]:
            self.marks.append(self.counters())
        if self.on_sample is not None:
            self.on_sample(self)

    def counters(self) -> dict[str, int]:
        if self.shared_view is not None:  # its stores stamped by now are counted by now
            self.shared_view.queue.flush(self.env.now)
        m = self.sched.kv_metrics()
        out: dict[str, int] = {}
        for key in ("prefix_cache_queries", "prefix_cache_hits", "num_preemptions", "num_evicted_blocks"):
            value = m[key]
            assert value is not None  # counters every cache keeps
            out[key] = int(value)
        # the prefix tiers' counters, only for the tiers this replica has (a summary shows the others as null)
        for key in TIER_COUNTER_KEYS:
            value = m[key]
            if value is not None:
                out[key] = int(value)  # (an int already: a tier's counter)
        if self.lora is not None:  # adapters read from disk and copied into device slots
            out.update(lora_disk_loads=self.lora.loads["disk"], lora_gpu_loads=self.lora.loads["gpu"])
        if self.drafts is not None:  # speculative decoding: vLLM's SpecDecodingStats counters
            stats = self.sched.stats
            out.update(num_drafts=stats.num_drafts, num_draft_tokens=stats.num_draft_tokens,
                       num_accepted_tokens=stats.num_accepted_tokens)
        for name in TIER_NAMES:  # bytes over each tier's link: its promotions out and its stores in
            if f"kv_offload_{name}_hits" in out and self.block_bytes is not None:
                moved = out[f"kv_offload_{name}_promotions"] + out[f"kv_offload_{name}_demotions"]
                out[f"kv_offload_{name}_bytes"] = round(moved * self.block_bytes)
        return out
