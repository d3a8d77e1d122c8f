"""Is a probe in steady state? The verdict a probe gets before its SLOs are read.

A finite run of an overloaded server can pass a percentile SLO: its backlog has not grown long enough yet. So
every steady-state probe is judged first from signals measured over its measurement window (stored with it):

    overloaded   the run was stopped early by the overload check (the waiting queue held more than
                 `overload_wait_s` of arrivals), or more than 5% of the requests that arrived in the window had
                 not finished by the end of the grace period
    backlogged   more than 1% of the window's requests unfinished, or the p99 scheduling delay (arrival to
                 first scheduled) of the window's requests above `max_queue_delay_s` (5 s: Vidur-Search's
                 stability bound; open loops only - a closed loop's queue is bounded by its users), or the
                 waiting queue grew - its mean over the window's second half above 1.5x the first half's plus
                 2 s of the offered rate - or TTFT grew - the median TTFT of requests arriving in the second half
                 above 2x the first half's plus 250 ms
    stable       none of these

A probe that is not stable fails whatever its percentiles say. The margins (2 s of arrivals, 250 ms) keep the
bursts of a stable server (gamma arrivals with the trace's CV) from reading as growth; a server beyond
capacity grows its queue by (rate - capacity) x t, so over a 600 s probe even 1% too much load exceeds them.
Near saturation a queue can also wander without a clear trend; the scheduling-delay bound catches that, and it
rises monotonically with load where the trend signals are noisy.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

OVERLOADED_UNFINISHED = 0.05
BACKLOGGED_UNFINISHED = 0.01
QUEUE_GROWTH, QUEUE_MARGIN_S = 1.5, 2.0
TTFT_GROWTH, TTFT_MARGIN_MS = 2.0, 250.0


@dataclass(slots=True)
class ProbeSignals:
    """What the verdict is read from; every count is of requests (a sampled request counts once)."""

    window_s: tuple[float, float]  # the measurement window [start, end) in simulated seconds
    stopped_s: float  # when the run ended
    sent: int  # requests that arrived before the run ended
    warmup_requests: int  # ... arriving before the window (served, not measured)
    measured_requests: int  # ... arriving inside it
    cooldown_requests: int  # ... arriving after it (served, not measured)
    completed_measured: int  # measured requests that finished
    rejected_measured: int  # measured requests the scheduler refused (longer than the cache can hold)
    unfinished_requests: int  # sent, neither finished nor rejected when the run ended (every phase)
    queue_first: float  # mean waiting requests (all replicas) over the window's first half
    queue_second: float  # ... and its second half
    ttft_first_ms: float  # median TTFT of measured requests arriving in the first half (NaN: none)
    ttft_second_ms: float
    p99_queue_delay_ms: float  # p99 of arrival -> first scheduled over the measured requests (NaN: none)
    offered_rps: float  # requests offered per second of the window, sent or not (probe.offered_rate)
    stopped_early: str = ""  # why the overload check stopped the run ("" when it did not)

    @property
    def unfinished_measured_fraction(self) -> float:
        served = self.measured_requests - self.rejected_measured
        return 1.0 - self.completed_measured / served if served > 0 else 0.0

    def as_dict(self) -> dict:
        out = asdict(self)
        out["window_s"] = list(self.window_s)
        out["unfinished_measured_fraction"] = self.unfinished_measured_fraction
        return out


def judge(s: ProbeSignals, max_queue_delay_s: float = 5.0) -> tuple[str, list[str]]:
    """(verdict, the reasons it is not stable)."""
    unfinished = s.unfinished_measured_fraction
    overloaded = []
    if s.stopped_early:
        overloaded.append(f"stopped early: {s.stopped_early}")
    if unfinished > OVERLOADED_UNFINISHED:
        overloaded.append(f"{unfinished:.1%} of the window's requests unfinished > {OVERLOADED_UNFINISHED:.0%}")
    if overloaded:
        return "overloaded", overloaded
    backlogged = []
    if unfinished > BACKLOGGED_UNFINISHED:
        backlogged.append(f"{unfinished:.1%} of the window's requests unfinished > {BACKLOGGED_UNFINISHED:.0%}")
    if math.isfinite(s.p99_queue_delay_ms) and s.p99_queue_delay_ms > max_queue_delay_s * 1e3:
        backlogged.append(f"p99 scheduling delay {s.p99_queue_delay_ms / 1e3:.3g} s > {max_queue_delay_s:g} s")
    queue_bound = QUEUE_GROWTH * s.queue_first + QUEUE_MARGIN_S * s.offered_rps
    if s.queue_second > queue_bound:
        backlogged.append(f"waiting queue grew: {s.queue_first:.3g} -> {s.queue_second:.3g} requests "
                          f"(> {queue_bound:.3g})")
    if math.isfinite(s.ttft_first_ms) and math.isfinite(s.ttft_second_ms):
        ttft_bound = TTFT_GROWTH * s.ttft_first_ms + TTFT_MARGIN_MS
        if s.ttft_second_ms > ttft_bound:
            backlogged.append(f"median TTFT grew: {s.ttft_first_ms:.4g} -> {s.ttft_second_ms:.4g} ms "
                              f"(> {ttft_bound:.4g})")
    return ("backlogged", backlogged) if backlogged else ("stable", [])
