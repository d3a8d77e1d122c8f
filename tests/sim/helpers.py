"""Shared builders for the simulator tests: seeded random traces and a cluster whose core can be inspected."""

from __future__ import annotations

import numpy as np

from kvplan.results.serving_result import ServingResult
from kvplan.sim.cluster import Cluster
from kvplan.sim.routers import Router, make_router
from kvplan.sim.run import build_configs, build_cost, check_trace, collect
from kvplan.sim.spec import SimSpec
from kvplan.traces import Trace


def random_trace(seed: int, count: int = 40, *, rate: float = 20.0, prompt: tuple[int, int] = (8, 200),
                 output: tuple[int, int] = (1, 80), granularity: int = 16, shared: int = 3,
                 max_n: int = 1) -> Trace:
    """Poisson arrivals, uniform lengths, and prompts that start with one of `shared` common prefixes."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, count))
    prompts = rng.integers(prompt[0], prompt[1] + 1, count)
    outputs = rng.integers(output[0], output[1] + 1, count)
    hashes, offsets, fresh = [], [0], 1_000_000
    for i in range(count):
        full = prompts[i] // granularity
        common = int(rng.integers(0, shared)) * 1000
        take = min(full, int(rng.integers(0, full + 1)))
        own = list(range(fresh, fresh + full - take))
        fresh += full
        hashes += [common + j for j in range(take)] + own
        offsets.append(len(hashes))
    n = rng.integers(1, max_n + 1, count)
    return Trace.build(arrivals, prompts, outputs, n=n, hash_ids=np.array(hashes, dtype=np.int64),
                       hash_offsets=np.array(offsets), hash_granularity=granularity)


def build(trace: Trace, spec: SimSpec, router: Router | None = None) -> Cluster:
    """The cluster `simulate` would run, returned so that a test can look at each replica's core."""
    check_trace(trace)
    cost, blocks = build_cost(spec)
    cache, config = build_configs(spec, trace, blocks, cost)
    return Cluster(trace, spec.replicas, router or make_router(spec.router), cache, config, cost,
                   sample_interval_s=spec.sample_interval_s or 0.5, fast_path=spec.fast_path,
                   layerwise=spec.kv_offloading_layerwise)


def run(trace: Trace, spec: SimSpec, router: Router | None = None) -> tuple[ServingResult, Cluster]:
    cluster = build(trace, spec, router)
    cluster.run()
    return collect(cluster, cluster.replicas[0].sched.cache_config.num_blocks), cluster
