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


@dataclass(frozen=True, slots=True)
class Gate:
    """One check a steady-state probe must pass to be stable, as an answer names it: `name` when it fails,
    `short` the condition it holds to, `rule` what fails it in full; `key` is the experiment file's setting that
    sets its bound ("" when the bound is fixed here). `short` and `rule` take the probe's settings as format
    fields."""

    name: str
    verdict: str  # what a probe that fails it is: overloaded or backlogged
    key: str
    short: str
    rule: str


# Every stability gate, in the order `judge` checks them. The fixed bounds are the constants above.
STOPPED_EARLY = Gate("overload stop", "overloaded", "probe.overload_wait_s",
                     "overload stop at {overload_wait_s:g} s of queued arrivals",
                     "the overload check stopped the run: a replica's waiting queue held more than "
                     "{overload_wait_s:g} s of its arrivals")
UNFINISHED_OVERLOADED = Gate("unfinished > 5%", "overloaded", "", f"unfinished <= {OVERLOADED_UNFINISHED:.0%}",
                             f"more than {OVERLOADED_UNFINISHED:.0%} of the window's requests unfinished")
UNFINISHED_BACKLOGGED = Gate("unfinished > 1%", "backlogged", "", f"unfinished <= {BACKLOGGED_UNFINISHED:.0%}",
                             f"more than {BACKLOGGED_UNFINISHED:.0%} of the window's requests unfinished")
QUEUE_DELAY = Gate("p99 scheduling delay", "backlogged", "probe.max_queue_delay_s",
                   "p99 scheduling delay <= {max_queue_delay_s:g} s",
                   "the p99 scheduling delay (arrival to first scheduled) above {max_queue_delay_s:g} s (open loops "
                   "only)")
QUEUE_GREW = Gate("waiting queue grew", "backlogged", "", "waiting queue not growing",
                  f"the waiting queue's mean over the window's second half above {QUEUE_GROWTH:g}x the first "
                  f"half's + {QUEUE_MARGIN_S:g} s of arrivals")
TTFT_GREW = Gate("median TTFT grew", "backlogged", "", "median TTFT not growing",
                 f"the median TTFT of the second half's arrivals above {TTFT_GROWTH:g}x the first half's + "
                 f"{TTFT_MARGIN_MS:g} ms")
GATES = (STOPPED_EARLY, UNFINISHED_OVERLOADED, UNFINISHED_BACKLOGGED, QUEUE_DELAY, QUEUE_GREW, TTFT_GREW)


@dataclass(slots=True)
class Breach:
    """A gate a probe failed: the measured value against its bound (same unit; NaN when the gate is an event,
    the overload stop) and the sentence `judge` reports."""

    gate: Gate
    value: float
    bound: float
    reason: str


def breaches(s: ProbeSignals, max_queue_delay_s: float = 5.0) -> list[Breach]:
    """Every gate of `GATES` the probe fails, in their order."""
    unfinished = s.unfinished_measured_fraction
    out = []
    if s.stopped_early:
        out.append(Breach(STOPPED_EARLY, math.nan, math.nan, f"stopped early: {s.stopped_early}"))
    if unfinished > OVERLOADED_UNFINISHED:
        out.append(Breach(UNFINISHED_OVERLOADED, unfinished, OVERLOADED_UNFINISHED,
                          f"{unfinished:.1%} of the window's requests unfinished > {OVERLOADED_UNFINISHED:.0%}"))
    if unfinished > BACKLOGGED_UNFINISHED:
        out.append(Breach(UNFINISHED_BACKLOGGED, unfinished, BACKLOGGED_UNFINISHED,
                          f"{unfinished:.1%} of the window's requests unfinished > {BACKLOGGED_UNFINISHED:.0%}"))
    if math.isfinite(s.p99_queue_delay_ms) and s.p99_queue_delay_ms > max_queue_delay_s * 1e3:
        out.append(Breach(QUEUE_DELAY, s.p99_queue_delay_ms / 1e3, max_queue_delay_s,
                          f"p99 scheduling delay {s.p99_queue_delay_ms / 1e3:.3g} s > {max_queue_delay_s:g} s"))
    queue_bound = QUEUE_GROWTH * s.queue_first + QUEUE_MARGIN_S * s.offered_rps
    if s.queue_second > queue_bound:
        out.append(Breach(QUEUE_GREW, s.queue_second, queue_bound,
                          f"waiting queue grew: {s.queue_first:.3g} -> {s.queue_second:.3g} requests "
                          f"(> {queue_bound:.3g})"))
    if math.isfinite(s.ttft_first_ms) and math.isfinite(s.ttft_second_ms):
        ttft_bound = TTFT_GROWTH * s.ttft_first_ms + TTFT_MARGIN_MS
        if s.ttft_second_ms > ttft_bound:
            out.append(Breach(TTFT_GREW, s.ttft_second_ms, ttft_bound,
                              f"median TTFT grew: {s.ttft_first_ms:.4g} -> {s.ttft_second_ms:.4g} ms "
                              f"(> {ttft_bound:.4g})"))
    return out


def judge(s: ProbeSignals, max_queue_delay_s: float = 5.0) -> tuple[str, list[str]]:
    """(verdict, the reasons it is not stable): overloaded when an overloaded gate fails (its reasons only),
    else backlogged when any gate fails."""
    failed = breaches(s, max_queue_delay_s)
    for verdict in ("overloaded", "backlogged"):
        reasons = [b.reason for b in failed if b.gate.verdict == verdict]
        if reasons:
            return verdict, reasons
    return "stable", []
