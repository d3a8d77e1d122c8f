"""The decode fast path gives exactly the results of stepping one scheduler step at a time."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvplan.sim.spec import SimSpec
from tests.sim.helpers import random_trace, run

CASES = [
    (0, SimSpec(num_blocks=2000, block_size=16)),
    (1, SimSpec(num_blocks=70, block_size=8, eviction_policy="fifo")),
    (2, SimSpec(num_blocks=70, block_size=16, preemption_mode="swap", num_cpu_blocks=300,
                victim_policy="longest_remaining")),
    (3, SimSpec(num_blocks=500, block_size=4, replicas=3, router="prefix_aware", eviction_policy="s3fifo")),
    (4, SimSpec(num_blocks=300, allocator="pow2", enable_prefix_caching=False, replicas=2, router="least_kv_usage")),
    (6, SimSpec(num_blocks=300, block_size=8, replicas=3, router="round_robin")),
    (5, SimSpec(num_blocks=120, block_size=16, cost_options={"step_overhead_s": 0.0, "request_overhead_s": 0.0})),
    (7, SimSpec(num_blocks=90, block_size=16, schedule="prefill_first")),
    (8, SimSpec(num_blocks=70, block_size=8, schedule="prefill_first", enable_chunked_prefill=False,
                preemption_mode="swap", num_cpu_blocks=300, replicas=2, router="least_outstanding")),
    # a backlog held back by max_num_seqs while decode allocations evict cached blocks inside stretches
    (9, SimSpec(num_blocks=90, block_size=4, max_num_seqs=3, eviction_policy="lfu")),
    (10, SimSpec(num_blocks=80, block_size=8, max_num_seqs=4, eviction_policy="s3fifo", schedule="prefill_first")),
    (11, SimSpec(num_blocks=100, block_size=4, max_num_seqs=6, eviction_policy="fifo", watermark=0.1)),
    # first chunks admitted without the full-prompt gate (vLLM 0.10): more preemption; a cache-reading router
    (12, SimSpec(num_blocks=70, block_size=8, scheduler_reserve_full_isl=False, replicas=2, router="prefix_aware")),
    # prefix tiers below the GPU: evictions inside stretches demote, the blocked head's lookups promote
    (13, SimSpec(num_blocks=90, block_size=4, max_num_seqs=3, kv_offloading_blocks=40, kv_disk_blocks=60)),
    (14, SimSpec(num_blocks=70, block_size=8, kv_offloading_blocks=30, kv_offloading_eviction="s3fifo",
                 replicas=2, router="prefix_aware")),
    # a shared store under every replica's CPU tier (its fetches queue on the node's network link), write-through
    # (decodes' registrations inside stretches store their blocks in every tier), layer-wise loading
    (15, SimSpec(num_blocks=70, block_size=8, kv_offloading_blocks=20, kv_shared_blocks=60, replicas=3,
                 router="prefix_aware", kv_offloading_layerwise=True)),
    (16, SimSpec(num_blocks=90, block_size=4, max_num_seqs=3, kv_offloading_blocks=30, kv_shared_blocks=80,
                 kv_shared_eviction="fifo", kv_offloading_write_through=True, replicas=2, router="round_robin")),
    # vLLM 0.34's cache-aware admission: the window re-sorts a backlog every step (from usage 0 and from 0.5)
    (17, SimSpec(num_blocks=90, block_size=4, max_num_seqs=3, cache_aware_admission_window=8,
                 cache_aware_admission_threshold=0.0)),
    (18, SimSpec(num_blocks=90, block_size=4, max_num_seqs=3, cache_aware_admission_window=4)),
]


@pytest.mark.parametrize("seed,spec", CASES, ids=[f"seed{s}" for s, _ in CASES])
def test_fast_path_equals_step_by_step(seed, spec):
    trace = random_trace(seed, 45, rate=8.0 + 6 * seed, output=(1, 150), max_n=2 if seed % 2 else 1)
    fast, fast_cluster = run(trace, spec)
    slow, slow_cluster = run(trace, dataclasses.replace(spec, fast_path=False))
    assert sum(r.num_fast_steps for r in fast_cluster.replicas) > 0  # the fast path really ran
    assert sum(r.num_fast_steps for r in slow_cluster.replicas) == 0
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.series, slow.series, check_exact=True)
    assert fast.summary == slow.summary
    assert fast_cluster.itl().counts == slow_cluster.itl().counts
    for a, b in zip(fast_cluster.replicas, slow_cluster.replicas, strict=True):
        assert a.sched.stats == b.sched.stats
        assert a.sched.kv_metrics() == b.sched.kv_metrics()


def test_fast_path_equals_step_by_step_under_a_calibrated_profile(tmp_path):
    profile = tmp_path / "profile.yaml"
    profile.write_text("block_size: 16\nkv_capacity_blocks: 90\ncoefficients: {step: 0.003, request: 2.0e-5, "
                       "prefill_tokens: 4.0e-5, prefill_attention: 1.0e-9, decode_requests: 3.0e-5, "
                       "decode_context: 2.0e-8, decode_context_max: 4.0e-7, blocks_touched: 1.0e-6}\n")
    spec = SimSpec(cost="calibrated", profile=str(profile), block_size=8, replicas=2, router="least_outstanding")
    trace = random_trace(11, 40, rate=15.0, output=(1, 120))
    fast, cluster = run(trace, spec)
    slow, _ = run(trace, dataclasses.replace(spec, fast_path=False))
    assert cluster.replicas[0].sched.cache_config.num_blocks == 180  # 90 blocks of 16 re-cut into blocks of 8
    assert sum(r.num_fast_steps for r in cluster.replicas) > 0
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    assert fast.summary == slow.summary


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), block=st.sampled_from([1, 4, 16]), blocks=st.integers(60, 400),
       replicas=st.integers(1, 3), router=st.sampled_from(["round_robin", "least_outstanding", "prefix_aware"]),
       eviction=st.sampled_from(["lru", "fifo", "lfu", "s3fifo"]), mode=st.sampled_from(["recompute", "swap"]),
       schedule=st.sampled_from(["mixed", "prefill_first"]), max_seqs=st.sampled_from([2, 5, 256]))
def test_fast_path_equals_step_by_step_on_random_configs(seed, block, blocks, replicas, router, eviction, mode,
                                                         schedule, max_seqs):
    trace = random_trace(seed, 25, rate=10.0, prompt=(4, 120), output=(1, 60), max_n=2)
    spec = SimSpec(num_blocks=blocks * 16 // block, block_size=block, replicas=replicas, router=router,
                   eviction_policy=eviction, preemption_mode=mode, num_cpu_blocks=2000, schedule=schedule,
                   max_num_seqs=max_seqs)
    fast, _ = run(trace, spec)
    slow, _ = run(trace, dataclasses.replace(spec, fast_path=False))
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    assert fast.summary == slow.summary
