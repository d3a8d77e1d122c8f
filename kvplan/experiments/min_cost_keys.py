"""The `search:` keys only a `target: min_cost` search takes (the search itself: `min_cost`).

    prune: true        skip a shape whose analytic lower bound on cost lies above the cheapest feasible cost found
                       (`min_cost.CostPlan`; the answer is the same either way, pruning only saves simulations)
    latency: METRIC    the latency of the Pareto frontier (a summary key, e.g. p99_ttft_ms); default: the SLO's
                       first latency, else p99_ttft_ms
"""

from __future__ import annotations

from kvplan.engine.core.settings import Field
from kvplan.experiments.fields import SchemaError
from kvplan.results.summary import SUMMARY_KEYS

LATENCY_KEYS = tuple(k for k in SUMMARY_KEYS if k.endswith("_ms"))
DEFAULT_LATENCY = "p99_ttft_ms"
COST_SEARCH: dict[str, Field] = {
    "prune": Field("bool", True, help="min_cost: skip shapes whose analytic lower bound on cost is above the "
                   "cheapest feasible cost found (the answer does not change)"),
    "latency": Field("choice", None, LATENCY_KEYS, nullable=True,
                     help="min_cost: the latency the Pareto frontier is drawn against; default: the SLO's first "
                     "latency, else p99_ttft_ms"),
}


def check_cost_keys(doc: dict, search: dict, slo: dict[str, float]) -> None:
    """Refuse a min_cost key under another target (one line naming it); fill min_cost's latency default."""
    if search["target"] != "min_cost":
        for key in COST_SEARCH:
            if key in doc:
                raise SchemaError(f"search.{key}: only a min_cost search takes it (target is {search['target']}); "
                                  "allowed: remove it, or search.target: min_cost")
            del search[key]
        return
    if search["latency"] is None:
        search["latency"] = next((k for k in slo if k in LATENCY_KEYS), DEFAULT_LATENCY)
