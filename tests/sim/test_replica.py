"""One replica running the shared core: conservation, determinism, a hand-computed case, core-reported counts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvplan.engine.core import CacheConfig, SchedulerConfig
from kvplan.sim.cluster import Cluster
from kvplan.sim.cost.analytic import AnalyticCost
from kvplan.sim.gpu import attention as attention_law
from kvplan.sim.gpu.laws import GpuLaws
from kvplan.sim.routers import make_router
from kvplan.sim.run import collect, simulate
from kvplan.sim.spec import SimSpec
from kvplan.sim.specs.hardware import HardwareSpec
from kvplan.sim.specs.models import ModelSpec
from kvplan.traces import Trace
from tests.sim.helpers import random_trace, run


@pytest.mark.parametrize("spec", [
    SimSpec(num_blocks=60, block_size=16),
    SimSpec(num_blocks=60, block_size=8, preemption_mode="swap", num_cpu_blocks=200, eviction_policy="s3fifo"),
    SimSpec(num_blocks=400, allocator="oracle", enable_prefix_caching=False),
    SimSpec(num_blocks=80, block_size=16, sink_tokens=16, window_tokens=64),
], ids=["paged", "swap", "oracle", "window"])
def test_every_request_completes_once_with_every_token(spec):
    trace = random_trace(1, 40, max_n=3)
    result, _ = run(trace, spec)
    table = result.requests
    expected = sorted((row, s) for row in range(len(trace)) for s in range(int(trace.n[row])))
    assert sorted(zip(table["request"], table["sample"], strict=True)) == expected
    want = trace.output_tokens[table["request"].to_numpy()]
    assert (table["output_tokens"].to_numpy() == want).all()
    assert result.summary["completed"] == len(trace)
    assert (table["first_token_s"] >= table["first_scheduled_s"]).all()
    assert (table["first_scheduled_s"] >= table["arrival_s"]).all()
    assert (table["finish_s"] >= table["first_token_s"]).all()


def test_same_seed_same_results():
    a, _ = run(random_trace(5, 50), SimSpec(num_blocks=50, replicas=2, router="least_kv_usage"))
    b, _ = run(random_trace(5, 50), SimSpec(num_blocks=50, replicas=2, router="least_kv_usage"))
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.series, b.series)
    assert a.summary == b.summary


def test_two_requests_by_hand():
    # 1 layer, 1 head of dim 4, hidden 4, MLP 4, vocab 4, 1-byte weights: 144 weight bytes, of which a step reads
    # 128 (the layers and the LM head; the input embedding is only gathered row by row), 8 KV bytes per token,
    # 32 bytes per block of 4. Priced with the pure roofline laws (`GpuLaws()`: no kernel floors, whole-row
    # tiles), memory-bound at 1000 bytes/s; 10 ms per step plus 1 ms per request. Per token the GEMMs move 44
    # activation bytes (qkv 4 in + 12 out, o 4 + 4, up 4 + 8, down 4 + 4), a sampled row 8 through the LM
    # head; element-wise 88 bytes (two norms of 8 and the final one, RoPE 16, residual add 12, KV write 16,
    # SwiGLU 12, embedding gather 8).
    model = ModelSpec("tiny", 1, 4, 1, 1, 4, 4, 4, dtype_bytes=1)
    assert (model.weight_bytes, model.kv_bytes_per_token()) == (144, 8)
    cost = AnalyticCost(model, HardwareSpec("slow", 1e30, 1000.0, 1e6, 1000.0), 4, compute_efficiency=1.0,
                        memory_efficiency=1.0, step_overhead_s=0.01, request_overhead_s=0.001, admit_overhead_s=0.0,
                        async_scheduling=False, laws=GpuLaws())
    trace = Trace.build([0.0, 0.05], [4, 4], [2, 1])
    cache = CacheConfig(block_size=4, num_blocks=16, enable_prefix_caching=False, max_model_len=6)
    cluster = Cluster(trace, 1, make_router("round_robin"), cache, SchedulerConfig(), cost, sample_interval_s=1.0)
    cluster.run()
    table = collect(cluster, 16).requests.set_index("request")
    # Attention (sim.gpu.attention, docs/attention.md): a block reads its 4 slots plus the gather overhead, at the
    # set memory efficiency (1.0), plus one kernel floor per layer; compute is free at 1e30 FLOP/s.
    def attention(blocks, decodes):
        read = 8 * (blocks * (4 + attention_law.GATHER_TOKENS) + attention_law.REQUEST_TOKENS * decodes)
        return read / 1000.0 + attention_law.KERNEL_S

    # Step 1 at 0: A prefills 4 tokens (1 block), 1 sampled row: 128 + 4 x 44 + 8 + 4 x 88 = 664 bytes, attention.
    step1 = 0.664 + attention(1, 0) + 0.010 + 0.001
    # Step 2: A decodes (attends 5 tokens: 2 blocks), B prefills 4 (1 block), 2 sampled rows:
    # 128 + 5 x 44 + 2 x 8 + 5 x 88 = 804 bytes, attention over 3 blocks and 1 decode.
    step2 = 0.804 + attention(3, 1) + 0.010 + 0.002
    a, b = table.loc[0], table.loc[1]
    assert a["first_token_s"] == pytest.approx(step1, abs=1e-12)
    assert a["finish_s"] == pytest.approx(step1 + step2, abs=1e-12)
    assert a["tpot_ms"] == pytest.approx(step2 * 1e3, abs=1e-9)
    assert b["first_scheduled_s"] == pytest.approx(step1, abs=1e-12)
    assert b["queueing_ms"] == pytest.approx((step1 - 0.05) * 1e3, abs=1e-9)
    assert b["ttft_ms"] == pytest.approx((step1 + step2 - 0.05) * 1e3, abs=1e-9)
    assert b["e2el_ms"] == b["ttft_ms"]
    summary = collect(cluster, 16).summary
    assert summary["mean_ttft_ms"] == pytest.approx((step1 + step1 + step2 - 0.05) / 2 * 1e3)
    assert summary["mean_itl_ms"] == pytest.approx(step2 * 1e3)
    assert summary["duration_s"] == pytest.approx(step1 + step2)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_and_eviction_counts_are_the_cores(mode):
    trace = random_trace(7, 60, rate=60.0, output=(20, 120))
    result, cluster = run(trace, SimSpec(num_blocks=40, block_size=16, preemption_mode=mode, num_cpu_blocks=400,
                                         eviction_policy="lfu", replicas=2))
    stats = [r.sched.stats for r in cluster.replicas]
    preemptions = sum(s.num_preemptions for s in stats)
    assert preemptions > 0
    assert result.summary["num_preemptions"] == preemptions == result.requests["preemptions"].sum()
    if mode == "swap":
        assert sum(s.num_swap_outs for s in stats) > 0
    evictions = sum(r.sched.kv.pool.num_evictions for r in cluster.replicas)
    assert evictions > 0 and result.summary["num_evicted_blocks"] == evictions
    assert result.summary["prefix_cache_hits"] == sum(r.sched.kv.prefix_hits for r in cluster.replicas)
    assert 0 < result.summary["kv_usage_mean"] <= result.summary["kv_usage_peak"] <= 1.0


def test_a_step_that_only_preempts_costs_its_transfers_and_the_run_goes_on():
    """A sampling group outgrows a 4-block pool: its step preempts it and schedules nothing (it used to end the
    run with "nothing could be scheduled"); the samples then finish as independent sequences."""
    trace = Trace.build(np.array([0.0]), [4], [10], n=np.array([2]))
    result = simulate(trace, SimSpec(num_blocks=4, block_size=4, enable_prefix_caching=False))
    assert result.summary["completed"] == 1 and result.summary["num_preemptions"] == 2
    assert result.requests["output_tokens"].tolist() == [10, 10]
