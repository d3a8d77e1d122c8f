"""Per point: which runs to make, and what they say. A plain point runs once per seed; a search bisects.

    max_rate, max_goodput, max_burst_scale, max_concurrency:
                   low ... [meets] lo ----- mid ----- hi [fails] ... high
                   rates and scales: geometric midpoints, ends when hi / lo <= 1 + tolerance; users: integer
                   midpoints, ends when hi = lo + 1; the answer is lo (the highest value seen to meet)
    min_replicas:  lo [fails] ----- mid ----- hi [meets]; ends when hi = lo + 1; answer = hi

Analytic bounds (`experiments.bound`, for a sustained load searched over its rate or its replicas on a GPU by
name; a disaggregated point's rate bound is the smallest of its pools' and its KV link's): a probe whose verdict
the bound already knows - a rate above the rate bound, fewer replicas than the offered rate needs by it - is
decided to fail without a simulation (never the search's first probe); the other probes are the ones the search
would make without the bound, so the answer is the same. A replica search with a
bound does not bisect [low, high]: it climbs from the bound's fewest replicas (at least `low`) by 1, 2, 4, ...
until a count meets, then bisects the last step - the answer a bisection finds under the assumption below,
without probing the large counts a bisection starts with. The values decided are listed in the answer
(`results.skipped_text`).

A run *meets* when its steady-state probe is stable (`sim.stability`; a burst run has no verdict) and every SLO
holds. With `search.combine: median` (the default) every seed is searched on its own - each seed redraws the
arrivals and the sample of sessions - and the point's capacity is the median of the seeds' answers, reported
with their range; with `combine: all` one search probes every seed at each value and a value meets only if
every seed's run does (the conservative answer).

The first seed of a point searches [low, high] as above; the point's other seeds start from its answer instead
(a guided search): they probe the first seed's bracket, step outwards - by that bracket's ratio (or width),
doubling each time, clamped to [low, high] - until their own answer is bracketed, then bisect to the same
tolerance. Each seed still finds its own answer; it only needs fewer probes to do so.

The model range (`sim.gpu.model_error`): when the source that priced a point's GPU states a step-time band, two
more searches re-find the point's answer with every step's compute time scaled to the band's edges
(`sim.cost.scaled`) - for the recommended point (on a tie, each point tied for best) once every answer is known
(`search.model_range: recommended`, the default), for every point as its first search ends (`every_point`), or
never (`none`); a burst replay has none (`sim.run.simulate` prices steps as the model does). They are kept
cheap: one seed (the first seed's search's seeds: one with `combine: median`, all with `combine: all`), guided by
that search's bracket moved to where the scaled answer is expected (a rate or user count divided by the factor,
replicas multiplied by it), stepping out by that bracket's ratio and bisecting to the same tolerance - two probes
when the guess holds. Their runs carry `step_scale` in their configuration; `results` turns their answers into the
point's range.

Both assume the SLOs hold below some load (above some replica count) and fail beyond it - true of a queueing
system whose latency grows with load; a search whose `low` already fails (or `high` still meets) is reported as
such instead of a number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from kvplan.experiments.bound import PDBound, PointBound, point_bound
from kvplan.experiments.criteria import failures
from kvplan.experiments.pd_block import varied_key
from kvplan.experiments.points import Point, expand, run_config
from kvplan.experiments.schema import INTEGER_TARGETS, REPLICA_TARGETS, Experiment

if TYPE_CHECKING:
    from kvplan.experiments.min_cost import CostPlan


def slo_verdict(exp: Experiment, doc: dict) -> tuple[bool, list[str]]:
    """(meets every SLO and is stable, the reasons it does not) for one run's summary.json: the failures of
    `criteria.failures` in words, the stability gates as one "verdict: reason; reason" line."""
    found = [f for f in failures(exp, doc) if f.kind != "memory"]  # KV memory explains a failure, is none itself
    gates = [f.text for f in found if f.kind == "stability"]
    broken = [f"{doc['probe']['verdict']}: " + "; ".join(gates)] if gates else []
    return not found, broken + [f.text for f in found if f.kind != "stability"]


def describe(target: str, value: object) -> str:
    """A probed value in the user's units."""
    if target in ("max_rate", "max_goodput"):
        return f"{value:.4g} req/s"
    if target == "max_burst_scale":
        return f"rate scale x{value:g}"
    return f"{value} {'users' if target == 'max_concurrency' else 'replicas'}"


@dataclass(slots=True)
class PointTask:
    """The runs of one search (or plain point) over `seeds`, issued in rounds: every seed at one probed value."""

    exp: Experiment
    point: Point
    seeds: list[int]
    probes: list[tuple[object, bool]] = field(default_factory=list)  # (probed value, met), in probing order
    current: object = None  # the value the pending round probes
    lo: float | None = None  # upward targets: highest value seen to meet; min_replicas: highest seen to fail
    hi: float | None = None  # upward targets: lowest value seen to fail; min_replicas: lowest seen to meet
    outcome: str = ""  # a sentence when the search ends at one of its bounds
    done: bool = False
    leader: PointTask | None = None  # a guided search starts from this (finished) search's bracket
    step: float = 0.0  # a guided search's current outward step (a ratio, or a width for integer targets)
    step_scale: float = 1.0  # every step's compute time x this: 1, or an edge of the model-error band
    bound: PointBound | PDBound | None = None  # the point's analytic bounds (experiments.bound): decided probes,
    # a climb
    gallop: bool = False  # a replica search stepping up from its bound, not bisecting [low, high]
    decided: list[object] = field(default_factory=list)  # probed values the bound decided (failed, not simulated)
    plan: CostPlan | None = None  # a min_cost search: the plan says when the point's first search may start
    ceiling: int | None = None  # min_cost: the most replicas probed for now (the plan's cost ceiling)
    capped: bool = False  # min_cost: ended failing at its ceiling (below search.high); `resume` goes on

    @property
    def edge(self) -> bool:
        """A search at an edge of the model-error band (not part of the point's answer)."""
        return self.step_scale != 1.0

    @property
    def target(self) -> str | None:
        return self.exp.search["target"] if self.exp.search else None

    @property
    def key(self) -> str | None:
        """The key the search varies (`pd_block.varied_key`: a P/D point's replica search, its decode pool's)."""
        return varied_key(self.exp, self.point.config)

    @property
    def ready(self) -> bool:
        """May the search start (a guided one waits for its leader; a min_cost shape for its plan)?"""
        if self.leader is not None:
            return self.leader.done
        return self.plan is None or self.edge or self.plan.admits(self.point.index)

    def first(self) -> list[dict]:
        if not self.exp.search:
            return self._round(None)
        lead = self.leader
        if lead is None or lead.lo is None or lead.hi is None:  # no bracket to start from: the full search
            self.leader = None
            low = self.exp.search["low"]
            if self.target in REPLICA_TARGETS and (self.bound is not None or self.ceiling is not None):
                return self._climb(low)
            return self._round(low)
        integer = self.target in INTEGER_TARGETS
        self.step = max(lead.hi - lead.lo, 1) if integer else lead.hi / lead.lo
        start = lead.lo if self.target not in REPLICA_TARGETS else lead.hi
        if self.edge:  # where the answer moves when every step takes step_scale times as long
            moved = start * self.step_scale if self.target in REPLICA_TARGETS else start / self.step_scale
            low, high = self.exp.search["low"], self.exp.search["high"]
            start = min(max(round(moved) if integer else moved, low), high)
        if self.ceiling is not None:  # a min_cost ceiling below the leader's answer: probe up to it only
            start = min(start, self.ceiling)
        return self._round(start)

    def next(self, met: bool) -> list[dict]:
        """Record the pending round's verdict; returns the next round's runs, or [] when the point is done."""
        if not self.exp.search:
            self.done = True
            return []
        self.probes.append((self.current, met))
        if self.leader is not None or self.gallop:
            return self._guided(met)
        search, target = self.exp.search, self.target
        upward = target not in REPLICA_TARGETS  # meets below the answer, fails above it
        value = self.current
        if len(self.probes) == 1:  # the low end
            if upward and not met:
                return self._finish(f"fails already at the lowest value searched, {describe(target, value)}")
            if not upward and met:
                self.hi = value
                return self._finish("")
            self.lo = value
            return self._round(search["high"])
        if len(self.probes) == 2 and met == upward:  # the high end: still meets / still fails
            if upward:
                self.lo = value
                return self._finish(f"meets the SLOs up to the highest value searched, {describe(target, value)}")
            return self._finish(f"fails even with {describe(target, value)}")
        if met == upward:
            self.lo = value
        else:
            self.hi = value
        return self._bisect()

    def _bisect(self) -> list[dict]:
        if self.target in INTEGER_TARGETS:
            if self.hi - self.lo <= 1:
                return self._finish("")
            return self._round((self.lo + self.hi) // 2)
        if self.hi / self.lo <= 1 + self.exp.search["tolerance"]:
            return self._finish("")
        return self._round(math.sqrt(self.lo * self.hi))

    def _guided(self, met: bool) -> list[dict]:
        """Step outwards from the leader's bracket until this seed's answer is bracketed, then bisect."""
        search, target, value = self.exp.search, self.target, self.current
        upward = target not in REPLICA_TARGETS
        if met == upward:
            self.lo = value
        else:
            self.hi = value
        if self.lo is not None and self.hi is not None:
            return self._bisect()
        integer = target in INTEGER_TARGETS
        outward = self.lo is not None  # the answer lies above what was probed
        if outward:
            bound = self.top
            following = min(value + self.step if integer else value * self.step, bound)
        else:
            bound = search["low"]
            following = max(value - self.step if integer else value / self.step, bound)
        if value == bound:  # a bound was probed and did not bracket: the answer is outside [low, high]
            if upward and outward:
                return self._finish(f"meets the SLOs up to the highest value searched, {describe(target, value)}")
            if upward:
                return self._finish(f"fails already at the lowest value searched, {describe(target, value)}")
            if not outward:
                return self._finish("")  # min_replicas meets at the lowest count searched: hi = low
            if bound < search["high"]:  # a min_cost ceiling, not the searched range: `resume` may go on
                self.capped = True
                return self._finish(f"capped at {describe(target, value)} by the cost ceiling")
            return self._finish(f"fails even with {describe(target, value)}")
        self.step = self.step * 2 if integer else self.step * self.step
        return self._round(following)

    def _climb(self, low: int) -> list[dict]:
        """A replica search with a bound: every count below the bound's fewest replicas fails (decided), so start
        there and step up - by 1, doubling (`_guided`) - until a count meets, then bisect the last step. Under the
        search's assumption (more replicas never fail where fewer meet) it finds the answer a bisection of
        [low, high] finds, without probing the large counts a bisection starts with (each the costliest probe)."""
        bounded = self.bound.min_replicas(self._rate(), self.step_scale) if self.bound is not None else low
        fewest = min(max(bounded, low), self.top)
        self.gallop, self.step = True, 1
        if fewest > low:
            self.lo = fewest - 1
            self.decided += list(range(low, fewest))
        return self._round(fewest)

    @property
    def top(self) -> int:
        """The most replicas (or the highest value) this search probes now: search.high, or a min_cost ceiling."""
        high = self.exp.search["high"]
        return high if self.ceiling is None else min(high, self.ceiling)

    def resume(self, ceiling: int) -> list[dict]:
        """Go on with a search capped at its old ceiling (min_cost): the step up it would have taken next, now up
        to `ceiling` - the climb of `_guided`, so the answer is the one an uncapped search finds."""
        assert self.capped and ceiling > self.current
        self.ceiling, self.capped, self.done, self.outcome = ceiling, False, False, ""
        following = min(self.current + self.step, self.top)
        self.step *= 2
        return self._round(following)

    def _rate(self) -> float:
        """The probe's offered rate (req/s): the workload's, else the trace's own mean rate."""
        from kvplan.experiments.execute import build_probe, population

        config = run_config(self.point.config, self.seeds[0])
        return build_probe(config).offered_rate(population(config))

    def _decides(self, value: object) -> bool:
        """Does the bound decide the probe at `value` fails (experiments.bound: `SLACK` x the rate bound)? Never
        the first probe: a search always simulates at least once (the answer's runs describe it)."""
        if self.bound is None or not self.probes:
            return False
        if self.target in REPLICA_TARGETS:
            return int(value) < self.bound.min_replicas(self._rate(), self.step_scale)
        if self.target in ("max_rate", "max_goodput"):
            replicas = int(self.point.config["cluster"]["replicas"])
            return float(value) > self.bound.max_stable_rate(replicas, self.step_scale)
        return False

    def _round(self, value: object) -> list[dict]:
        if self._decides(value):  # the verdict is known: fails, as a simulation would find
            self.current = value
            self.decided.append(value)
            return self.next(False)
        self.current = value
        probe = {self.key: value} if self.key else None
        # Per-request SLO bounds are evaluated inside the run (they need every request): part of its identity.
        extra = {"attainment": self.exp.attainment} if self.exp.attainment else {}
        if self.exp.goodput_bounds:
            extra["goodput"] = self.exp.goodput_bounds
        if self.edge:
            extra["step_scale"] = self.step_scale
        return [run_config(self.point.config, seed, probe) | extra for seed in self.seeds]

    def _finish(self, outcome: str) -> list[dict]:
        self.outcome, self.done = outcome, True
        return []

    @property
    def answer(self) -> float | None:
        """The capacity (a rate, a scale, users) or the replicas needed; None when below the searched range."""
        if not self.exp.search or self.outcome.startswith("fails"):
            return None
        return self.hi if self.target in REPLICA_TARGETS else self.lo

    def runs_in(self, runs, value: object = None):  # runs, and the result: pandas DataFrames (runs.parquet's rows)
        """This task's rows of `runs` (its point, seeds and step scale), only those at one probed `value` when
        given."""
        mine = runs[(runs["point"] == self.point.index) & runs["seed"].isin(self.seeds)
                    & (runs["step_scale"] == self.step_scale)]
        return mine if value is None else mine[np.isclose(mine["probe"], float(value))]


def make_tasks(exp: Experiment, scales: dict[int, tuple[float, float]] | None = None,
               plan: CostPlan | None = None) -> list[PointTask]:
    """One task per point and seed for a median-combined search (the first seed's leads the others), else one
    per point over every seed; then the edge searches of `scales`' points (`edge_tasks`). With a min_cost `plan`:
    only the shapes it may search (not refused by a gate or the memory), each started when the plan says."""
    if exp.search is None:
        return [PointTask(exp, point, list(exp.seeds)) for point in expand(exp)]
    tasks = []
    for point in expand(exp):
        if plan is not None and plan.shapes[point.index].status:
            continue
        bound = point_bound(run_config(point.config, exp.seeds[0])) if bounded(exp, point) else None
        if exp.search["combine"] == "all":
            tasks.append(PointTask(exp, point, list(exp.seeds), bound=bound, plan=plan))
        else:
            leader = PointTask(exp, point, [exp.seeds[0]], bound=bound, plan=plan)
            tasks += [leader, *(PointTask(exp, point, [seed], leader=leader, bound=bound, plan=plan)
                                for seed in exp.seeds[1:])]
    return tasks + edge_tasks(tasks, scales or {})


def bounded(exp: Experiment, point: Point) -> bool:
    """Does `experiments.bound` apply to the point's search: a sustained open loop searched over its rate or its
    replicas, on a cost model that prices steps of any size (the analytic one: a GPU by name)."""
    from kvplan.sim.specs.profiles import PROFILED_DEVICES

    hardware = str(point.config["hardware"])
    return (exp.search is not None and exp.search["target"] in ("max_rate", "max_goodput", *REPLICA_TARGETS)
            and point.config["workload"]["mode"] == "sustained" and not hardware.endswith((".yaml", ".yml"))
            and hardware not in PROFILED_DEVICES)


def edge_tasks(tasks: list[PointTask], scales: dict[int, tuple[float, float]]) -> list[PointTask]:
    """For each point of `scales` (point index -> the step-time factors at its band's edges) whose load is steady,
    one search per edge away from 1 (a band [0, hi] has one: its other edge is the answer itself), led by the
    point's first search in `tasks`."""
    out = []
    for index, factors in scales.items():
        leader = next(t for t in tasks if t.point.index == index and not t.edge)
        if leader.point.config["workload"]["mode"] != "burst":
            out += [PointTask(leader.exp, leader.point, list(leader.seeds), leader=leader, step_scale=f,
                              bound=leader.bound) for f in factors if f != 1.0]
    return out
