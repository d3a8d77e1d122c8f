"""The `search:` keys only a `target: min_cost` search takes (the search itself: `min_cost`).

    prune: true        search under a cost ceiling and leave a shape unsettled once the cheapest it can still need
                       costs more than the cheapest found (`min_cost.CostPlan`; the answer is the same either way,
                       pruning only saves simulations); false: every shape searched to its answer
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
    "prune": Field("bool", True, help="min_cost: stop searching a shape once the cheapest it can still need "
                   "costs more than the cheapest found (the answer does not change); false: search every shape"),
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
