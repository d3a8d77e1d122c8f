"""Is a probe in steady state? The verdict a probe gets before its SLOs are read.

A finite run of an overloaded server can pass a percentile SLO: its backlog has not grown long enough yet. So
every steady-state probe is judged first from signals measured over its measurement window (stored with it),
against bounds the experiment's `probe:` section sets (`Bounds`; defaults in brackets, from `sim.probe.Probe`):

    overloaded   the run was stopped early by the overload check (the waiting queue held more than
                 `overload_wait_s` [30 s] of arrivals), or more than `max_unfinished_overloaded` [5%] of the
                 requests that arrived in the window had not finished by the end of the grace period
    backlogged   more than `max_unfinished_backlogged` [1%] of the window's requests unfinished, or the p99
                 scheduling delay (arrival to first scheduled) of the window's requests above `max_queue_delay_s`
                 [5 s: Vidur-Search's stability bound; open loops only - a closed loop's queue is bounded by its
                 users], or the waiting queue grew - its mean over the window's second half above `queue_growth`
                 [1.5] x the first half's plus `queue_margin_s` [2 s] of the offered rate - or TTFT grew - the
                 median TTFT of requests arriving in the second half above `ttft_growth` [2] x the first half's
                 plus `ttft_margin_ms` [250 ms]
    stable       none of these

A probe that is not stable fails whatever its percentiles say. The margins (2 s of arrivals, 250 ms) keep the
bursts of a stable server (gamma arrivals with the trace's CV) from reading as growth; a server beyond
capacity grows its queue by (rate - capacity) x t, so over a 600 s probe even 1% too much load exceeds them.
Near saturation a queue can also wander without a clear trend; the scheduling-delay bound catches that, and it
rises monotonically with load where the trend signals are noisy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

FRACTIONS = ("max_unfinished_overloaded", "max_unfinished_backlogged")  # bounds shown as percentages


@dataclass(frozen=True, slots=True)
class Bounds:
    """The bounds `breaches` holds a probe to: the probe settings of the same names (declared, with their
    defaults, once in `sim.probe.Probe` and the experiment schema's PROBE). `max_queue_delay_s` is inf on a
    closed loop (no scheduling-delay gate)."""

    max_unfinished_overloaded: float  # a share of the window's served requests
    max_unfinished_backlogged: float
    max_queue_delay_s: float
    queue_growth: float  # the second half's mean queue over the first half's
    queue_margin_s: float  # seconds of the offered rate added to the queue bound
    ttft_growth: float  # the second half's median TTFT over the first half's
    ttft_margin_ms: float

    @classmethod
    def of(cls, settings: Mapping[str, Any], open_loop: bool = True) -> Bounds:
        """The bounds among a probe's settings (a `Probe` as a dict, or an experiment's `probe:` section)."""
        values = {f.name: float(settings[f.name]) for f in fields(cls)}
        if not open_loop:
            values["max_queue_delay_s"] = math.inf
        return cls(**values)


def shown(settings: Mapping[str, Any]) -> dict[str, str]:
    """A probe's settings as a gate's text quotes them: shares as percentages, numbers short."""
    return {k: f"{v * 100:.4g}%" if k in FRACTIONS else f"{v:g}" if isinstance(v, float | int) else str(v)
            for k, v in settings.items()}


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
    `short` the condition it holds to, `rule` what fails it in full; `key` the experiment file's settings that
    set its bound. `short` and `rule` quote the probe's settings as format fields (`text`)."""

    name: str
    verdict: str  # what a probe that fails it is: overloaded or backlogged
    key: str
    short: str
    rule: str

    def text(self, settings: Mapping[str, Any]) -> tuple[str, str]:
        """(short, rule) with the values of `settings` (a probe's) in force."""
        values = shown(settings)
        return self.short.format(**values), self.rule.format(**values)


# Every stability gate, in the order `judge` checks them.
STOPPED_EARLY = Gate("overload stop", "overloaded", "probe.overload_wait_s",
                     "overload stop at {overload_wait_s} s of queued arrivals",
                     "the overload check stopped the run: a replica's waiting queue held more than "
                     "{overload_wait_s} s of its arrivals")
UNFINISHED_OVERLOADED = Gate("unfinished (overload)", "overloaded", "probe.max_unfinished_overloaded",
                             "unfinished <= {max_unfinished_overloaded}",
                             "more than {max_unfinished_overloaded} of the window's requests unfinished")
UNFINISHED_BACKLOGGED = Gate("unfinished (backlog)", "backlogged", "probe.max_unfinished_backlogged",
                             "unfinished <= {max_unfinished_backlogged}",
                             "more than {max_unfinished_backlogged} of the window's requests unfinished")
QUEUE_DELAY = Gate("p99 scheduling delay", "backlogged", "probe.max_queue_delay_s",
                   "p99 scheduling delay <= {max_queue_delay_s} s",
                   "the p99 scheduling delay (arrival to first scheduled) above {max_queue_delay_s} s (open loops "
                   "only)")
QUEUE_GREW = Gate("waiting queue grew", "backlogged", "probe.queue_growth, probe.queue_margin_s",
                  "queue growth <= {queue_growth}x + {queue_margin_s} s of arrivals",
                  "the waiting queue's mean over the window's second half above {queue_growth}x the first "
                  "half's + {queue_margin_s} s of arrivals")
TTFT_GREW = Gate("median TTFT grew", "backlogged", "probe.ttft_growth, probe.ttft_margin_ms",
                 "TTFT growth <= {ttft_growth}x + {ttft_margin_ms} ms",
                 "the median TTFT of the second half's arrivals above {ttft_growth}x the first half's + "
                 "{ttft_margin_ms} ms")
GATES = (STOPPED_EARLY, UNFINISHED_OVERLOADED, UNFINISHED_BACKLOGGED, QUEUE_DELAY, QUEUE_GREW, TTFT_GREW)


@dataclass(slots=True)
class Breach:
    """A gate a probe failed: the measured value against its bound (same unit; NaN when the gate is an event,
    the overload stop) and the sentence `judge` reports."""

    gate: Gate
    value: float
    bound: float
    reason: str


def breaches(s: ProbeSignals, bounds: Bounds) -> list[Breach]:
    """Every gate of `GATES` the probe fails, in their order."""
    unfinished = s.unfinished_measured_fraction
    out = []
    if s.stopped_early:
        out.append(Breach(STOPPED_EARLY, math.nan, math.nan, f"stopped early: {s.stopped_early}"))
    for gate, share in ((UNFINISHED_OVERLOADED, bounds.max_unfinished_overloaded),
                        (UNFINISHED_BACKLOGGED, bounds.max_unfinished_backlogged)):
        if unfinished > share:
            out.append(Breach(gate, unfinished, share, f"{unfinished:.1%} of the window's requests unfinished > "
                                                       f"{share * 100:.4g}%"))
    delay_s = bounds.max_queue_delay_s
    if math.isfinite(s.p99_queue_delay_ms) and s.p99_queue_delay_ms > delay_s * 1e3:
        out.append(Breach(QUEUE_DELAY, s.p99_queue_delay_ms / 1e3, delay_s,
                          f"p99 scheduling delay {s.p99_queue_delay_ms / 1e3:.3g} s > {delay_s:g} s"))
    queue_bound = bounds.queue_growth * s.queue_first + bounds.queue_margin_s * s.offered_rps
    if s.queue_second > queue_bound:
        out.append(Breach(QUEUE_GREW, s.queue_second, queue_bound,
                          f"waiting queue grew: {s.queue_first:.3g} -> {s.queue_second:.3g} requests "
                          f"(> {queue_bound:.3g})"))
    if math.isfinite(s.ttft_first_ms) and math.isfinite(s.ttft_second_ms):
        ttft_bound = bounds.ttft_growth * s.ttft_first_ms + bounds.ttft_margin_ms
        if s.ttft_second_ms > ttft_bound:
            out.append(Breach(TTFT_GREW, s.ttft_second_ms, ttft_bound,
                              f"median TTFT grew: {s.ttft_first_ms:.4g} -> {s.ttft_second_ms:.4g} ms "
                              f"(> {ttft_bound:.4g})"))
    return out


def judge(s: ProbeSignals, bounds: Bounds) -> tuple[str, list[str]]:
    """(verdict, the reasons it is not stable): overloaded when an overloaded gate fails (its reasons only),
    else backlogged when any gate fails."""
    failed = breaches(s, bounds)
    for verdict in ("overloaded", "backlogged"):
        reasons = [b.reason for b in failed if b.gate.verdict == verdict]
        if reasons:
            return verdict, reasons
    return "stable", []
