"""Steady-state workloads drawn from a trace's population, at any rate and for any duration.

A trace is read as a population of *sessions* (the requests sharing a `session_id`, turns in arrival order; a
request without one is a session of its own). A sustained workload at rate λ draws sessions from that
population, with replacement, and starts them as an open-loop arrival process at λ / (requests per session)
sessions per second; each session's turns keep their delays after its first request. Its length is a duration,
whatever the rate - never a fixed set of requests squeezed into a shorter window.

Prefix identity survives the copying. A hash id that occurs in two or more sessions of the population is
*shared* (a system prompt, a few-shot template) and stays as it is in every copy; an id that occurs in one
session only is *private* (the conversation itself) and gets a fresh value in each drawn copy, so a copy shares
its own earlier turns but not another copy's conversation. Reuse per second therefore matches the trace's
instead of multiplying (copies sharing each other's conversations) or vanishing (everything made unique).

Arrivals (`ARRIVALS`): `measured` (the default) is a gamma renewal process with the CV of the trace's session
start gaps (Poisson when the trace has too few sessions or no timestamps); `poisson`; `tiled` repeats the trace's
own session start gaps, scaled to the rate, from a seeded starting point. Draws go through two generators
spawned from the seed - one for the gaps, one for the sessions - consumed in fixed-size blocks, so that probes
of one seed at different rates see the same sessions in the same order with proportionally scaled gaps
(common random numbers: a rate search compares like with like).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from kvplan.errors import UserError
from kvplan.traces.arrivals import MAX_CV, MIN_CV
from kvplan.traces.schema import NO_VALUE, LoadReport, Trace, gather_segments, offsets_from_counts

ARRIVALS = ("measured", "poisson", "tiled")
DRAW_BLOCK = 4096  # draws per generator call: a prefix of the stream never depends on how much is drawn
MAX_PROBE_REQUESTS = 5_000_000  # one probe's requests (memory: a few arrays of this length)


@dataclass(slots=True)
class Population:
    """A trace's requests grouped into sessions, with what a copy of a session needs."""

    trace: Trace
    order: np.ndarray  # trace rows grouped by session, turns in arrival order
    offsets: np.ndarray  # session s owns order[offsets[s]:offsets[s + 1]]
    delays: np.ndarray  # per entry of `order`: arrival after its session's first request (0 untimed)
    private: np.ndarray | None  # per hash position of the trace: the id occurs in one session only
    start_gaps: np.ndarray  # gaps between consecutive session starts, in start order
    stride: int  # added once per copy to a private id: larger than every id of the trace
    # The trace's ids name their prefixes (`hash_ids_name_prefixes`), and so do every copy's: its private ids move
    # into a range of their own (ids >= 0, so that each copy's range lies above every id of the trace) - the
    # simulator then keys blocks by their ids (engine.core.block_keys)
    hash_ids_named: bool = False

    @property
    def sessions(self) -> int:
        return len(self.offsets) - 1

    @property
    def requests_per_session(self) -> float:
        return len(self.order) / self.sessions

    @property
    def measured_cv(self) -> float | None:
        """The CV of the session start gaps, None when there are too few (or no timestamps)."""
        gaps = self.start_gaps
        if not self.trace.timed or len(gaps) < 2 or gaps.mean() <= 0:
            return None
        return float(np.clip(gaps.std() / gaps.mean(), MIN_CV, MAX_CV))

    @property
    def mean_rate(self) -> float | None:
        """The trace's own request rate (requests per second over its arrival span), None when untimed."""
        span = float(self.trace.arrival_s[-1] - self.trace.arrival_s[0]) if len(self.trace) > 1 else 0.0
        return len(self.trace) / span if self.trace.timed and span > 0 else None

    def materialize(self, entries: np.ndarray, copies: np.ndarray, arrival_s: np.ndarray,
                    note: str) -> Trace:
        """The requests at `entries` (indices into `order`) as copy `copies[i]` of their session, arriving at
        `arrival_s`, in the order given. Copy c of a session has session id c; private hash ids get
        `id + (c + 1) * stride`."""
        rows = self.order[entries]
        out = self.trace.take(rows)
        out.arrival_s = np.ascontiguousarray(arrival_s, dtype=np.float64)
        out.request_id = np.arange(len(rows), dtype=np.int64)
        out.session_id = np.ascontiguousarray(copies, dtype=np.int64)
        out.timed = True
        if self.private is not None:
            private, _ = gather_segments(self.private, self.trace.hash_offsets, rows)
            copy_of_hash = np.repeat(out.session_id, np.diff(out.hash_offsets))
            out.hash_ids = np.where(private, out.hash_ids + (copy_of_hash + 1) * self.stride, out.hash_ids)
        report = LoadReport(source=self.trace.report.source, format=self.trace.report.format,
                            notes=[*self.trace.report.notes, note])
        return replace(out, report=report)


def population(trace: Trace) -> Population:
    """Group a trace into sessions and classify its hash ids as shared or private."""
    if len(trace) == 0:
        raise UserError("the trace has no requests to draw a workload from")
    size = len(trace)
    # A request without a session is its own session: give it a key no real session id has.
    keys = np.where(trace.session_id == NO_VALUE, -(np.arange(size, dtype=np.int64) + 2), trace.session_id)
    order = np.lexsort((np.arange(size), trace.arrival_s, keys))  # by session, then arrival, then row
    sorted_keys = keys[order]
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
    offsets = np.r_[starts, size].astype(np.int64)
    counts = np.diff(offsets)
    first = trace.arrival_s[order[starts]]
    delays = trace.arrival_s[order] - np.repeat(first, counts) if trace.timed else np.zeros(size)
    # Sessions in start order (by first arrival): their gaps are the session arrival process.
    by_start = np.argsort(first, kind="stable")
    new_offsets = offsets_from_counts(counts[by_start])
    within = np.arange(size) - np.repeat(new_offsets[:-1], counts[by_start])
    session_order = np.repeat(offsets[by_start], counts[by_start]) + within
    order, delays, offsets = order[session_order], delays[session_order], new_offsets
    start_gaps = np.diff(np.sort(first))
    private, stride, named = None, 0, False
    if trace.has_prefix:
        session_of_row = np.empty(size, dtype=np.int64)
        session_of_row[order] = np.repeat(np.arange(len(counts)), counts[by_start])
        session_of_hash = np.repeat(session_of_row, trace.hash_counts())
        ids = trace.hash_ids
        pairs = np.unique(np.stack([ids, session_of_hash]), axis=1)  # each (id, session) once
        unique_ids, sessions_per_id = np.unique(pairs[0], return_counts=True)
        private = sessions_per_id[np.searchsorted(unique_ids, ids)] == 1
        stride = int(ids.max()) + 1 if len(ids) else 1
        named = len(ids) > 0 and int(ids.min()) >= 0 and hash_ids_name_prefixes(trace)
    return Population(trace, order, offsets, delays, private, start_gaps, stride, named)


def hash_ids_name_prefixes(trace: Trace) -> bool:
    """Whether every prefix hash id of the trace names its whole prefix: wherever an id occurs, it is a request's
    first, or follows the same id (so, by induction, the same ids come before it) - Mooncake's convention, where an
    id numbers a distinct prefix block. Two requests then share their first k blocks exactly when their k-th ids
    are equal, which lets the block keys be the ids themselves (engine.core.block_keys)."""
    ids, offsets = trace.hash_ids, trace.hash_offsets
    if ids is None or offsets is None:
        return False
    first = np.zeros(len(ids), dtype=np.int64)
    first[offsets[:-1][np.diff(offsets) > 0]] = 1
    before = np.where(first == 1, 0, np.r_[0, ids[:-1]])  # (a first id's "before" is `first` = 1 alone)
    occurrences = np.unique(np.stack([ids, before, first]), axis=1)  # each distinct (id, id before, first)
    return len(np.unique(occurrences[0])) == occurrences.shape[1]


def _blocks(draw, count: int) -> np.ndarray:
    """`count` values from `draw(DRAW_BLOCK)` calls: the first k values never depend on `count`."""
    parts, have = [], 0
    while have < count:
        parts.append(draw(DRAW_BLOCK))
        have += DRAW_BLOCK
    return np.concatenate(parts)[:count] if parts else np.zeros(0)


def session_starts(pop: Population, session_rate: float, duration_s: float, arrivals: str,
                   rng: np.random.Generator) -> np.ndarray:
    """Start times in [0, duration_s) of a session arrival process at `session_rate` per second."""
    if arrivals not in ARRIVALS:
        raise UserError(f"unknown arrivals {arrivals!r}; allowed: {', '.join(ARRIVALS)}")
    expected = session_rate * duration_s
    count = int(expected + 6 * np.sqrt(expected) * MAX_CV + 16)
    if count > MAX_PROBE_REQUESTS:
        raise UserError(f"{expected:.3g} sessions in {duration_s:g} s at {session_rate:.3g} sessions/s; allowed: "
                         f"at most {MAX_PROBE_REQUESTS} in one probe (lower the rate or the duration)")
    cv = pop.measured_cv if arrivals == "measured" else 1.0
    gaps_ok = arrivals == "tiled" and len(pop.start_gaps) >= 1 and pop.start_gaps.mean() > 0
    while True:
        if gaps_ok:
            unit = pop.start_gaps / pop.start_gaps.mean()
            first = int(rng.integers(len(unit)))
            gaps = np.resize(np.roll(unit, -first), count)
        else:
            shape = 1.0 / (cv * cv) if cv else 1.0
            gaps = _blocks(lambda k, s=shape: rng.gamma(s, 1.0 / s, size=k), count)
        starts = np.cumsum(gaps) - gaps[0]
        starts = starts / session_rate
        if starts[-1] >= duration_s or count >= MAX_PROBE_REQUESTS:
            return starts[starts < duration_s]
        count *= 2  # a long quiet stretch: draw more (the first `count` draws are unchanged)


def open_loop(pop: Population, rate_rps: float, duration_s: float, seed: int, arrivals: str = "measured") -> Trace:
    """A sustained workload: sessions of the population arriving at `rate_rps` requests per second for
    `duration_s` seconds (requests that would arrive before 0 or after the end are not sent)."""
    if not (np.isfinite(rate_rps) and rate_rps > 0):
        raise UserError(f"rate {rate_rps!r}; allowed: a finite number of requests per second > 0")
    gap_rng, pick_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    # Stationary from t = 0: sessions also start up to the longest session's span before 0, and only their
    # requests arriving in [0, duration_s) are sent - so the request rate is the asked rate from the start,
    # not a ramp while the first sessions' later turns have yet to come.
    lead = float(pop.delays.max()) if len(pop.delays) else 0.0
    starts = session_starts(pop, rate_rps / pop.requests_per_session, duration_s + lead, arrivals, gap_rng) - lead
    chosen = _blocks(lambda k: pick_rng.integers(pop.sessions, size=k), len(starts)).astype(np.int64)
    counts = np.diff(pop.offsets)[chosen]
    copies = np.repeat(np.arange(len(chosen), dtype=np.int64), counts)
    entries = np.repeat(pop.offsets[chosen], counts) + (np.arange(counts.sum()) - np.repeat(
        offsets_from_counts(counts)[:-1], counts))
    arrival = np.repeat(starts, counts) + pop.delays[entries]
    keep = (arrival >= 0) & (arrival < duration_s)
    entries, copies, arrival = entries[keep], copies[keep], arrival[keep]
    if len(entries) > MAX_PROBE_REQUESTS:
        raise UserError(f"{len(entries)} requests in one probe; allowed: at most {MAX_PROBE_REQUESTS}")
    by_time = np.argsort(arrival, kind="stable")
    note = (f"sustained: {len(by_time)} requests of {len(starts)} sessions drawn from {pop.sessions}, "
            f"{rate_rps:.4g} req/s for {duration_s:g} s, {arrivals} arrivals (seed {seed})")
    return pop.materialize(entries[by_time], copies[by_time], arrival[by_time], note)


class SessionDraws:
    """Sessions handed out one at a time (the closed loop's users pick their next one), copy c for the c-th
    draw: the same sequence for a seed however many are drawn."""

    def __init__(self, pop: Population, seed: int) -> None:
        self.pop = pop
        self.rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(3)[2])
        self.drawn = 0
        self._pending: list[int] = []

    def next(self) -> tuple[int, np.ndarray]:
        """(copy number, the session's entries into `pop.order`, turns in order)."""
        if not self._pending:
            self._pending = self.rng.integers(self.pop.sessions, size=DRAW_BLOCK).tolist()[::-1]
        session = self._pending.pop()
        copy, self.drawn = self.drawn, self.drawn + 1
        return copy, np.arange(self.pop.offsets[session], self.pop.offsets[session + 1])
