"""The binding limit of a point: what stopped its answer from being higher (fewer replicas), and the key that
moves it. Read from the runs' structured failures (`criteria.failures`, runs.parquet's `failures` column).

A search's answer is bracketed by its first failing probe: the lowest probed value that failed above the answer
(for `min_replicas`, the most replicas that failed below it). Each search - one per seed with `combine:
median`, one over every seed with `combine: all` - votes with each of its runs that failed there, for the
failure it broke most: a `memory` failure first (the SLO broke on a stable server that preempted or refused for
want of KV blocks), else the largest `excess` (value over bound). A search that ended at a bound of its range
votes for that bound: `search.high` when it still met at the top (`search.low` for replicas: it met with the
fewest searched), `search.low` when it failed already at the bottom (`search.high` for replicas). The point's
binding limit is the most voted; a tie of votes goes to the larger excess (a bound counts 0).

A point without a search is bound by the criterion its runs fail most often, else by the SLO line with the
least headroom (largest value over bound, averaged over its runs); without SLOs, by none.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import pandas as pd

from kvplan.experiments.criteria import SUMMARY_TO_SLO, slo_name
from kvplan.experiments.schema import REPLICA_TARGETS, Experiment
from kvplan.experiments.search import PointTask, describe

COLUMNS = ("binding_limit", "binding_key", "binding_detail", "binding_votes", "binding_of", "binding_at")


@dataclass(slots=True)
class Vote:
    limit: str
    key: str
    excess: float
    detail: str
    at: float  # the probed value it failed at (a bound: the bound; NaN for a plain point)


@dataclass(slots=True)
class Binding:
    """A point's binding limit; `votes` of `of` searches (or runs) named it; `at`: the probed value of the vote
    elected (the plots mark it)."""

    limit: str
    key: str
    detail: str
    votes: int
    of: int
    at: float = math.nan

    def columns(self) -> dict[str, object]:
        return dict(zip(COLUMNS, (self.limit, self.key, self.detail, self.votes, self.of, self.at), strict=True))


def top(failed: list[dict]) -> dict:
    """The failure a run broke most (see the module docstring)."""
    return min(failed, key=lambda f: (f["kind"] != "memory", -f["excess"]))


def task_votes(task: PointTask, runs: pd.DataFrame) -> list[Vote]:
    """One vote per failing run at the search's first failing probe, or one for the bound it ended at."""
    target, search = task.target, task.exp.search
    upward = target not in REPLICA_TARGETS
    if task.answer is None:  # failed already at low (upward), or even with high replicas
        edge, value = ("search.low", search["low"]) if upward else ("search.high", search["high"])
        failed = _failed_at(task, runs, value)
        why = f": {top(failed[0])['text']}" if failed else ""
        return [Vote(edge, edge, 0.0, task.outcome + why, float(value))]
    beyond = task.hi if upward else task.lo
    if beyond is None:  # met at the top (upward), or with the fewest replicas searched
        edge, value = ("search.high", search["high"]) if upward else ("search.low", search["low"])
        return [Vote(edge, edge, 0.0, task.outcome or f"meets with the fewest searched, {describe(target, value)}",
                     float(value))]
    if beyond in task.decided and task.bound is not None:  # never simulated: the analytic bound decided it
        return [Vote("analytic bound", "", 1.0, f"fails by the analytic bound at {describe(target, beyond)}: "
                     f"{task.bound.as_text()}", float(beyond))]
    votes = []
    for failed in _failed_at(task, runs, beyond):
        f = top(failed)
        votes.append(Vote(f["limit"], f["key"], f["excess"], f"{f['text']} at {describe(target, beyond)}",
                          float(beyond)))
    return votes


def _failed_at(task: PointTask, runs: pd.DataFrame, value: object) -> list[list[dict]]:
    """The failure lists of the search's failing runs at one probed value."""
    mine = task.runs_in(runs, value)
    return [list(f) for f, met in zip(mine["failures"], mine["slo_met"], strict=True) if not met and len(f)]


def elect(votes: list[Vote], of: int) -> Binding:
    """The most voted (limit, key); a tie of votes goes to the larger excess."""
    if not votes:
        return Binding("none", "", "no failing run recorded", 0, of)
    counts = Counter((v.limit, v.key) for v in votes)
    best = max(votes, key=lambda v: (counts[(v.limit, v.key)], v.excess))
    return Binding(best.limit, best.key, best.detail, counts[(best.limit, best.key)], of, best.at)


def search_binding(tasks: list[PointTask], runs: pd.DataFrame) -> Binding:
    """A point's binding limit from its searches (its answer's, not the model range's edges)."""
    votes = [v for task in tasks for v in task_votes(task, runs)]
    return elect(votes, len(votes))


def sweep_binding(exp: Experiment, at: pd.DataFrame) -> Binding:
    """A plain point's binding limit from its runs `at` (see the module docstring)."""
    failed = [list(f) for f in at["failures"] if len(f)]
    if failed:
        votes = [Vote(f["limit"], f["key"], f["excess"], f["text"], math.nan) for f in map(top, failed)]
        return elect(votes, len(at))
    lines = [(slo_name(k), f"slo.{SUMMARY_TO_SLO[k]}", float(pd.to_numeric(at[k], errors="coerce").mean()) / bound)
             for k, bound in exp.slo.items()]
    if exp.attainment is not None:
        share = float(at["attainment"].mean())
        lines.append(("attainment", "slo.attainment.fraction",
                      exp.attainment["fraction"] / share if share > 0 else math.inf))
    if not lines:
        return Binding("none", "", "no SLO given", 0, len(at))
    name, key, ratio = max(lines, key=lambda line: line[2])
    return Binding(name, key, f"least headroom: at {ratio:.0%} of its bound", len(at), len(at))
