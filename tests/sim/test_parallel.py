"""Round-robin replicas simulated in separate processes give exactly the result of one process."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from kvplan.sim.parallel import run_parallel, shares, worth_parallel
from kvplan.sim.run import build_configs, build_cost, collect, sample_interval
from kvplan.sim.spec import SimSpec
from tests.sim.helpers import random_trace, run

CASES = [
    (0, SimSpec(num_blocks=300, block_size=8, replicas=3, router="round_robin")),
    # a small cache: evictions of prefix-cached blocks, preemptions, a backlog
    (1, SimSpec(num_blocks=70, block_size=8, replicas=2, router="round_robin", eviction_policy="fifo")),
    (2, SimSpec(num_blocks=200, block_size=16, replicas=4, router="round_robin", enable_prefix_caching=False)),
    (3, SimSpec(num_blocks=120, block_size=4, replicas=3, router="round_robin", fast_path=False)),
]


@pytest.mark.parametrize("seed,spec", CASES, ids=[f"seed{s}" for s, _ in CASES])
def test_processes_equal_one_process(seed, spec):
    trace = random_trace(seed, 60, rate=15.0 + 10 * seed, output=(1, 150), max_n=2 if seed % 2 else 1)
    if seed == 2:  # failed rows take no round-robin turn
        trace = trace.with_columns(output_tokens=np.where(np.arange(len(trace)) % 7 == 3, 0, trace.output_tokens))
    spec = dataclasses.replace(spec, sample_interval_s=0.5)
    whole, _ = run(trace, spec)
    cost, blocks = build_cost(spec)
    cache, config = build_configs(spec, trace, blocks, cost)
    merged = run_parallel(trace, spec.replicas, cache, config, cost, sample_interval(spec, trace, cost),
                          spec.fast_path, processes=2)
    split = collect(merged, blocks)
    pd.testing.assert_frame_equal(whole.requests, split.requests)
    pd.testing.assert_frame_equal(whole.series, split.series)
    assert whole.summary == split.summary
    assert whole.info == split.info
    pd.testing.assert_frame_equal(whole.rejected, split.rejected)


def test_shares_follow_the_round_robin_and_skip_failed_rows():
    trace = random_trace(0, 10)
    trace = trace.with_columns(output_tokens=np.where(np.arange(10) == 2, 0, trace.output_tokens))
    parts, unservable = shares(trace, 3)
    assert [p.tolist() for p in parts] == [[0, 4, 7], [1, 5, 8], [3, 6, 9]]
    assert [row for row, _ in unservable] == [2]


def test_only_long_round_robin_runs_are_split():
    assert worth_parallel("round_robin", 16, 2, False, 1_000_000)
    assert not worth_parallel("least_outstanding", 16, 2, False, 1_000_000)  # reads the replicas' state
    assert not worth_parallel("round_robin", 1, 2, False, 1_000_000)
    assert not worth_parallel("round_robin", 16, 1, False, 1_000_000)
    assert not worth_parallel("round_robin", 16, 2, True, 1_000_000)  # token times: step by step, one process
    assert not worth_parallel("round_robin", 16, 2, False, 100)


def test_a_replica_process_frees_its_finished_cluster():
    """A worker runs its replicas one after another: each finished cluster (cyclic garbage: scheduler and
    components, SimPy environment and processes) is gone when `run_replica` returns - with the automatic collector
    off, so that only run_replica's own collection can have freed it."""
    import gc

    from kvplan.sim.cluster import Cluster
    from kvplan.sim.parallel import run_replica

    trace = random_trace(3, 40, rate=20.0)
    spec = SimSpec(num_blocks=200, block_size=8)
    cost, blocks = build_cost(spec)
    cache, config = build_configs(spec, trace, blocks, cost)
    gc.collect()
    gc.disable()
    try:
        part = run_replica(trace, list(range(len(trace))), 0, cache, config, cost, 0.5, True)
        alive = [o for o in gc.get_objects() if type(o) is Cluster]  # (isinstance would ask proxies' __class__)
    finally:
        gc.enable()
    assert part.num_steps > 0 and len(part.log) > 0
    assert alive == []
