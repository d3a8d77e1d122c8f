"""Per point: which runs to make, and what they say. A plain point runs once per seed; a search probes by
bisection and runs every seed at each probe. A probe meets the SLOs only if every seed's run does.

    max_rate:      low ... [meets] lo ----- mid ----- hi [fails] ... high     (geometric midpoints)
                   ends when hi / lo <= 1 + tolerance; capacity = lo (the highest rate scale seen to meet)
    min_replicas:  lo [fails] ----- mid ----- hi [meets]; ends when hi = lo + 1; answer = hi

Both assume the SLOs hold below some rate (above some replica count) and fail beyond it - true of a queueing
system whose latency grows with load; a point where `low` already fails (or `high` still meets) is reported as
such instead of a number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvplan.experiments.points import Point, run_config
from kvplan.experiments.schema import SEARCH_TARGETS, Experiment


def slo_verdict(exp: Experiment, doc: dict) -> tuple[bool, list[str]]:
    """(meets every SLO, the violated ones described) for one run's summary.json."""
    summary, broken = doc["summary"], []
    for key, bound in exp.slo.items():
        value = summary.get(key)
        if value is None or not math.isfinite(value) or value > bound:
            broken.append(f"{key} {value if value is None else round(value, 3)} > {bound:g}")
    if exp.attainment is not None and (doc["attainment"] or 0.0) < exp.attainment["fraction"]:
        broken.append(f"attainment {doc['attainment']:.3f} < {exp.attainment['fraction']:g}")
    if summary.get("completed", 0) == 0:
        broken.append("no request completed")
    return not broken, broken


@dataclass(slots=True)
class PointTask:
    """The runs of one point, issued in rounds: every seed at one probe value per round."""

    exp: Experiment
    point: Point
    probes: list[tuple[object, bool]] = field(default_factory=list)  # (probed value, met), in probing order
    current: object = None  # the value the pending round probes
    lo: float | None = None  # max_rate: highest value seen to meet; min_replicas: highest seen to fail
    hi: float | None = None  # max_rate: lowest value seen to fail; min_replicas: lowest seen to meet
    outcome: str = ""  # a sentence when the search ends at one of its bounds
    done: bool = False

    @property
    def key(self) -> str | None:
        return SEARCH_TARGETS[self.exp.search["target"]] if self.exp.search else None

    def first(self) -> list[dict]:
        return self._round(self.exp.search["low"] if self.exp.search else None)

    def next(self, met: bool) -> list[dict]:
        """Record the pending round's verdict; returns the next round's runs, or [] when the point is done."""
        if not self.exp.search:
            self.done = True
            return []
        self.probes.append((self.current, met))
        search = self.exp.search
        rate = search["target"] == "max_rate"
        value = self.current
        if len(self.probes) == 1:  # the low end
            if rate and not met:
                return self._finish(f"fails the SLOs already at the lowest rate scale x{value:g}")
            if not rate and met:
                self.hi = value
                return self._finish("")
            self.lo = value
            return self._round(search["high"])
        if len(self.probes) == 2 and met == rate:  # the high end: still meets / still fails
            if rate:
                self.lo = value
                return self._finish(f"meets the SLOs up to the highest rate scale searched, x{value:g}")
            return self._finish(f"fails the SLOs even with {value} replicas")
        if met == rate:
            self.lo = value
        else:
            self.hi = value
        if rate:
            if self.hi / self.lo <= 1 + search["tolerance"]:
                return self._finish("")
            return self._round(math.sqrt(self.lo * self.hi))
        if self.hi - self.lo <= 1:
            return self._finish("")
        return self._round((self.lo + self.hi) // 2)

    def _round(self, value: object) -> list[dict]:
        self.current = value
        probe = {self.key: value} if self.key else None
        # An attainment SLO is evaluated inside the run (it needs every request): part of the run's identity.
        extra = {"attainment": self.exp.attainment} if self.exp.attainment else {}
        return [run_config(self.point.config, seed, probe) | extra for seed in self.exp.seeds]

    def _finish(self, outcome: str) -> list[dict]:
        self.outcome, self.done = outcome, True
        return []

    @property
    def answer(self) -> float | None:
        """max_rate: the capacity (a rate scale); min_replicas: the replicas needed; None when out of range."""
        if not self.exp.search or self.outcome.startswith("fails"):
            return None
        return self.lo if self.exp.search["target"] == "max_rate" else self.hi
