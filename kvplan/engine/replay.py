"""Live replay: the engine serves a request trace in real time, stepping continuously as requests arrive.

Time is the trace's clock: wall time since the start plus the first arrival. The driver follows the same
discipline as a simulated replica, so that a simulator fed this run's own step durations reproduces every token
time exactly (policy validation):

    ─┬─ step i ───────────────┬─ step i+1 ─────────────┬─ idle ─ ─ ─ ┬─ step i+2 ──
     start_i                  end_i = start_(i+1)      end_(i+1)     a (arrival) = start_(i+2)
       requests with arrival <= start are admitted before the step's schedule; one arriving during a step
       waits for the next step boundary (the engine polls its queue once per step, as a simulated replica's
       scheduler first sees it at the next schedule).

A step's recorded duration is end − start: its compute, swaps and copies, and the loop's own overhead between
steps. Tokens sampled in a step are stamped with the step's end. The step profile (`engine.profiler`) gets
`start_s` and `end_s` for every step.

The requests come from an `Arrivals`: a trace known in advance (`ListArrivals`, the co-located replay), or, for an
instance of a prefill/decode pair, what its proxy sends it as the run goes (`kvplan.live_pd`). Every event from
outside the engine - a request reaching it, and in a P/D pair a pull that landed or an export that was read - carries
the time it happened on the shared clock, and the engine takes it at the first step boundary at or after that time
(the connector's `cut_s`), as a simulated replica does. A P/D step that computes nothing (only transfers pending) takes
no time, as in the simulator (`sim.replica`): the engine waits for the next event and the next step starts at it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Protocol

from kvplan.engine.core import RequestStatus
from kvplan.engine.core.metrics import TIER_COUNTER_KEYS
from kvplan.engine.core.request import sample_index
from kvplan.engine.core.timing import SequenceTiming
from kvplan.engine.llm import LLM
from kvplan.engine.profiler import StepProfiler
from kvplan.engine.sampling import SamplingParams

SERIES_KEYS = ("kv_usage", "num_cached_free_blocks", "token_states", "reserved_unused", "internal_fragmentation",
               "external_fragmentation", "free")


@dataclass(slots=True)
class ReplayRequest:
    row: int  # trace row: the request id on the engine is str(row), as in the simulator
    arrival_s: float
    prompt_token_ids: list[int]
    max_tokens: int
    n: int = 1
    priority: int = 0
    kv_transfer_params: dict | None = None  # P/D: what the proxy sends (engine.core.remote_kv)
    lora: str | None = None  # the LoRA adapter the trace row names (None: the base model)


@dataclass(slots=True)
class ReplayLog:
    sequences: list[SequenceTiming]  # finished sequences, in completion order
    series: list[tuple]  # (time_s, running, waiting, swapped, *SERIES_KEYS)
    rejected: list[tuple[int, str]]  # (row, reason)
    counters: dict[str, int]
    usage_seconds: float  # ∫ KV block usage dt over busy time
    peak_usage: float
    num_steps: int
    busy_s: float  # time spent in steps
    num_blocks: int
    block_size: int


class Arrivals(Protocol):
    """Where a replay's requests come from, on the trace clock (seconds; `now_s()` reads it)."""

    def origin(self, clock: Callable[[], float]) -> tuple[float, float]:
        """(the clock's value at trace time 0, the trace time the engine starts at)."""
        ...

    def closed(self) -> bool:
        """No request will come beyond those `due` returned."""
        ...

    def wait(self, now: float, now_s: Callable[[], float], events: Callable[[], float | None] | None) -> float | None:
        """When the engine, idle since `now`, starts its next step: the next arrival's time, or the engine's next
        event's (`events`, None: none pending), whichever is first, once it has happened (at or after `now`); None
        when nothing will come."""
        ...

    def due(self, until: float) -> list[ReplayRequest]:
        """The requests not yet returned that arrived at or before `until`, in arrival order."""
        ...


class ListArrivals:
    """A trace known in advance: requests sorted by arrival_s; the engine sleeps until the next one (it waits for
    arrivals only: a P/D instance, whose engine also waits for transfers, takes its requests from an inbox)."""

    def __init__(self, requests: Sequence[ReplayRequest], sleep: Callable[[float], None] = time.sleep) -> None:
        if any(b.arrival_s < a.arrival_s for a, b in pairwise(requests)):
            raise ValueError("replay: requests must be sorted by arrival_s")
        self.requests, self.sleep, self.i = requests, sleep, 0

    def origin(self, clock: Callable[[], float]) -> tuple[float, float]:
        t0 = self.requests[0].arrival_s if self.requests else 0.0
        return clock() - t0, t0

    def closed(self) -> bool:
        return self.i >= len(self.requests)

    def wait(self, now: float, now_s: Callable[[], float], events: Callable[[], float | None] | None) -> float | None:
        if self.closed():
            return None
        start = max(now, self.requests[self.i].arrival_s)
        ahead = start - now_s()
        if ahead > 0:
            self.sleep(ahead)
        return start

    def due(self, until: float) -> list[ReplayRequest]:
        first = self.i
        while self.i < len(self.requests) and self.requests[self.i].arrival_s <= until:
            self.i += 1
        return list(self.requests[first:self.i])


class LiveReplay:
    def __init__(self, llm: LLM, *, temperature: float = 1.0, seed: int = 0, sample_interval_s: float = 0.0,
                 profile_path: str | Path | None = None, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep,
                 on_step: Callable[[list, float, float], None] | None = None) -> None:
        self.llm = llm
        self.temperature, self.seed = temperature, seed
        self.sample_interval_s = sample_interval_s
        self.profile_path = profile_path
        self.clock, self.sleep = clock, sleep
        # (a step's outputs, its start, its end; `llm.last_step` is the step): a P/D instance's proxy and record
        self.on_step = on_step

    def run(self, requests: Sequence[ReplayRequest] | Arrivals) -> ReplayLog:
        llm = self.llm
        source = ListArrivals(requests, self.sleep) if isinstance(requests, Sequence) else requests
        profiler = None if self.profile_path is None else StepProfiler(self.profile_path, {
            **llm.profile_meta, "replay": True})
        try:
            log = self._serve(source, profiler)
        except BaseException:
            if profiler is not None:
                profiler.discard()
            raise
        if profiler is not None:
            profiler.close()
        return log

    def _serve(self, source: Arrivals, profiler: StepProfiler | None) -> ReplayLog:
        llm, sched, connector = self.llm, self.llm.scheduler, self.llm.kv_connector
        origin, now = source.origin(self.clock)  # now: the end of the last step on the trace clock

        def now_s() -> float:
            return self.clock() - origin

        def engine_event() -> float | None:
            at = None if connector is None else connector.next_event_s()
            return None if at is None else at - origin

        live: dict[str, SequenceTiming] = {}
        done: list[SequenceTiming] = []
        rejected: list[tuple[int, str]] = []
        series: list[tuple] = []
        next_sample = 0.0
        usage_seconds = peak = busy = 0.0
        steps = 0
        idle = False  # P/D: the last step computed nothing; the next starts at the next event
        while not source.closed() or llm.has_unfinished_requests() or llm.holds_kv_for_remote:
            if idle or not llm.has_unfinished_requests():
                start = source.wait(now, now_s, engine_event if connector is not None else None)
                if start is None:
                    break
                idle = False
            else:
                start = now
            if connector is not None:
                connector.cut_s = origin + start
            for request in source.due(start):
                self._admit(request, live, rejected)
            if not llm.has_unfinished_requests():
                llm.release_read_kv()  # P/D: exports read while idle are freed (the simulator frees them then)
                now = start
                continue
            if start >= next_sample:
                series.append(self._sample(start))
                next_sample = (math.floor(start / self.sample_interval_s) + 1) * self.sample_interval_s \
                    if self.sample_interval_s else math.inf
            outputs = llm.step()
            end = now_s()
            trace = llm.last_step
            if connector is not None and trace.output.is_empty and not trace.output.preempted:
                idle, now = True, start  # only transfers pending: no time passes (sim.replica does the same)
                if self.on_step is not None:
                    self.on_step(outputs, start, start)
                continue
            steps += 1
            busy += end - start
            usage_seconds += trace.kv_usage * (end - start)
            peak = max(peak, trace.kv_usage)
            self._stamp(trace, live, done, start, end)
            if profiler is not None:
                profiler.record(trace.output, llm.kv_cache.layout.block_size, trace.times_s, trace.update.spec,
                                start_s=start, end_s=end)
            if self.on_step is not None:
                self.on_step(outputs, start, end)
            now = end
        m = sched.kv_metrics()
        counters = {k: int(m[k]) for k in ("prefix_cache_queries", "prefix_cache_hits", "num_preemptions",
                                           "num_evicted_blocks", "num_rejected")}
        # the prefix tiers' counters, as the simulator's replica reports them (absent: the run had no such tier)
        counters.update((k, int(m[k])) for k in TIER_COUNTER_KEYS if m[k] is not None)
        if llm.spec is not None:  # speculative decoding: vLLM's SpecDecodingStats counters (the simulator's keys)
            stats = sched.stats
            counters.update(num_drafts=stats.num_drafts, num_draft_tokens=stats.num_draft_tokens,
                            num_accepted_tokens=stats.num_accepted_tokens)
        return ReplayLog(done, series, rejected, counters, usage_seconds, peak, steps, busy, llm.num_kv_blocks,
                         llm.kv_cache.layout.block_size)

    def _admit(self, request: ReplayRequest, live: dict[str, SequenceTiming], rejected: list) -> None:
        rid = str(request.row)
        params = SamplingParams(temperature=self.temperature, max_tokens=request.max_tokens, n=request.n,
                                ignore_eos=True, seed=self.seed * 1_000_003 + request.row)
        try:
            self.llm.add_request(request.prompt_token_ids, params, request_id=rid, arrival_s=request.arrival_s,
                                 priority=request.priority, kv_transfer_params=request.kv_transfer_params,
                                 lora=request.lora)
        except ValueError as exc:
            rejected.append((request.row, str(exc)))
            return
        live[rid] = SequenceTiming(request.row, 0, request.arrival_s, token_times_s=[],
                                   prompt_tokens=len(request.prompt_token_ids))

    def _stamp(self, trace, live: dict[str, SequenceTiming], done: list[SequenceTiming], start: float,
               end: float) -> None:
        for item in trace.output.scheduled:
            seq = live[item.request_id]
            if seq.first_scheduled_s != seq.first_scheduled_s:  # NaN: first time scheduled
                seq.first_scheduled_s = start
            if item.samples:
                verified = trace.update.spec.get(item.request_id)  # speculative decoding: 1 + accepted tokens
                if verified is None:
                    seq.token_times_s.append(end)
                else:
                    seq.token_times_s.extend([end] * (verified[1] + 1))
                    seq.spec_steps = [*(seq.spec_steps or []), verified]
                seq.last_token_s = end
        for child in trace.update.forked:
            parent = live[child.parent_id]
            sample = sample_index(child.request_id)
            # A sibling that found no room (reservation allocators) samples its first token after a recompute.
            first = [end] if child.status in (RequestStatus.RUNNING, RequestStatus.FINISHED) else []
            live[child.request_id] = SequenceTiming(parent.row, sample, parent.arrival_s, parent.first_scheduled_s,
                                                    token_times_s=first, prompt_tokens=parent.prompt_tokens)
        for request in trace.update.finished:
            seq = live.pop(request.request_id)
            seq.last_token_s = end  # the finish
            seq.output_tokens = request.num_output_tokens
            if seq.spec_steps is not None:  # a stop inside an accepted run dropped the tokens after it
                del seq.token_times_s[seq.output_tokens:]
            seq.cached_prompt_tokens = request.num_cached_tokens
            seq.preemptions = request.num_preemptions
            done.append(seq)

    def _sample(self, now: float) -> tuple:
        sched = self.llm.scheduler
        m = sched.kv_metrics()
        return (now, len(sched.running), len(sched.waiting), len(sched.swapped), *(m[k] for k in SERIES_KEYS))
