"""Steady-state probes: one load level held for a fixed simulated duration, measured over a trimmed window.

    0 ---- warm-up ---- w0 ============ measurement window ============ w1 -- cool-down -- D ---- grace ---- stop
         arrivals at the probed load for the whole [0, D); the run goes on after D until every request has
         finished or D + grace, whichever is first

* **Load** (`Probe.mode`): `sustained` - an open-loop arrival process at `rate` requests per second drawn from the
  trace's population (`traces.steady.open_loop`); `concurrency` - `concurrency` users in a closed loop
  (`sim.closed_loop`). (The third question, burst absorption - the recorded trace time-scaled - is a plain
  `sim.run.simulate` of the scaled trace: it has no steady state to measure.)
* **Duration.** D is the larger of `duration_s` (600 s) and enough for `min_requests` (1,000) to arrive inside
  the window at the probed rate; a probe whose window then holds fewer than `min_requests` measured requests, or
  is shorter than 10x their p99 E2E latency, is run again at twice the duration (at most twice).
* **Window.** Warm-up and cool-down default to 10% of D each, grace to 20%. Latencies and goodput are over the
  requests arriving inside the window; throughput counts the completions inside it; inter-token gaps count
  tokens produced inside it; KV usage and the memory breakdown average the series samples inside it; the
  counters (prefix hits, preemptions, evictions) are the change across it. Requests arriving in the warm-up
  or cool-down, and those unfinished when the run stops, are counted (`info["probe"]`), never averaged in.
* **Overload check** (sustained): at every series sample, a replica whose waiting queue holds more than
  `overload_wait_s` (30 s) of its share of arrivals (and at least 32 requests) stops the run; the probe is then
  overloaded (`sim.stability`), and the slowest kind of run ends early.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from kvplan.errors import UserError
from kvplan.results.rejected import references, rejected_rows
from kvplan.results.serving_result import ServingResult
from kvplan.results.summary import kv_summary, latency_summary
from kvplan.sim.closed_loop import ClosedLoop
from kvplan.sim.cluster import Cluster
from kvplan.sim.cost.scaled import scaled
from kvplan.sim.disagg import DisaggCluster
from kvplan.sim.frontend import FrontendRun
from kvplan.sim.pd_run import build_cluster, part_summary, pools_info
from kvplan.sim.pd_run import frontend_info as pd_frontend_info
from kvplan.sim.pd_run import request_table as pd_request_table
from kvplan.sim.replica import SERIES_COLUMNS
from kvplan.sim.routers import make_router
from kvplan.sim.run import (
    build_configs,
    build_cost,
    check_trace,
    client_view,
    serving_extras,
    through_frontend,
    work_seconds,
)
from kvplan.sim.spec import SimSpec
from kvplan.sim.stability import Bounds, ProbeSignals, judge
from kvplan.traces.steady import MAX_PROBE_REQUESTS, Population, open_loop

MODES = ("sustained", "concurrency")
OVERLOAD_MIN_WAITING = 32
MAX_EXTENSIONS = 2
SAMPLES_PER_PROBE = 200
E2E_MULTIPLE = 10  # the window must last this many p99 E2E latencies


@dataclass(slots=True)
class Probe:
    """One load level and how it is measured."""

    mode: str = "sustained"
    rate: float | None = None  # sustained: requests per second; None: the trace's own mean rate
    arrivals: str = "measured"  # traces.steady.ARRIVALS
    concurrency: int = 1  # concurrency: users
    think_s: float = 0.0  # concurrency: pause between a user's answer and its next request
    duration_s: float = 600.0
    min_requests: int = 1000
    warmup_s: float | None = None  # default: 10% of the duration
    cooldown_s: float | None = None  # default: 10%
    grace_s: float | None = None  # default: 20%
    overload_wait_s: float = 30.0
    # The stability gates' bounds (sim.stability.Bounds; the experiment schema's PROBE has the same defaults).
    max_unfinished_overloaded: float = 0.05
    max_unfinished_backlogged: float = 0.01
    max_queue_delay_s: float = 5.0  # a stable probe's p99 scheduling delay
    queue_growth: float = 1.5
    queue_margin_s: float = 2.0
    ttft_growth: float = 2.0
    ttft_margin_ms: float = 250.0
    goodput: dict[str, float | None] | None = None  # per-request bounds (results.goodput.REQUEST_BOUNDS keys)

    def offered_rate(self, pop: Population) -> float:
        rate = self.rate if self.rate is not None else pop.mean_rate
        if rate is None:
            raise UserError("workload.rate: the trace has no timestamps to take a rate from; allowed: a rate "
                             "in requests per second")
        return rate

    def edges(self, duration: float) -> tuple[float, float, float]:
        """(window start, window end, grace) for a probe of `duration` seconds."""
        warmup = 0.1 * duration if self.warmup_s is None else self.warmup_s
        cooldown = 0.1 * duration if self.cooldown_s is None else self.cooldown_s
        grace = 0.2 * duration if self.grace_s is None else self.grace_s
        if warmup + cooldown >= duration:
            raise UserError(f"probe: warm-up {warmup:g} s + cool-down {cooldown:g} s leave no measurement window "
                             f"in {duration:g} s; allowed: a sum below duration_s")
        return warmup, duration - cooldown, grace

    def check(self, pop: Population) -> None:
        """Refuse, before anything runs, a probe that cannot be measured or would not fit in memory."""
        duration = self.first_duration(pop)
        self.edges(duration)
        if self.mode == "sustained":
            expected = self.offered_rate(pop) * duration * (2 ** MAX_EXTENSIONS)
            if expected > MAX_PROBE_REQUESTS:
                raise UserError(f"workload.rate: {self.offered_rate(pop):g} req/s for up to {duration:g} s (x"
                                 f"{2 ** MAX_EXTENSIONS} if lengthened) is {expected:.3g} requests; allowed: at most "
                                 f"{MAX_PROBE_REQUESTS} in one probe (a lower rate, probe.duration_s or "
                                 "probe.min_requests)")

    def first_duration(self, pop: Population) -> float:
        if self.mode != "sustained":
            return self.duration_s
        w0, w1, _ = self.edges(self.duration_s)
        share = (w1 - w0) / self.duration_s
        return max(self.duration_s, self.min_requests / (self.offered_rate(pop) * share))


def run_probe(pop: Population, spec: SimSpec, probe: Probe, seed: int, step_scale: float = 1.0) -> ServingResult:
    """Simulate one probe, lengthening it while its window is too short (see the module docstring).
    `step_scale` multiplies every step's compute time (`sim.cost.scaled`: an edge of the model-error band)."""
    if probe.mode not in MODES:
        raise UserError(f"unknown probe mode {probe.mode!r}; allowed: {', '.join(MODES)}")
    duration, extension = probe.first_duration(pop), 0
    while True:
        result = _run(pop, spec, probe, seed, duration, step_scale)
        info = result.info["probe"]
        info["extensions"] = extension
        measured, p99 = info["measured_requests"], result.summary["p99_e2el_ms"]
        w0, w1 = info["window_s"]
        short = measured < probe.min_requests or (p99 is not None and math.isfinite(p99)
                                                  and (w1 - w0) < E2E_MULTIPLE * p99 / 1e3)
        if info["verdict"] == "overloaded" or not short or extension == MAX_EXTENSIONS:
            return result
        duration *= 2
        extension += 1


def _run(pop: Population, spec: SimSpec, probe: Probe, seed: int, duration: float,
         step_scale: float) -> ServingResult:
    w0, w1, grace = probe.edges(duration)
    loop = None
    pd = spec.disaggregation
    if probe.mode == "sustained":
        rate = probe.offered_rate(pop)
        trace = open_loop(pop, rate, duration, seed, probe.arrivals)
        check_trace(trace, f"a {rate:g} req/s, {duration:g} s probe")
        # the clients' arrivals through the API server: the engine sees each one later (sim.frontend); a P/D
        # run's API servers are its cluster's (sim.pd_frontend, below)
        trace, front = through_frontend(spec, trace) if pd is None else (trace, None)
    elif pd is not None:
        raise UserError(f"workload.mode: {probe.mode}: a closed loop through P/D pools is not modelled; allowed: "
                        "sustained (or burst)")
    else:
        rate = math.nan
        loop = ClosedLoop(pop, probe.concurrency, probe.think_s, duration, seed)
        trace, front = pop.trace, None  # a closed loop's users see the engine's times (no API server modelled)
    interval = spec.sample_interval_s or duration / SAMPLES_PER_PROBE
    cluster: Cluster | DisaggCluster
    pd_info: dict = {}
    extra: dict = {}
    if pd is None:
        cost, num_blocks = build_cost(spec)
        cost = scaled(cost, step_scale)
        cache, config = build_configs(spec, pop.trace, num_blocks, cost)  # the population's lengths: per probe same
        cluster = Cluster(trace, spec.replicas, make_router(spec.router), cache, config, cost,
                          sample_interval_s=interval, fast_path=spec.fast_path, closed_loop=loop,
                          layerwise=spec.kv_offloading_layerwise,
                          hash_ids_named=pop.hash_ids_named)  # (the workload: copies of its sessions)
        shares = [spec.replicas] * spec.replicas  # replicas sharing the arrivals, per replica
    else:
        # (the pools' KV capacity and scheduler limits from the population's lengths, as above)
        cluster, pd_info, extra = build_cluster(trace, spec, pd, lambda *_: interval, step_scale, pop.trace)
        front = None if cluster.frontend is None else cluster.frontend.prefill
        num_blocks = extra["num_blocks"]
        shares = [pd.prefill_replicas] * pd.prefill_replicas + [pd.decode_replicas] * pd.decode_replicas
    limits = [max(OVERLOAD_MIN_WAITING, rate / n * probe.overload_wait_s) if loop is None else math.inf
              for n in shares]

    def check(replica) -> None:
        waiting = len(replica.sched.waiting)
        if waiting >= limits[replica.index]:
            cluster.stop(f"{waiting} requests waiting on replica {replica.index} at {replica.clock:.0f} s, more "
                         f"than {probe.overload_wait_s:g} s of its arrivals")

    for replica in cluster.replicas:
        replica.tokens.itl_from, replica.tokens.itl_until, replica.mark_times = w0, w1, [w0, w1]
        replica.on_sample = check
    reason = cluster.run(until_s=duration + grace)
    stopped = cluster.env.now
    early = "" if reason.startswith("horizon") else reason
    result = _collect(cluster, num_blocks, probe, (w0, w1), stopped, early, duration, rate, front)
    if isinstance(cluster, DisaggCluster):
        pd_info["pools"] = pools_info(cluster, pd_info)
        result.info.update(disaggregation=pd_info, **{k: v for k, v in extra.items() if k != "num_blocks"})
    return result


def _collect(cluster: Cluster | DisaggCluster, num_blocks: int, probe: Probe, window: tuple[float, float],
             stopped: float, early: str, duration: float, rate: float,
             front: FrontendRun | None = None) -> ServingResult:
    trace = cluster.trace
    w0, w1 = window
    length = w1 - w0
    sent = len(trace) if cluster.closed_loop is not None else cluster.next_row
    # the clients' arrivals place a request in a phase (the engine's come later by the API server's time)
    offered = trace.arrival_s if front is None else front.client_arrival_s  # every arrival, sent or not yet
    arrival = offered[:sent]
    series = pd.DataFrame(cluster.series_rows(), columns=list(SERIES_COLUMNS))
    if isinstance(cluster, DisaggCluster):  # the client's table behind the proxy, with the TTFT's parts
        table = pd_request_table(cluster)
        front_info = pd_frontend_info(cluster, table)
    else:
        table, front_info = client_view(cluster.log, trace.request_id, series, front)
    table.insert(list(table.columns).index("arrival_s"), "phase", _phase(table["arrival_s"].to_numpy(), w0, w1))
    finished = np.zeros(sent, dtype=bool)
    if len(table):
        samples = table.groupby("request").size()
        rows = samples.index.to_numpy()
        finished[rows] = samples.to_numpy() >= trace.n[rows]
    rejected = np.zeros(sent, dtype=bool)
    refused = [row for row, _ in cluster.rejected()]
    rejected[[r for r in refused if r < sent]] = True
    measured = (arrival >= w0) & (arrival < w1)
    mid = (w0 + w1) / 2

    frame = table[table["phase"] == "measured"]
    loop_free = cluster.closed_loop is None
    # (a column first, then its rows: a row mask on the table takes every column, the request ids' strings too)
    first = frame["ttft_ms"][(frame["sample"] == 0) & (frame["arrival_s"] < mid)]
    second = frame["ttft_ms"][(frame["sample"] == 0) & (frame["arrival_s"] >= mid)]
    inside = series[(series["time_s"] >= w0) & (series["time_s"] < w1)]

    def queue(lo: float, hi: float) -> float:
        part = inside[(inside["time_s"] >= lo) & (inside["time_s"] < hi)]
        return float(part.groupby("replica")["waiting"].mean().sum()) if len(part) else 0.0

    signals = ProbeSignals(
        window_s=(w0, w1), stopped_s=stopped, sent=sent, warmup_requests=int(np.count_nonzero(arrival < w0)),
        measured_requests=int(np.count_nonzero(measured)), cooldown_requests=int(np.count_nonzero(arrival >= w1)),
        completed_measured=int(np.count_nonzero(finished & measured)),
        rejected_measured=int(np.count_nonzero(rejected & measured)),
        unfinished_requests=int(np.count_nonzero(~finished & ~rejected)),
        queue_first=queue(w0, mid), queue_second=queue(mid, w1),
        ttft_first_ms=float(first.median()) if len(first) else math.nan,
        ttft_second_ms=float(second.median()) if len(second) else math.nan,
        p99_queue_delay_ms=float(frame["queueing_ms"].quantile(0.99)) if len(frame) else math.nan,
        offered_rps=offered_rate(offered, w0, w1), stopped_early=early)
    # A closed loop's queue is bounded by its users: its delay is the SLOs' business, not a sign of instability.
    verdict, reasons = judge(signals, Bounds.of(asdict(probe), open_loop=loop_free))

    summary = latency_summary(frame, cluster.itl(), probe.goodput, duration_s=length)
    if isinstance(cluster, DisaggCluster):
        summary.update(part_summary(frame))
    done = table[["output_tokens", "sample", "prompt_tokens"]][(table["finish_s"] >= w0) & (table["finish_s"] < w1)]
    output = int(done["output_tokens"].sum())
    prompt = int(done.loc[done["sample"] == 0, "prompt_tokens"].sum())
    summary.update(request_throughput=int((done["sample"] == 0).sum()) / length,
                   output_throughput=output / length, total_token_throughput=(output + prompt) / length)
    replicas = cluster.replicas
    counters = _window_counters(cluster)
    usage = float(inside["kv_usage"].mean()) if len(inside) else 0.0
    peak = float(inside["kv_usage"].max()) if len(inside) else 0.0
    summary.update(kv_summary(usage, 1.0, peak, inside, counters))
    summary["num_rejected"] = signals.rejected_measured
    probe_info = {"mode": probe.mode, "rate_rps": None if math.isnan(rate) else rate,
                  "concurrency": probe.concurrency if probe.mode == "concurrency" else None,
                  "duration_s": duration, **signals.as_dict(), "verdict": verdict, "reasons": reasons}
    rejected_list = cluster.rejected()
    never_served = rejected_rows(trace, rejected_list)
    never_served.insert(list(never_served.columns).index("arrival_s"), "phase",
                        _phase(never_served["arrival_s"].to_numpy(), w0, w1))
    info = {"num_blocks": num_blocks, "block_size": replicas[0].block_size, "replicas": len(replicas),
            "steps": sum(r.sched.stats.num_steps for r in replicas),
            "fast_steps": sum(r.num_fast_steps for r in replicas), "rejected": len(rejected_list),
            "rejected_first": references(trace, rejected_list), "probe": probe_info, **work_seconds(replicas),
            **serving_extras(counters)}  # (the window's adapter loads and verifications)
    if front_info is not None:
        info["frontend"] = front_info
    return ServingResult(summary, table, series, info, rejected=never_served)


def offered_rate(arrival_s: np.ndarray, w0: float, w1: float) -> float:
    """Requests per second offered in the window [w0, w1): the clients' arrivals scheduled there, over its length.
    `arrival_s` is every scheduled arrival - an open loop draws them all before the run - so a run the overload
    check stopped early still reports the load it was offered, not the part it got to (which read low: 0 for a
    stop in the warm-up). A closed loop is never stopped early: its arrivals are the ones its users sent."""
    return float(np.count_nonzero((arrival_s >= w0) & (arrival_s < w1))) / (w1 - w0)


def _phase(arrival_s: np.ndarray, w0: float, w1: float) -> np.ndarray:
    return np.where(arrival_s < w0, "warmup", np.where(arrival_s < w1, "measured", "cooldown"))


def _window_counters(cluster: Cluster | DisaggCluster) -> dict[str, int]:
    """The counters' change across the window, summed over replicas (a replica with no sample past an edge -
    idle since before it - changed nothing after it)."""
    totals: dict[str, int] = {}
    for replica in cluster.replicas:
        now = replica.counters()
        start = replica.marks[0] if replica.marks else now
        end = replica.marks[1] if len(replica.marks) > 1 else now
        for key in now:
            totals[key] = totals.get(key, 0) + end[key] - start[key]
    return totals
