"""Routers on crafted traces: where each request lands, read from the per-request table."""

from __future__ import annotations

import numpy as np

from kvplan.sim.routers import PrefixAware
from kvplan.sim.spec import SimSpec
from kvplan.traces import Trace
from tests.sim.helpers import run

SPEC = dict(num_blocks=4000, block_size=16)


def _placement(trace: Trace, router: str | PrefixAware, replicas: int = 2) -> list[int]:
    spec = SimSpec(replicas=replicas, router=router if isinstance(router, str) else "round_robin", **SPEC)
    result, _ = run(trace, spec, None if isinstance(router, str) else router)
    return result.requests.sort_values("request")["replica"].tolist()


def _hashed(arrivals, prompts, outputs, hashes: list[list[int]]) -> Trace:
    offsets = np.cumsum([0, *map(len, hashes)])
    return Trace.build(arrivals, prompts, outputs, hash_ids=np.array([h for row in hashes for h in row]),
                       hash_offsets=offsets, hash_granularity=16)


def test_round_robin_takes_turns():
    trace = Trace.build([0.0, 0.1, 0.2, 0.3, 0.4], [20] * 5, [3] * 5)
    assert _placement(trace, "round_robin", 3) == [0, 1, 2, 0, 1]


def test_least_outstanding_sends_to_the_idle_replica():
    # r0 decodes for a long time on replica 0; r1 (short) lands on replica 1 and is done before r2 arrives.
    trace = Trace.build([0.0, 0.01, 5.0], [20, 20, 20], [3000, 2, 2])
    assert _placement(trace, "least_outstanding") == [0, 1, 1]
    assert _placement(trace, "round_robin") == [0, 1, 0]


def test_least_kv_usage_prefers_the_emptier_cache():
    # Both replicas hold one long-running request; replica 0's holds far more KV blocks.
    trace = Trace.build([0.0, 0.01, 1.0], [3000, 20, 20], [2000, 2000, 2])
    assert _placement(trace, "least_kv_usage") == [0, 1, 1]
    assert _placement(trace, "least_outstanding") == [0, 1, 0]  # tie on load: the lowest index


def test_prefix_aware_follows_the_cached_prefix():
    # r2 repeats r1's prompt prefix, which only replica 1 has cached; load is equal (both idle).
    hashes = [[1, 2, 3, 4], [9, 10, 11, 12], [9, 10, 11, 12, 13]]
    trace = _hashed([0.0, 0.001, 3.0], [64, 64, 80], [4, 4, 4], hashes)
    assert _placement(trace, "prefix_aware") == [0, 1, 1]
    assert _placement(trace, "least_outstanding") == [0, 1, 0]


def test_prefix_aware_balances_load_past_the_threshold():
    # Replica 0 caches r1's prefix but is busy with r0; replica 1 is idle.
    trace = _hashed([0.0, 1.0], [64, 80], [3000, 4], [[9, 10, 11, 12], [9, 10, 11, 12, 13]])
    assert _placement(trace, "prefix_aware") == [0, 0]  # 1 vs 0 outstanding is within the default threshold
    assert _placement(trace, PrefixAware(balance_abs=0, balance_rel=1.0)) == [0, 1]  # imbalanced: least loaded
    assert _placement(trace, PrefixAware(cache_threshold=1.0)) == [0, 1]  # hit covers 80% < 100%: least loaded
