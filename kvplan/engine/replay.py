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
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

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


class LiveReplay:
    def __init__(self, llm: LLM, *, temperature: float = 1.0, seed: int = 0, sample_interval_s: float = 0.0,
                 profile_path: str | Path | None = None, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.llm = llm
        self.temperature, self.seed = temperature, seed
        self.sample_interval_s = sample_interval_s
        self.profile_path = profile_path
        self.clock, self.sleep = clock, sleep

    def run(self, requests: Sequence[ReplayRequest]) -> ReplayLog:
        llm = self.llm
        profiler = None if self.profile_path is None else StepProfiler(self.profile_path, {
            **llm.profile_meta, "replay": True})
        try:
            log = self._serve(requests, profiler)
        except BaseException:
            if profiler is not None:
                profiler.discard()
            raise
        if profiler is not None:
            profiler.close()
        return log

    def _serve(self, requests: Sequence[ReplayRequest], profiler: StepProfiler | None) -> ReplayLog:
        llm, sched = self.llm, self.llm.scheduler
        if any(b.arrival_s < a.arrival_s for a, b in pairwise(requests)):
            raise ValueError("replay: requests must be sorted by arrival_s")
        t0 = requests[0].arrival_s if requests else 0.0
        origin = self.clock() - t0
        live: dict[str, SequenceTiming] = {}
        done: list[SequenceTiming] = []
        rejected: list[tuple[int, str]] = []
        series: list[tuple] = []
        next_sample = 0.0
        usage_seconds = peak = busy = 0.0
        steps = 0
        now = t0  # the end of the last step on the trace clock
        i = 0
        while i < len(requests) or llm.has_unfinished_requests():
            if not llm.has_unfinished_requests():
                start = max(now, requests[i].arrival_s)
                wait = start - (self.clock() - origin)
                if wait > 0:
                    self.sleep(wait)
            else:
                start = now
            while i < len(requests) and requests[i].arrival_s <= start:
                self._admit(requests[i], live, rejected)
                i += 1
            if not llm.has_unfinished_requests():
                now = start
                continue
            if start >= next_sample:
                series.append(self._sample(start))
                next_sample = (math.floor(start / self.sample_interval_s) + 1) * self.sample_interval_s \
                    if self.sample_interval_s else math.inf
            llm.step()
            end = self.clock() - origin
            trace = llm.last_step
            steps += 1
            busy += end - start
            usage_seconds += trace.kv_usage * (end - start)
            peak = max(peak, trace.kv_usage)
            self._stamp(trace, live, done, start, end)
            if profiler is not None:
                profiler.record(trace.output, llm.kv_cache.layout.block_size, trace.times_s, start_s=start,
                                end_s=end)
            now = end
        m = sched.kv_metrics()
        counters = {k: int(m[k]) for k in ("prefix_cache_queries", "prefix_cache_hits", "num_preemptions",
                                           "num_evicted_blocks", "num_rejected")}
        # the prefix tiers' counters, as the simulator's replica reports them (absent: the run had no such tier)
        counters.update((k, int(m[k])) for k in TIER_COUNTER_KEYS if m[k] is not None)
        return ReplayLog(done, series, rejected, counters, usage_seconds, peak, steps, busy, llm.num_kv_blocks,
                         llm.kv_cache.layout.block_size)

    def _admit(self, request: ReplayRequest, live: dict[str, SequenceTiming], rejected: list) -> None:
        rid = str(request.row)
        params = SamplingParams(temperature=self.temperature, max_tokens=request.max_tokens, n=request.n,
                                ignore_eos=True, seed=self.seed * 1_000_003 + request.row)
        try:
            self.llm.add_request(request.prompt_token_ids, params, request_id=rid, arrival_s=request.arrival_s,
                                 priority=request.priority)
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
                seq.token_times_s.append(end)
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
            seq.cached_prompt_tokens = request.num_cached_tokens
            seq.preemptions = request.num_preemptions
            done.append(seq)

    def _sample(self, now: float) -> tuple:
        sched = self.llm.scheduler
        m = sched.kv_metrics()
        return (now, len(sched.running), len(sched.waiting), len(sched.swapped), *(m[k] for k in SERIES_KEYS))
