"""`search.rank_by`: what a rate search's answers are ranked by (`ranking`), for points of different sizes.

    rate      the answer itself, req/s (points of one size: the most each serves)
    per_gpu   the answer over the point's GPUs, req/s per GPU (DistServe's goodput per GPU: a P:D grid against
              co-located replicas holding other numbers of GPUs)
    per_usd   requests per dollar at the answer: answer x 3600 / the point's $/hour (`sim.dollars`; pools on
              different GPUs, or GPUs of different prices)

Default (unset): per_gpu when the experiment's points hold different numbers of GPUs, else rate; the answer says
which. Only the rate targets (max_rate, max_goodput) take it: a replica search already ranks by GPUs or $/hour,
and a concurrency or a burst scale over GPUs is no quantity anyone buys by.

Every point's divisor (GPUs, or $/hour / 3600) is fixed by its deployment, so a seed interval scales by it as it
stands: the tie rule of `ranking` (overlapping seed intervals) holds unchanged in the ranked unit.
"""

from __future__ import annotations

import math

from kvplan.engine.core.settings import Field
from kvplan.experiments.fields import SchemaError
from kvplan.sim.dollars import SECONDS_PER_HOUR

RANK_BY = ("rate", "per_gpu", "per_usd")
RATE_TARGETS = ("max_rate", "max_goodput")  # the targets whose answer is a request rate
FIELD = Field("choice", None, RANK_BY, nullable=True,
              help="max_rate / max_goodput: rank the points by the answer (rate, req/s), the answer per GPU "
                   "(per_gpu) or requests per $ at the answer (per_usd); default: per_gpu when the points hold "
                   "different numbers of GPUs, else rate")
# each way's points column (`results.points_frame`) and unit
COLUMNS = {"rate": "answer", "per_gpu": "answer_per_gpu", "per_usd": "answer_per_usd"}
UNITS = {"rate": "req/s", "per_gpu": "req/s per GPU", "per_usd": "req/$"}
# the answer table's column head (its title line names the whole unit): short, leaving the labels room
HEADERS = {"rate": "req/s", "per_gpu": "per GPU", "per_usd": "req/$"}


def check(doc: dict, search: dict) -> None:
    """Refuse `rank_by` under a target that is not a rate (one line naming it); drop the key there."""
    if search["target"] not in RATE_TARGETS:
        if "rank_by" in doc:
            raise SchemaError(f"search.rank_by: ranks a rate's answers, and search.target is {search['target']}; "
                              f"allowed: remove it, or search.target {' or '.join(RATE_TARGETS)}")
        del search["rank_by"]


def resolve(exp) -> None:  # exp: schema.Experiment, its prices parsed
    """Fill the default (module docstring) and, for per_usd, refuse a point whose GPUs the prices lack."""
    from kvplan.experiments.pd_block import pools
    from kvplan.experiments.points import expand

    if not exp.search or exp.search["target"] not in RATE_TARGETS:
        return
    points = expand(exp)
    if exp.search["rank_by"] is None:
        sizes = {sum(n for _, n in pools(p.config)) for p in points}
        exp.search["rank_by"] = "per_gpu" if len(sizes) > 1 else "rate"
    if exp.search["rank_by"] == "per_usd":
        for point in points:
            for hardware, _ in pools(point.config):
                if hardware not in exp.prices.entries:
                    raise SchemaError(f"search.rank_by: per_usd, and point {point.label} runs on {hardware}, which "
                                      f"the prices lack; allowed: prices: {{{hardware}: DOLLARS_PER_GPU_HOUR}}, or "
                                      "rank_by per_gpu or rate")


def rank_by(exp) -> str:  # exp: schema.Experiment
    """How the experiment's points are ranked: its search's `rank_by`, else rate (no rate search)."""
    return (exp.search or {}).get("rank_by") or "rate"


def divisor(by: str, gpus: float, cost_per_hour: float) -> float:
    """What an answer (req/s) is divided by to be ranked `by`: 1, the GPUs, or the $/hour in $ per second (req/s
    over $/s: requests per $); NaN where the point has no such figure."""
    if by == "per_gpu":
        return gpus if gpus > 0 else math.nan
    if by == "per_usd":
        return cost_per_hour / SECONDS_PER_HOUR if cost_per_hour > 0 else math.nan
    return 1.0


def ranked_columns(row: dict) -> dict[str, float]:
    """A rate search's point's answer per GPU and per $ (`COLUMNS`), from its answer, GPUs and $/hour."""
    gpus, hour = float(row["gpus"]), float(row.get("cost_per_hour", math.nan))
    return {COLUMNS[by]: row["answer"] / divisor(by, gpus, hour) for by in ("per_gpu", "per_usd")}
