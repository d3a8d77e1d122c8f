"""The cheapest deployment: `search: {target: min_cost}` over the experiment's grid of shapes (GPU x TP/PP x
quantization x whatever else the grid varies).

Each shape is a point whose fewest replicas are searched exactly as `min_replicas` does (`search.PointTask`: the
analytic bound's climb, each seed on its own), at the workload's rate and SLOs. What a shape costs:

    cost ($/h) = replicas (the median of the seeds' answers) x GPUs per replica (TP x PP) x $/GPU-hour

A P/D shape's search counts its decode replicas (`pd_block.varied_key`) and its prefill pool is paid as it is:
cost = the prefill pool's $/h + decode replicas x a decode replica's GPUs x its GPU's $/GPU-hour (each pool at its
own GPU's price); every figure below is in that form (`Shape.fixed_per_hour`: 0 for a co-located shape).

with the $/GPU-hour of the experiment's prices (`sim.specs.prices`; a GPU without a price is refused before
anything runs). The answer is the cheapest shape (`ranking`: a shape whose cost interval over the seeds overlaps
the cheapest's is a tie, and none is recommended). Before anything is simulated each shape is screened:

    gate        the simulator refuses the shape (a TP the heads cannot split, fp8 on a GPU without fp8, ...)
    memory      the weights and the least KV do not fit the GPU (the simulator's no-fit message, with its figures)

then searched under a cost ceiling (`CostPlan`), and reported as

    feasible    searched to its answer (winner, or tie: see above)
    SLO         searched: no replica count up to search.high meets the SLOs (the failed ones at that count)
    cost bound  settled without an answer: the cheapest any of its seeds can still need costs more than the
                high end of the cheapest shape's interval (searched only up to the ceiling, or not at all)

The ceiling C ($/h) starts at twice the cheapest lower bound - a shape's lower bound is the analytic bound's
fewest replicas (`experiments.bound`: fewer are decided to fail) x GPUs x price. A shape whose lower bound is
within C (and within T below, once a shape is settled) is searched, its seeds climbing as min_replicas does but
to at most floor(C / its replica's $/h) replicas: a seed still failing there is *capped* (`PointTask.capped`).
Failing probes of few replicas are the cheap ones (an overloaded probe stops early). When no search runs, the
best-ranked settled shape b (every seed at its answer) gives T, the high end of its $/h interval; a shape not
settled is *relevant* while the cheapest any of its seeds can still need - its answer, one more than its cap,
else its lower bound - costs at most T. With none relevant the answer is settled and the rest are `cost bound`;
otherwise C doubles (at least to the cheapest relevant figure) and the relevant shapes go on (`PointTask.resume`:
the step the climb would have taken next).

Why the answer is the unpruned one: a seed's cost is at least the figure used for it, and a median (an interval's
low end) is at least that of those figures, so every shape left unsettled has a median above T >= b's (it ranks
below b: b is the cheapest) and an interval starting above b's high end (no tie with b). A resumed search ends
where an uncapped one does under the search's assumption (more replicas never fail where fewer meet). Which
losing shapes are searched how far can depend on which search finished first; the winner and the ties cannot.
`prune: false` searches every shape to its answer (the full frontier).

The Pareto frontier is drawn over the shapes that meet the SLOs, at their answers: throughput per GPU (tokens/s)
against the search's latency metric (`search.latency`), and $ per million tokens against it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvplan.errors import UserError
from kvplan.experiments.points import Point, run_config
from kvplan.experiments.schema import Experiment

NO_FIT = "no memory left for the KV cache"  # sim.run.no_fit_message: a shape the memory refuses, not a gate
STATUSES = ("winner", "tie", "feasible", "SLO", "memory", "gate", "cost bound")
# The key that moves a shape rejected before its search (the answer's "key that moves it")
KEYS = {"memory": "engine.gpu_memory_utilization", "gate": "sweep.grid", "cost bound": "search.prune"}
COLUMNS = ("status", "status_reason", "price_per_gpu_hour", "lower_bound_replicas", "lower_bound_per_hour",
           "shape_cost_per_hour", "shape_cost_low", "shape_cost_high", "shape_cost_model_lo", "shape_cost_model_hi",
           "throughput_per_gpu", "usd_per_m_tokens", "frontier_throughput", "frontier_cost")


def is_cost_search(exp: Experiment) -> bool:
    return exp.search is not None and exp.search["target"] == "min_cost"


@dataclass(slots=True)
class Shape:
    """One point of a min_cost grid before anything is simulated (module docstring)."""

    point: int
    label: str
    gpus_per_replica: int
    price: float  # $ per GPU-hour (of the searched pool's GPU)
    status: str = ""  # "" (to search), "gate" or "memory"
    reason: str = ""
    fewest: int = 1  # the fewest replicas the analytic bound allows (at least search.low)
    fixed_gpus: int = 0  # a P/D shape's prefill pool, which its search does not vary (module docstring)
    fixed_per_hour: float = 0.0  # its $/h

    def hour(self, replicas: float) -> float:
        """$ per hour of the shape at `replicas` of its searched pool."""
        return self.fixed_per_hour + replicas * self.per_replica

    @property
    def per_replica(self) -> float:
        """$ per hour of one replica."""
        return self.gpus_per_replica * self.price

    @property
    def lower_bound(self) -> float:
        """$ per hour of the fewest replicas the analytic bound allows: no seed's answer costs less."""
        return self.hour(self.fewest)


def screen(exp: Experiment, points: list[Point]) -> dict[int, Shape]:
    """Every point's shape, price, gate or memory verdict and lower bound on cost (module docstring). A GPU
    without a price refuses the whole search in one line naming it."""
    from kvplan.experiments.bound import point_bound
    from kvplan.experiments.execute import build_probe, build_spec, population
    from kvplan.experiments.pd_block import answer_hour, pools, replica_unit
    from kvplan.experiments.search import bounded
    from kvplan.sim.run import build_cost

    table = exp.prices  # the prices: block over the built-in dated table (sim.specs.prices)
    shapes = {}
    for point in points:
        config = run_config(point.config, exp.seeds[0])
        for hardware, _ in pools(config):  # (a P/D shape: each pool's GPU; the searched pool's is the last)
            if hardware not in table.entries:
                raise UserError(f"search.target: min_cost needs the $/GPU-hour of every GPU searched; {hardware} "
                                f"(point {point.index}, {point.label}) has no price; allowed: add `prices: "
                                f"{{{hardware}: DOLLARS_PER_GPU_HOUR}}`, or drop it from the grid")
        fixed, gpus = replica_unit(exp, config)
        shape = Shape(point.index, point.label, gpus, table.gpu_hour(hardware), fewest=exp.search["low"],
                      fixed_gpus=fixed, fixed_per_hour=answer_hour(exp, config, 0))
        shapes[point.index] = shape
        try:
            build_cost(build_spec(config))
        except UserError as exc:  # a shape the simulator refuses: rejected with its reason, not the experiment
            shape.status, shape.reason = ("memory" if NO_FIT in str(exc) else "gate"), str(exc)
            continue
        bound = point_bound(config) if bounded(exp, point) else None
        if bound is not None:
            rate = build_probe(config).offered_rate(population(config))
            shape.fewest = min(max(bound.min_replicas(rate), exp.search["low"]), exp.search["high"])
    return shapes


@dataclass(slots=True)
class CostPlan:
    """Which shapes are searched up to how many replicas, and which are left to the cost bound (module
    docstring): a cost ceiling C ($/h) that doubles while no answer is settled."""

    exp: Experiment
    shapes: dict[int, Shape]
    ceiling: float = 0.0  # C: every search probes at most floor(C / its replica's $/h) replicas for now
    started: set[int] = field(default_factory=set)  # shapes whose searches were released
    skipped: dict[int, str] = field(default_factory=dict)  # point -> why the cost bound settled it unsearched

    def admits(self, point: int) -> bool:
        return point in self.started

    def cap(self, shape: Shape) -> int:
        """The most replicas `shape` may probe under the ceiling (search.high without pruning)."""
        high = int(self.exp.search["high"])
        if not self.exp.search["prune"]:
            return high
        return min(high, math.floor((self.ceiling - shape.fixed_per_hour) / shape.per_replica * (1 + 1e-12)))

    def release(self, tasks: list) -> tuple[list[int], list[tuple[int, int]]]:  # tasks: search.PointTask
        """(shapes settled by the cost bound now, (task index, ceiling) of capped searches to resume). Shapes
        start when their lower bound is within the ceiling and the best settled interval's high end; once no
        search runs, either the answer is settled (every shape not searched to its end can only cost more than
        that high end: skipped) or the ceiling doubles (at least to the cheapest figure still relevant) and the
        relevant shapes go on."""
        searchable = [s for s in self.shapes.values() if not s.status]
        if not self.started and not self.ceiling:
            self.ceiling = 2 * min((s.lower_bound for s in searchable), default=0.0)
        mine = [(i, t) for i, t in enumerate(tasks) if not t.edge]
        best = self.best(tasks)
        limit = best[1] if best is not None else math.inf
        self._start(tasks, limit)
        if any(t.point.index in self.started and not t.done for _, t in mine):
            return [], []  # a search still runs: it may still settle a cheaper answer
        relevant = {s.point: low for s in searchable if not self.settled(s.point, tasks)
                    and (low := self.lowest(s, tasks)) <= limit}
        while relevant:  # raise the ceiling until a relevant search can go on (C doubles: it ends)
            self.ceiling = max(2 * self.ceiling, min(relevant.values()))
            started = self._start(tasks, limit)
            resume = [(i, self.cap(self.shapes[t.point.index])) for i, t in mine
                      if t.capped and t.point.index in relevant and self.cap(self.shapes[t.point.index]) > t.current]
            if started or resume:
                return [], resume
        skipped = [s.point for s in searchable if not self.settled(s.point, tasks)]
        for point in skipped:  # none without a best: then every unsettled shape was relevant
            assert best is not None
            shape, low = self.shapes[point], self.lowest(self.shapes[point], tasks)
            how = "searched up to the cost ceiling" if point in self.started else "the analytic bound: never simulated"
            prefill = f"the prefill pool's ${shape.fixed_per_hour:.4g}/h + " if shape.fixed_per_hour else ""
            self.skipped[point] = (
                f"at least {prefill}{(low - shape.fixed_per_hour) / shape.per_replica:g} replicas x "
                f"{shape.gpus_per_replica} GPUs x ${shape.price:.3g}/GPU-h = ${low:.4g}/h for its cheapest seed "
                f"({how}), above ${limit:.4g}/h, the high end of the cheapest shape's interval "
                f"({self.shapes[best[0]].label})")
        return skipped, []

    def _start(self, tasks: list, limit: float) -> list[int]:
        """Release the shapes whose lower bound lies within the ceiling and `limit` (every shape without
        pruning); set every unstarted search's ceiling. Returns the shapes released now."""
        now = []
        for shape in self.shapes.values():
            if shape.status or shape.point in self.started:
                continue
            if not self.exp.search["prune"] or shape.lower_bound <= min(self.ceiling, limit) * (1 + 1e-12):
                self.started.add(shape.point)
                now.append(shape.point)
        for task in tasks:
            if not task.edge and task.current is None and task.point.index in self.started:
                task.ceiling = self.cap(self.shapes[task.point.index])
        return now

    def settled(self, point: int, tasks: list) -> bool:
        """Is every seed's search of the shape at its end (an answer, or failing at search.high)?"""
        own = [t for t in tasks if t.point.index == point and not t.edge]
        return point in self.started and all(t.done and not t.capped for t in own)

    def lowest(self, shape: Shape, tasks: list) -> float:
        """$/h of the cheapest any seed of the shape can still need: its answer, one more than its ceiling
        where capped, else the analytic bound's fewest (infinite where it fails at search.high)."""
        values = []
        for task in (t for t in tasks if t.point.index == shape.point and not t.edge):
            if task.capped:
                values.append(task.current + 1)
            elif task.done and shape.point in self.started:
                values.append(math.inf if task.answer is None else task.answer)
            else:
                values.append(shape.fewest)
        return shape.hour(min(values, default=shape.fewest))

    def best(self, tasks: list) -> tuple[int, float] | None:
        """(the best-ranked settled shape that meets the SLOs, the high end of its cost interval), or None."""
        from kvplan.experiments.results import median_answer

        ranked = []
        for point in self.started:
            if not self.settled(point, tasks):
                continue
            answers = [t.answer for t in tasks if t.point.index == point and not t.edge]
            median = median_answer(answers, False)
            if median is None:
                continue
            shape = self.shapes[point]
            high = shape.hour(max(answers)) if all(a is not None for a in answers) else math.inf
            ranked.append((shape.hour(median), shape.fixed_gpus + shape.gpus_per_replica * median, median, point,
                           high))
        if not ranked:
            return None
        top = min(ranked)
        return top[3], top[4]


def cost_points(exp: Experiment, plan: CostPlan, points: pd.DataFrame) -> pd.DataFrame:
    """The points table of a min_cost search: the searched shapes' rows with their costs (none for a shape the
    cost bound settled), then a row for every shape rejected or skipped before it was simulated; statuses
    without the winner (`mark_winner`)."""
    from kvplan.experiments.points import expand

    rows = points.copy()
    capped = rows["point"].isin(list(plan.skipped))  # searched up to the ceiling, then settled by the cost bound
    rows.loc[capped, ["answer", "answer_low", "answer_high", "gpus"]] = math.nan  # no answer was found
    rows.loc[capped, ["binding_limit", "binding_key"]] = ["cost bound", "search.prune"]  # not search.high
    rows.loc[capped, "binding_detail"] = [plan.skipped[int(p)] for p in rows.loc[capped, "point"]]
    shape = [plan.shapes[int(p)] for p in rows["point"]]
    rows["price_per_gpu_hour"] = [s.price for s in shape]
    per = np.array([s.per_replica for s in shape])
    fixed = np.array([s.fixed_per_hour for s in shape])  # (a P/D shape's prefill pool; 0 co-located)
    rows["shape_cost_per_hour"] = fixed + rows["answer"].to_numpy(dtype=float) * per
    rows["shape_cost_low"] = fixed + rows["answer_low"].to_numpy(dtype=float) * per
    rows["shape_cost_high"] = fixed + rows["answer_high"].to_numpy(dtype=float) * per  # NaN: a seed found none
    # the GPU model's error band on the cost: the replicas re-found with every step's compute at the band's edges
    # (model_range; NaN where the point has no range or an edge search ended outside [low, high])
    rows["shape_cost_model_lo"] = fixed + rows["capacity_model_lo"].to_numpy(dtype=float) * per
    rows["shape_cost_model_hi"] = fixed + rows["capacity_model_hi"].to_numpy(dtype=float) * per
    rows["status"] = np.where(capped, "cost bound", np.where(np.isfinite(rows["shape_cost_per_hour"]), "feasible",
                                                             "SLO"))
    rows["status_reason"] = [plan.skipped[int(row["point"])] if status == "cost bound" else
                             slo_reason(exp, row) if status == "SLO" else ""
                             for (_, row), status in zip(rows.iterrows(), rows["status"], strict=True)]
    # the frontier's $ per million tokens (input and output together; the split per kind: sim.dollars' columns)
    rows["usd_per_m_tokens"] = rows["shape_cost_per_hour"] / (rows["total_token_throughput"] * 3600 / 1e6)
    rows["throughput_per_gpu"] = rows["total_token_throughput"] / rows["gpus"]
    extra = []
    values = {p.index: p for p in expand(exp)}
    for index, s in plan.shapes.items():
        if index in set(rows["point"]):
            continue
        status, reason = (s.status, s.reason) if s.status else ("cost bound", plan.skipped.get(index, ""))
        engine = values[index].config["engine"]
        extra.append({"point": index, "label": s.label, **values[index].values, "status": status,
                      "status_reason": reason, "price_per_gpu_hour": s.price, "gpus_per_replica":
                      s.gpus_per_replica, "fixed_gpus": s.fixed_gpus, "binding_limit": status,
                      "binding_key": KEYS[status], "binding_votes": 0,
                      "binding_of": 0, "binding_detail": reason, "answer": math.nan, "answer_low": math.nan,
                      "answer_high": math.nan,
                      "search_outcome": status, "skipped": "", "answers": "", "model_range_note": "",
                      "engine.tensor_parallel_size": engine.get("tensor_parallel_size", 1)})
    out = pd.concat([rows, pd.DataFrame(extra)], ignore_index=True) if extra else rows
    bound = {i: s for i, s in plan.shapes.items()}
    out["lower_bound_replicas"] = [bound[int(p)].fewest if not bound[int(p)].status else math.nan
                                   for p in out["point"]]
    out["lower_bound_per_hour"] = out["lower_bound_replicas"] * out["gpus_per_replica"] * out["price_per_gpu_hour"] \
        + [bound[int(p)].fixed_per_hour for p in out["point"]]  # (a P/D shape's prefill pool)
    latency = exp.search["latency"]
    feasible = out["status"] == "feasible"
    out["frontier_throughput"] = pareto(out[latency], out["throughput_per_gpu"], feasible, maximize=True)
    out["frontier_cost"] = pareto(out[latency], out["usd_per_m_tokens"], feasible, maximize=False)
    return out.sort_values("point", kind="stable").reset_index(drop=True)


def slo_reason(exp: Experiment, row: pd.Series) -> str:
    """Why a searched shape meets no SLO up to search.high: the search's outcome and the failed lines there."""
    outcome, detail = str(row.get("search_outcome") or ""), str(row.get("binding_detail") or "")
    return detail if detail.startswith(outcome) else "; ".join(x for x in (outcome, detail) if x)


def pareto(latency: pd.Series, value: pd.Series, eligible: pd.Series, *, maximize: bool) -> list[bool]:
    """Which eligible rows are on the Pareto frontier of (lower latency, higher - or lower - value): no other
    eligible row is at least as good on both and better on one."""
    x = latency.to_numpy(dtype=float)
    y = value.to_numpy(dtype=float) * (-1 if maximize else 1)  # lower is better on both axes
    ok = eligible.to_numpy(dtype=bool) & np.isfinite(x) & np.isfinite(y)
    out = []
    for i in range(len(x)):
        if not ok[i]:
            out.append(False)
            continue
        beaten = ok & (x <= x[i]) & (y <= y[i]) & ((x < x[i]) | (y < y[i]))
        out.append(not beaten.any())
    return out


def mark_winner(points: pd.DataFrame, rec) -> pd.DataFrame:  # rec: ranking.Recommendation
    """The recommendation's point is the winner, the points tied for cheapest are ties."""
    out = points.copy()
    for index in ([rec.point] if rec.point is not None else []) + list(rec.tie):
        out.loc[out["point"] == index, "status"] = "winner" if index == rec.point else "tie"
    return out
