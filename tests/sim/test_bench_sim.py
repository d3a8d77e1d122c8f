"""`kvplan bench sim` on a small synthetic workload, and its report when the shared data is missing."""

from __future__ import annotations

from kvplan.bench import sim as bench


def test_synthetic_workload_completes_on_every_replica():
    result = bench.synthetic(300, 4, per_replica_rate=5.0, seed=2)
    assert result["summary"]["completed"] == 300
    assert result["simulated_s"] > 0 and result["wall_s"] > 0 and result["fast_steps"] > 0
    again = bench.synthetic_trace(300, 20.0, 2)
    assert (again.prompt_tokens + again.output_tokens <= 2048).all()


def test_missing_shared_data_is_reported_not_fatal(tmp_path):
    result = bench.azure_conv(tmp_path)
    assert result["skipped"] and "not found" in result["reason"] and "shared data" in result["reason"]
