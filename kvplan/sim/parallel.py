"""Replicas behind a round-robin router, simulated in separate processes: the same result as one process.

A round robin decides every placement in advance - the k-th servable arrival goes to replica k mod N, whatever
the replicas' state - and replicas share nothing else, so each replica's share of the trace can be replayed on
its own, in its own process, and the pieces put back together:

* requests keep their trace rows as names (and prefix-cache salts), so every key, queue order and block id is
  the one of the whole run; the per-request table is ordered by (request, sample) whatever order rows come in;
* each replica's fast path is bounded by its own next arrival, exactly what the whole run's round robin gives
  it (`Cluster._next_arrival`), and it samples its series at its own step ends on the same interval;
* the inter-token gaps are a multiset (counts per microsecond), the counters sums, the KV integral a sum in
  replica order - all independent of how the replicas' events interleave.

Only an exact tie between an arrival and a step end - a float equal to the last bit - could be ordered
differently, as SimPy orders simultaneous events by when they were scheduled; `tests/sim/test_parallel.py`
compares whole results.
"""

from __future__ import annotations

import gc
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_all_start_methods, get_context

import numpy as np

from kvplan.engine.core import CacheConfig, SchedulerConfig
from kvplan.engine.core.kv_layout import KVLayout
from kvplan.results.itl import ItlLog
from kvplan.results.request_table import RequestLog
from kvplan.sim.cluster import UNSERVABLE, Cluster, counter_totals, merged_itl, rejected_rows, series_rows
from kvplan.sim.cost import CostModel
from kvplan.sim.routers import RoundRobin
from kvplan.traces import Trace

START_METHOD = "fork" if "fork" in get_all_start_methods() else "spawn"
MIN_PARALLEL_REQUESTS = 20_000  # below this, starting the processes (about a second each) costs more than it saves

@dataclass(slots=True)
class ReplicaPart:
    """What one replica's process sends back: everything `sim.run.collect` reads of a replica."""

    index: int
    block_size: int
    log: RequestLog  # request column already the whole trace's rows
    series: list[tuple]
    itl: ItlLog
    counters_at_end: dict[str, int]
    rejected: list[tuple[int, str]]
    usage_seconds: float
    peak_usage: float
    num_steps: int
    num_fast_steps: int
    token_times: None = None  # recording token times is step by step, in one process
    kv_layout: KVLayout | None = None  # a hybrid model's KV cache groups (`Replica.kv_layout`), and its per-kind usage
    kind_block_seconds: list[float] | None = None
    kind_peak_blocks: list[int] | None = None
    busy_seconds: float = 0.0  # `Replica.busy_seconds` and `prefill_seconds`: GPU time by kind of work
    prefill_seconds: float = 0.0

    def counters(self) -> dict[str, int]:
        return self.counters_at_end


@dataclass(slots=True)
class MergedCluster:
    """The replicas' parts put together, with the `Cluster` methods `collect` uses."""

    trace: Trace
    replicas: list[ReplicaPart]
    unservable: list[tuple[int, str]] = field(default_factory=list)
    log: RequestLog = field(default_factory=RequestLog)

    def __post_init__(self) -> None:
        for part in self.replicas:
            self.log.extend(part.log)

    # The same sums over replicas as a Cluster's
    def itl(self) -> ItlLog:
        return merged_itl(self.replicas)

    def series_rows(self) -> list[tuple]:
        return series_rows(self.replicas)

    def counters(self) -> dict[str, int]:
        return counter_totals(self.replicas, self.unservable)

    def rejected(self) -> list[tuple[int, str]]:
        return rejected_rows(self.replicas, self.unservable)


def shares(trace: Trace, num_replicas: int) -> tuple[list[np.ndarray], list[tuple[int, str]]]:
    """Each replica's trace rows under a round robin, and the unservable rows (skipped before the router, so
    they take no turn)."""
    servable = trace.servable
    rows = np.flatnonzero(servable)
    unservable = [(int(r), UNSERVABLE) for r in np.flatnonzero(~servable)]
    return [rows[i::num_replicas] for i in range(num_replicas)], unservable


def run_replica(share: Trace, names: list[int], index: int, cache: CacheConfig, config: SchedulerConfig,
                cost: CostModel, interval: float, fast_path: bool, layerwise: bool = False) -> ReplicaPart:
    """Replica `index`'s share of the trace (its rows `names` of the whole) on its own, as the whole run would
    serve it."""
    cluster = Cluster(share, 1, RoundRobin(), cache, config, cost, sample_interval_s=interval, fast_path=fast_path,
                      layerwise=layerwise)
    cluster.row_names = names
    replica = cluster.replicas[0]
    replica.index = index
    cluster.run()
    log = cluster.log
    log.renumber_requests(names)  # the whole trace's row numbers
    part = ReplicaPart(index, replica.block_size, log, replica.series, replica.itl, replica.counters(),
                       [(names[r], reason) for r, reason in replica.rejected], replica.usage_seconds,
                       replica.peak_usage, replica.sched.stats.num_steps, replica.num_fast_steps,
                       kv_layout=replica.kv_layout, kind_block_seconds=replica.kind_block_seconds,
                       kind_peak_blocks=replica.kind_peak_blocks, busy_seconds=replica.busy_seconds,
                       prefill_seconds=replica.prefill_seconds)
    # The finished cluster is cyclic garbage (the scheduler and its components, SimPy's environment and its
    # processes), which reference counting never frees: collect it before this worker takes its next replica,
    # rather than hold several until the collector's own full collection (the million-request bench's peak, its
    # two workers' and this process's resident memory together, fell from 974 to 737 MB, in the same wall time).
    del cluster, replica
    gc.collect()
    return part


def run_parallel(trace: Trace, num_replicas: int, cache: CacheConfig, config: SchedulerConfig, cost: CostModel,
                 interval: float, fast_path: bool, processes: int, layerwise: bool = False) -> MergedCluster:
    """Every replica's share in a pool of `processes` processes - forked where the platform can (no start-up
    imports, and a caller's script needs no `__main__` guard), else spawned."""
    parts, unservable = shares(trace, num_replicas)
    order = sorted(range(num_replicas), key=lambda i: -len(parts[i]))  # the largest first: an even finish
    frozen = START_METHOD == "fork"
    if frozen:
        gc.freeze()  # a forked child's collector then leaves the inherited objects (and their pages) alone
    try:
        with ProcessPoolExecutor(max_workers=max(1, min(processes, num_replicas)),
                                 mp_context=get_context(START_METHOD)) as pool:
            futures = {i: pool.submit(run_replica, trace.take(parts[i]), parts[i].tolist(), i, cache, config, cost,
                                      interval, fast_path, layerwise) for i in order}
            replicas = [futures[i].result() for i in range(num_replicas)]
    finally:
        if frozen:
            gc.unfreeze()
    return MergedCluster(trace, replicas, unservable)


def worth_parallel(router: str, replicas: int, processes: int, record_tokens: bool, requests: int,
                   shared_tier: bool = False) -> bool:
    """Whether to split the run: a round robin over several replicas, long enough to pay for the processes."""
    return processes > 1 and why_not_parallel(router, replicas, record_tokens, requests, shared_tier) is None


def why_not_parallel(router: str, replicas: int, record_tokens: bool, requests: int,
                     shared_tier: bool = False) -> str | None:
    """Why a run with several processes asked for runs in one anyway (None: it is split)."""
    if replicas < 2:
        return "one replica has nothing to split"
    if shared_tier:
        return "the replicas share one prefix store (kv_shared_blocks): they run together, in one process"
    if router != "round_robin":
        return f"the {router} router reads the replicas' state at every arrival; only round_robin is split"
    if record_tokens:
        return "every token time is recorded step by step, in one process"
    if requests < MIN_PARALLEL_REQUESTS:
        return (f"{requests:,} requests are fewer than the {MIN_PARALLEL_REQUESTS:,} that pay for starting the "
                "processes")
    return None
