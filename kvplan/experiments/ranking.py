"""The recommendation: the best point, when the seeds separate it from the rest - else a tie, and none.

Each point has an interval over its seeds: for a search, the seeds' answers [answer_low, answer_high] (an end
open where a seed's answer lies outside the searched range: below it for a rate, above it for replicas); for a
plain point, the range of the objective metric's per-seed values [objective_low, objective_high].

    search (rates, scales, users): the highest median answer is best - for a rate, per GPU or per $ when
                    `search.rank_by` says so (`rank_by`: each interval divided by the point's GPUs or $/s,
                    the same divisor as its answer); another point ties with it when their
                    seed intervals overlap - or, when both have a model range from different cost-model sources
                    (their errors are independent), when those ranges overlap. Ranges from one source are not
                    compared: a step-time error moves every point it prices the same way.
    min_replicas:   fewest GPUs (replicas x TP x PP), then fewest replicas, then the objective, is best; another
                    point ties with it when their GPU intervals overlap, unless both need one same GPU count at
                    every seed and the best's replica interval lies below the other's.
    min_cost:       the lowest $/hour (replicas x GPUs per replica x $/GPU-hour: `min_cost`), then fewest GPUs,
                    replicas, the objective; another point ties with it when their $/hour intervals overlap.
    no search:      among the points meeting the SLOs, the best objective value; another ties with it when their
                    objective intervals overlap.

A tie recommends nothing: `point` is None and `tie` lists the tied points, best-ranked first. One seed gives an
interval of one value: only equal answers tie, and the answer says the separation is untested.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from kvplan.experiments import model_range
from kvplan.experiments.rank_by import COLUMNS, UNITS, divisor, rank_by
from kvplan.experiments.schema import REPLICA_TARGETS, Experiment

UNTESTED = "one seed: the separation is not tested by a seed spread"


@dataclass(slots=True)
class Recommendation:
    point: int | None  # the recommended point; None when none meets the SLOs or the best is tied
    label: str
    why: str
    tie: list[int] = field(default_factory=list)  # the points tied for best, best-ranked first ([] without a tie)
    tie_labels: list[str] = field(default_factory=list)
    runner_up: int | None = None  # the next-best point a recommendation is separated from (None: no other)


def interval(exp: Experiment, row: pd.Series) -> tuple[float, float]:
    """The point's seed interval in the unit it is ranked by (GPUs for `min_replicas`; see the module docstring)."""
    if not exp.search:
        value = float(row[exp.objective["metric"]])
        return float(row.get("objective_low", value)), float(row.get("objective_high", value))
    low, high = float(row["answer_low"]), float(row["answer_high"])
    if exp.search["target"] == "min_cost":  # what is bought: GPU-hours at their price (min_cost.Shape.hour)
        high_cost = float(row["shape_cost_high"])
        return float(row["shape_cost_low"]), (high_cost if math.isfinite(high) else math.inf)
    if exp.search["target"] in REPLICA_TARGETS:  # GPUs: a P/D point's prefill pool (fixed) + decode replicas x per
        per, fixed = float(row.get("gpus_per_replica", 1)), fixed_gpus(row)
        return low * per + fixed, (high * per + fixed if math.isfinite(high) else math.inf)
    by = scale(exp, row)
    return (low / by if math.isfinite(low) else -math.inf), high / by


def fixed_gpus(row: pd.Series) -> float:
    """A replica search's GPUs it does not vary (a P/D point's prefill pool); 0 where none (a min_cost shape the
    search never reached has no such column value)."""
    value = float(row.get("fixed_gpus", 0.0))
    return value if math.isfinite(value) else 0.0


def scale(exp: Experiment, row: pd.Series) -> float:
    """What the point's answer is divided by to be ranked (`rank_by`; 1 for a rate, or without a rate search)."""
    return divisor(rank_by(exp), float(row.get("gpus", math.nan)), float(row.get("cost_per_hour", math.nan)))


def span(exp: Experiment, row: pd.Series) -> str:
    """An interval in words: "21.9-23.52"; an open end "below 0.5" / "above 16"."""
    if not exp.search:
        low, high = interval(exp, row)
    else:
        low, high = float(row["answer_low"]), float(row["answer_high"])
    if not math.isfinite(low):
        return f"below {exp.search['low']:g}-{high:.4g}"
    if not math.isfinite(high):
        return f"{low:.4g}-above {exp.search['high']:g}"
    return f"{low:.4g}-{high:.4g}"


def rank_span(exp: Experiment, row: pd.Series) -> str:
    """The interval a point is ranked by, in words: a min_cost point's $/hour over the seeds ("$33.41-44.64/h",
    an open end "above"), a rate's per GPU or per $ ("3.2-3.5 req/s per GPU", `rank_by`), else `span`."""
    if exp.search and rank_by(exp) != "rate":
        low, high = interval(exp, row)
        shown = "below" if not math.isfinite(low) else f"{low:.4g}"
        return f"{shown}-{high:.4g} {UNITS[rank_by(exp)]}"
    if not (exp.search and exp.search["target"] == "min_cost"):
        return span(exp, row)
    low, high = interval(exp, row)
    return f"${low:.4g}-{high:.4g}/h" if math.isfinite(high) else f"${low:.4g}-above/h"


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def tied(exp: Experiment, best: pd.Series, other: pd.Series) -> bool:
    """Is `other` tied with `best` (see the module docstring)?"""
    mine, theirs = interval(exp, best), interval(exp, other)
    if exp.search and exp.search["target"] == "min_cost":
        return _overlap(mine, theirs)
    if exp.search and exp.search["target"] in REPLICA_TARGETS:
        if not _overlap(mine, theirs):
            return False
        one_count = mine[0] == mine[1] == theirs[0] == theirs[1]
        return not (one_count and best["answer_high"] < other["answer_low"])
    if _overlap(mine, theirs):
        return True
    if exp.search and best.get("model_error_source") != other.get("model_error_source"):
        ranges = [(float(r.get("capacity_model_lo", math.nan)) / scale(exp, r),
                   float(r.get("capacity_model_hi", math.nan)) / scale(exp, r)) for r in (best, other)]
        return all(math.isfinite(v) for pair in ranges for v in pair) and _overlap(*ranges)
    return False


def recommend(exp: Experiment, points: pd.DataFrame) -> Recommendation:
    metric, goal = exp.objective["metric"], exp.objective["goal"]
    ascending = goal == "min"
    if exp.search:
        target = exp.search["target"]
        found = points[points["answer"].notna()]
        if target == "min_cost":
            found = found[found["status"] == "feasible"]  # not a shape the cost bound settled (min_cost)
        if found.empty:
            return Recommendation(None, "", f"no point meets the SLOs inside the searched range "
                                            f"[{exp.search['low']:g}, {exp.search['high']:g}]")
        if target == "min_cost":
            ranked = found.sort_values(["shape_cost_per_hour", "gpus", "answer", metric],
                                       ascending=[True, True, True, ascending], kind="stable")
            ranking = "ranked by $/hour (replicas x GPUs x $/GPU-hour), then GPUs, then replicas"
        elif target in REPLICA_TARGETS:  # what is bought is GPUs: 3 replicas at TP 2 beat 2 at TP 4
            ranked = found.sort_values(["gpus", "answer", metric], ascending=[True, True, ascending], kind="stable")
            pd_points = "fixed_gpus" in found and bool((found["fixed_gpus"] > 0).any())
            ranking = "ranked by GPUs (" + ("a P/D point's prefill pool + decode replicas x TP x PP" if pd_points
                                            else "replicas x TP x PP") + "), then replicas"
        else:
            by = rank_by(exp)
            column = COLUMNS[by]
            if by != "rate":  # (a point without the divisor - no price - cannot be placed)
                found = found[found[column].notna()]
                if found.empty:
                    return Recommendation(None, "", f"no point has a figure {UNITS[by]} (search.rank_by: {by})")
            ranked = found.sort_values([column, metric], ascending=[False, ascending], kind="stable")
            ranking = "ranked by the median answer" + ("" if by == "rate" else
                                                       f" in {UNITS[by]} ({ranked.iloc[0][column]:.4g}; "
                                                       f"search.rank_by: {by})")
        return _decide(exp, ranked, capacity_sentence(exp, ranked.iloc[0]) + "; " + ranking, "seed interval",
                       "seed intervals")
    eligible = points[points["slo_met"]] if (exp.slo or exp.attainment) else points
    if eligible.empty:
        closest = points.sort_values("attainment" if exp.attainment else metric,
                                     ascending=not exp.attainment and ascending, kind="stable").iloc[0]
        return Recommendation(None, "", f"no point meets the SLOs; the closest is {closest['label']}")
    ranked = eligible.sort_values(metric, ascending=ascending, kind="stable")
    best = ranked.iloc[0]
    among = f"{len(eligible)} of {len(points)} points meet the SLOs" if (exp.slo or exp.attainment) else \
        f"{len(points)} points, no SLO given"
    return _decide(exp, ranked, f"{among}; it has the {'lowest' if ascending else 'highest'} {metric} "
                                f"({best[metric]:.4g})", f"{metric} interval over seeds",
                   f"{metric} intervals over seeds")


def _decide(exp: Experiment, ranked: pd.DataFrame, why: str, what: str, whats: str) -> Recommendation:
    """The best-ranked point, or a tie with every point whose `what` overlaps its own."""
    best = ranked.iloc[0]
    others = [row for _, row in ranked.iloc[1:].iterrows()]
    level = [row for row in others if tied(exp, best, row)]
    if level:
        rows = [best, *level]
        shown = ", ".join(f"{row['label']} ({rank_span(exp, row)})" for row in rows)
        return Recommendation(None, "", f"tie: {shown}: the {whats} overlap, so the seeds do not separate them; "
                                        "none is recommended (more seeds may separate them)",
                              [int(row["point"]) for row in rows], [str(row["label"]) for row in rows])
    if others:
        runner_up = others[0]
        why += f"; its {what} ({rank_span(exp, best)}) is clear of the next best, {runner_up['label']} " \
               f"({rank_span(exp, runner_up)})"
    if len(exp.seeds) < 2:
        why += f"; {UNTESTED}"
    return Recommendation(int(best["point"]), str(best["label"]), why,
                          runner_up=int(others[0]["point"]) if others else None)


def interval_text(row: pd.Series) -> str:
    """The seeds' range of a point's answer, e.g. "range 20.1-22.4 over 3 seeds"."""
    seeds = len(row["answers"].split(", ")) if isinstance(row.get("answers"), str) else 1
    if seeds < 2:
        return "1 seed"
    low = "below the range" if not math.isfinite(row["answer_low"]) else f"{row['answer_low']:.4g}"
    high = "above the range" if not math.isfinite(row["answer_high"]) else f"{row['answer_high']:.4g}"
    return f"range {low}-{high} over {seeds} seeds"


def capacity_sentence(exp: Experiment, row: pd.Series) -> str:
    """A point's search answer in the user's units: the median over seeds, its range, req/s and tok/s."""
    target, value = exp.search["target"], row["answer"]
    served = f"{row['capacity_rps']:.4g} req/s, {row['capacity_tok_s']:,.0f} tok/s"
    spread = "; ".join(part for part in (model_range.range_clause(row), interval_text(row)) if part)
    if target == "max_rate":
        return f"the highest sustained rate that is stable and meets the SLOs: {value:.4g} req/s ({spread}; " \
               f"served {served})"
    if target == "max_goodput":
        return f"the highest sustained rate meeting the attainment SLO: {value:.4g} req/s ({spread}), goodput " \
               f"{row['request_goodput']:.4g} req/s ({served})"
    if target == "max_concurrency":
        return f"the most concurrent users that meet the SLOs: {value:.4g} ({spread}; served {served})"
    if target == "max_burst_scale":
        return f"the highest burst rate scale absorbed within the SLOs: x{value:.4g} ({spread}; " \
               f"{row['offered_rate_rps']:.4g} req/s offered)"
    per = int(row.get("gpus_per_replica", 1))
    cost = f" at ${row['shape_cost_per_hour']:.4g}/h (${row['price_per_gpu_hour']:.3g}/GPU-h)" \
        if target == "min_cost" else ""
    each = f"{per} GPU{'s' if per > 1 else ''} each: TP x PP"
    fixed = fixed_gpus(row)
    if fixed:  # a P/D point: its decode pool searched, its prefill pool as set
        return f"the fewest decode replicas meeting the SLOs: {value:g} ({spread}) = {fixed + value * per:g} GPUs " \
               f"({fixed:g} in the prefill pool + {value:g} decode replicas x {each}){cost}"
    return f"the fewest replicas meeting the SLOs: {value:g} ({spread}) = {value * per:g} GPUs ({value:g} " \
           f"replicas x {each}){cost}"
