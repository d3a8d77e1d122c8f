"""How long a plan will take, before it runs (`kvplan run --explain`), and how many runs a search makes (the
progress meter's prior, `experiments.progress`).

    wall = max(sum over runs of their seconds / workers,  the longest chain of rounds that wait for each other)

* **Runs per search** (`search_probes`): a full bisection probes `low` and `high`, then halves the bracket until it
  is within the tolerance - ceil(log2(log(high/low) / log(1 + tolerance))) geometric midpoints for a rate or a
  scale, ceil(log2(high - low)) for users or replicas - the count a search whose answer lies inside [low, high]
  makes (one that ends at a bound makes fewer). A guided search (a median's other seeds, a model-range edge) starts
  from its leader's bracket: `GUIDED_PROBES` (3: the mean over the guided seeds of experiments/quickstart.yaml in a
  recorded run - 2 each, but 6 each for one point's two seeds, whose answers lay outside their leader's bracket; its
  edge searches made 2 each). A plain point makes one round. A round runs one seed (`combine: median`) or every seed
  (`combine: all`, plain points).
* **Seconds per run** (`point_cost`): measured now, in this process, per point (the first points until
  `MICRO_BUDGET_S` of micro-runs is spent; the others are taken at their mean): a micro-run of the point at the
  search's middle value (the geometric midpoint of [low, high]), after an untimed `WARM_S` warm-up (the first call's
  imports and caches) and a timed one (what a simulation costs whatever its length), its simulated duration doubled
  from `MICRO_START_S` until its simulated seconds took `MICRO_WALL_S` beyond that, sampled as the full probe is.
  Its verdict (stable and within the SLOs, or not) says in which half of [low, high] the answer lies; the search's
  probes are priced at that half's geometric midpoint - a probe's cost grows with the requests it simulates, its
  rate (or users) times its full duration (`Probe.first_duration`, the share of its grace period the micro-run's
  tail used, and the lengthenings `sim.probe` will make: `probe_span`). A burst replay is timed on a growing slice
  of its trace and scaled by requests.
* **The chain**: a point's guided searches wait for its first search, the recommended point's edge searches
  for every answer (priced as the costliest point: the one recommended, as a rule); a round's runs run in
  parallel, its rounds one after another.

Rough by construction: probes above capacity stop early (cheaper), probes near it run longer queues and may be
lengthened more than priced, the runs' result tables are not timed, and the micro-runs time this machine as it is
now - on a shared machine whose load swings, the runs may meet another. docs/progress.md says how to check it
against a real run.
"""

from __future__ import annotations

import copy
import math
import tempfile
import time
from dataclasses import dataclass

from kvplan.experiments.pd_block import varied_key
from kvplan.experiments.points import Point, run_config
from kvplan.experiments.schema import INTEGER_TARGETS, REPLICA_TARGETS, Experiment

GUIDED_PROBES = 3
WARM_S = 5.0  # simulated seconds of the untimed warm-up run before a point's micro-runs
MICRO_START_S = 20.0  # simulated seconds of a point's first micro-run
MICRO_WALL_S = 0.25  # wall seconds of simulating (beyond a simulation's fixed cost) that make a measurement
MICRO_BUDGET_S = 1.0  # micro-runs stop timing further points after this much wall time
PER_REQUEST = ("max_rate", "max_goodput", "max_concurrency")  # a probe's requests grow with its value


def search_probes(search: dict | None, guided: bool = False) -> int:
    """The rounds one search makes (module docstring); 1 for a plain point."""
    if search is None:
        return 1
    if guided:
        return GUIDED_PROBES
    low, high = search["low"], search["high"]
    if search["target"] in INTEGER_TARGETS:
        steps = math.ceil(math.log2(high - low)) if high - low > 1 else 0
    else:
        ratio = math.log(high / low) / math.log(1 + search["tolerance"])
        steps = math.ceil(math.log2(ratio)) if ratio > 1 else 0
    return 2 + steps


def _between(search: dict, lo: float, hi: float) -> float | int:
    """The geometric midpoint of [lo, hi] (rounded for a count)."""
    mid = math.sqrt(lo * hi)
    return max(round(mid), search["low"]) if search["target"] in INTEGER_TARGETS else mid


def edge_searches(exp: Experiment, points: list[Point], scales: dict[int, tuple[float, float]]) -> int:
    """The model-range edge searches the plan makes (`search.edge_tasks`: one per band end away from 1, none for
    a burst replay): every point's (`every_point`), the most one point gets (`recommended`: whichever point it
    recommends, counted before it is known), or none."""
    mode = exp.search["model_range"] if exp.search else "none"
    counts = [sum(f != 1.0 for f in scales[p.index]) for p in points
              if p.index in scales and p.config["workload"]["mode"] != "burst"]
    return sum(counts) if mode == "every_point" else max(counts, default=0) if mode == "recommended" else 0


@dataclass(slots=True)
class Estimate:
    """The plan's expected work and wall time (module docstring)."""

    searches: int  # searches (or plain points), the model-range edge searches included
    runs: int  # runs they are expected to make
    run_s: float  # mean seconds per run (measured now)
    wall_s: float  # the whole plan on `workers`
    workers: int
    timed: int  # points whose runs were timed by a micro-run (the others at their mean)
    micro_s: float  # wall seconds the micro-runs took
    searched: bool = True  # searches, or plain points

    def as_dict(self) -> dict:
        return {"searches": self.searches, "runs": self.runs, "run_s": self.run_s, "wall_s": self.wall_s,
                "workers": self.workers, "timed_points": self.timed, "micro_run_s": self.micro_s,
                "basis": "micro-runs now"}

    def lines(self) -> list[str]:
        """Two lines under 100 columns: the figure, then where it comes from."""
        wall = f"{self.wall_s:.0f} s" if self.wall_s < 120 else f"{self.wall_s / 60:.1f} min"
        noun = "searches" if self.searched else "points"
        return [f"estimate: ~{wall} on {self.workers} worker(s): {self.searches} {noun}, ~{self.runs} runs of "
                f"~{self.run_s:.2g} s",
                f"  (run time measured now by {self.micro_s:.1f} s of micro-runs of {self.timed} point(s); rough: "
                "docs/progress.md)"]


def estimate_plan(exp: Experiment, points: list[Point], edges: int, workers: int) -> Estimate:
    """The plan's wall time from the rounds it makes and micro-runs of its points (module docstring)."""
    search = exp.search
    full, guided = search_probes(search), search_probes(search, guided=True)
    median = search is not None and search["combine"] == "median"
    followers = len(exp.seeds) - 1 if median else 0  # a point's guided seeds, led by its first search
    round_runs = 1 if median else len(exp.seeds)
    every = search is not None and search["model_range"] == "every_point"
    own = edges / len(points) if every else 0.0  # every_point: a point's edges follow its first search
    late = 0 if every else edges  # recommended: after every answer, at the recommended point
    timed, micro_s = point_costs(exp, points)
    costs = [timed.get(p.index, sum(timed.values()) / len(timed)) for p in points]
    dearest = max(costs)
    rounds = full + guided * (followers + own)  # one point's rounds
    work = round_runs * (rounds * sum(costs) + guided * late * dearest)
    chain = (full + (guided if followers or own else 0) + (guided if late else 0)) * dearest
    runs = round_runs * (rounds * len(points) + guided * late)
    workers = max(workers, 1)
    searches = len(points) * (1 + followers) + edges
    return Estimate(searches, round(runs), work / runs, max(work / workers, chain), workers, len(timed), micro_s,
                    search is not None)


def point_costs(exp: Experiment, points: list[Point]) -> tuple[dict[int, float], float]:
    """(point index -> seconds per run, for the points timed within `MICRO_BUDGET_S`; the wall time spent)."""
    costs: dict[int, float] = {}
    spent = 0.0
    for point in points:
        if costs and spent >= MICRO_BUDGET_S:
            break
        start = time.perf_counter()
        costs[point.index] = point_cost(exp, point)
        spent += time.perf_counter() - start
    return costs, spent


def point_cost(exp: Experiment, point: Point) -> float:
    """Seconds one run of `point`'s search takes, by micro-runs in this process (module docstring)."""
    from kvplan.experiments.execute import build_probe, build_trace, execute_run, population, simulate_config
    from kvplan.experiments.search import slo_verdict
    from kvplan.sim.probe import SAMPLES_PER_PROBE

    search = exp.search
    probe: dict[str, object] | None = None
    if search is not None:
        key, mid = varied_key(exp, point.config), _between(search, search["low"], search["high"])
        probe = {key: mid}
    # per-request SLO bounds are judged inside a run, as `search.PointTask` passes them
    extra = {"attainment": exp.attainment} if exp.attainment else {}
    if exp.goodput_bounds:
        extra["goodput"] = exp.goodput_bounds
    config = run_config(point.config, exp.seeds[0], probe) | extra
    if config["workload"]["mode"] == "burst":  # the same requests at any rate scale: priced per request
        from kvplan.traces.transforms import window

        trace = build_trace(config)
        start, end = float(trace.arrival_s[0]), float(trace.arrival_s[-1])
        span = max((end - start) / 64, 1e-3)
        while True:
            part = window(trace, start, start + span)
            wall, _ = _timed(simulate_config, config, part)
            if wall >= MICRO_WALL_S or len(part) == len(trace):
                return wall / max(len(part), 1) * len(trace)
            span *= 2
    full = build_probe(config).first_duration(population(config))
    simulated = min(MICRO_START_S, full)
    # the full probe's series sampling (`sim.probe`: a fixed number of samples a probe), not a short run's denser one
    sampled = {"sample_interval_s": full / SAMPLES_PER_PROBE}
    warm = copy.deepcopy(config)  # untimed: the simulator's first call imports and builds what later ones reuse
    warm["probe"].update(duration_s=min(WARM_S, full), min_requests=1)
    warm["engine"].update(sampled)
    with tempfile.TemporaryDirectory(prefix="kvplan-estimate-") as tmp:
        written = iter(range(1 << 30))  # each run writes its own directory, as `runner` gives each its own

        def run(micro: dict) -> tuple[float, dict]:  # (wall seconds, summary.json) of a run written whole
            return _timed(execute_run, micro, f"{tmp}/{next(written)}", exp.outputs["tables"])

        run(warm)
        # the same short run again, timed: what a run costs whatever its length (building the cluster and the
        # cost model, writing its files), counted once per simulation, not per simulated second
        fixed_wall, short = run(warm)
        fixed = fixed_wall / (short["probe"]["extensions"] + 1)
        while True:
            micro = copy.deepcopy(config)
            micro["probe"].update(duration_s=simulated, min_requests=1)
            micro["engine"].update(sampled)
            wall, doc = run(micro)
            info = doc["probe"]
            marginal = max(wall - fixed * (info["extensions"] + 1), 0.0)  # the simulated seconds' own share
            if marginal >= MICRO_WALL_S or simulated >= full:
                break
            simulated = min(simulated * 2, full)
    # a lengthened micro-run simulated every duration it tried; one stopped early, up to the stop
    per_second = marginal / max(simulated * (2 ** info["extensions"] - 1) + info["stopped_s"], 1e-9)
    # the share of its grace period the micro-run's tail used (its last requests finishing after the arrivals)
    grace = build_probe(micro).edges(info["duration_s"])[2]
    tail = min(max(info["stopped_s"] - info["duration_s"], 0.0) / grace, 1.0) if grace > 0 else 0.0
    p99 = doc["summary"]["p99_e2el_ms"]
    if search is None:
        span, simulations = probe_span(config, info["offered_rps"], p99, tail)
        return fixed * simulations + per_second * span
    met = slo_verdict(exp, doc)[0]
    upward = search["target"] not in REPLICA_TARGETS  # meets below the answer
    above = met == upward  # the answer lies above the middle
    typical = _between(search, mid, search["high"]) if above else _between(search, search["low"], mid)
    at = run_config(point.config, exp.seeds[0], {key: typical})
    load = typical / mid if search["target"] in PER_REQUEST else 1.0
    span, simulations = probe_span(at, info["offered_rps"] * load, p99, tail)
    return fixed * simulations + per_second * load * span


def probe_span(config: dict, offered_rps: float, p99_e2el_ms: float | None, tail: float) -> tuple[float, float]:
    """(simulated seconds, simulations) of a full probe of `config`: its duration D and the share `tail` of its
    grace period, once, or three times over when `sim.probe` will lengthen it to 2D (a run of D, then one of 2D):
    when its window is shorter than `E2E_MULTIPLE` p99 E2E latencies, or expects fewer than `min_requests` requests
    (at its rate setting; a closed loop at `offered_rps`); twice over (one lengthening in two) when it expects under
    10% more - the case whenever `min_requests`, not `duration_s`, set D, since D is then just long enough on
    average."""
    from kvplan.experiments.execute import build_probe, population
    from kvplan.sim.probe import E2E_MULTIPLE

    probe = build_probe(config)
    pop = population(config)
    duration = probe.first_duration(pop)
    w0, w1, grace = probe.edges(duration)
    # an open loop's rate is its setting (a short micro-run's count is noisy); a closed loop's, as measured
    expected = (probe.offered_rate(pop) if probe.mode == "sustained" else offered_rps) * (w1 - w0)
    slow = p99_e2el_ms is not None and math.isfinite(p99_e2el_ms) and (w1 - w0) < E2E_MULTIPLE * p99_e2el_ms / 1e3
    runs = 3.0 if slow or expected < probe.min_requests else 2.0 if expected < 1.1 * probe.min_requests else 1.0
    return runs * (duration + tail * grace), (runs + 1) / 2  # 1, 1.5 or 2 simulations


def _timed(work, *args):  # -> (wall seconds, what work returned)
    start = time.perf_counter()
    value = work(*args)
    return time.perf_counter() - start, value
