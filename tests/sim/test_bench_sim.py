"""`kvplan bench sim` on a small synthetic workload, and its report when the shared data is missing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvplan.bench import sim as bench
from kvplan.cli import main


def test_synthetic_workload_completes_on_every_replica():
    result = bench.synthetic(300, 4, per_replica_rate=5.0, seed=2)
    assert result["summary"]["completed"] == 300
    assert result["simulated_s"] > 0 and result["wall_s"] > 0 and result["fast_steps"] > 0
    assert 0 < result["fast_share"] <= 1 and result["peak_rss_mb"] > 0 and result["target"] == "wall_s+rss"
    again = bench.synthetic_trace(300, 20.0, 2)
    assert (again.prompt_tokens + again.output_tokens <= 2048).all()


@pytest.mark.parametrize("name", [r for r in bench.REGIMES if r not in ("synthetic", "steady_search")])
def test_missing_shared_data_is_reported_not_fatal(tmp_path, name):
    result = bench.regime(name, str(tmp_path))
    assert result["skipped"] and "not found" in result["reason"] and "shared data" in result["reason"]


@pytest.mark.slow
def test_cli_runs_each_regime_in_its_own_process_and_prints_json(tmp_path, capsys):
    # the command, in this process: it spawns each regime's process itself
    assert main(["bench", "sim", "--regimes", "burst", "synthetic", "--requests", "200", "--replicas", "2",
                 "--data", str(tmp_path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert list(result["regimes"]) == ["burst", "synthetic"]
    assert result["regimes"]["burst"]["skipped"]
    assert result["regimes"]["synthetic"]["summary"]["completed"] == 200


def test_reference_workload_is_fixed_and_reports_a_speed():
    from kvplan.bench.reference import reference_mops, workload

    assert workload(6400) == workload(6400)  # the same work every time
    assert reference_mops(repeats=1, ops=6400) > 0


@pytest.mark.slow
def test_steady_search_row_sums_the_probes_of_a_search(tmp_path):
    from kvplan.bench.steady_search import steady_search

    experiment = tmp_path / "tiny.yaml"
    experiment.write_text(
        "name: tiny\nmodel: llama-3-8b\nhardware: h100-sxm\nworkload: {trace: sample:chat}\n"
        "probe: {duration_s: 30, min_requests: 20}\nseeds: [3, 4]\n"
        "search: {target: max_rate, low: 1, high: 8, tolerance: 0.5}\nslo: {p99_ttft_ms: 1000}\n")
    row = steady_search(experiment)
    assert row["seeds"] == [3] and row["probes"] >= 2 and list(row["answers"]) == ["base"]
    assert row["simulated_s"] > 0 and row["requests"] > 0 and row["speedup"] == row["simulated_s"] / row["wall_s"]
    assert 0 <= row["fast_share"] <= 1 and 0 <= row["overloaded_probes"] <= row["probes"]


def test_peak_memory_counts_this_process_and_its_children():
    from kvplan.bench.memory import PeakMemory

    with PeakMemory() as peak:
        subprocess.run([sys.executable, "-c", "x = bytearray(64 << 20); import time; time.sleep(0.3)"], check=True)
    assert peak.mb > 64  # the child's 64 MB, beside this process's own


def _row(core_module: str) -> dict:
    return {"requests": 10, "replicas": 1, "prefix_caching": "on", "wall_s": 1.0, "simulated_s": 2000.0,
            "speedup": 2000.0, "fast_share": 0.5, "peak_rss_mb": 100.0, "reference_mops": 11.0, "target": "speedup",
            "target_met": True, "core_module": core_module, "probes": 2, "overloaded_probes": 0, "seeds": [0],
            "answers": {"base": 1.0}}


def test_report_names_a_compiled_core_and_stays_quiet_on_the_pure_one(capsys):
    from kvplan.commands.bench import _show_sim

    result = {"speedup_target": 2000.0, "burst_wall_target_s": 10.0, "reference_mops": 11.0,
              "regimes": {"a": _row(bench.core_module()), "b": {"skipped": True, "reason": "no data"}}}
    _show_sim(result)
    assert "core: compiled" not in capsys.readouterr().out
    result["regimes"]["a"] = _row("/tmp/build/kvplan/engine/core/scheduler.cpython-311-x86_64-linux-gnu.so")
    _show_sim(result)
    assert "core: compiled, from /tmp/build/kvplan/engine/core" in capsys.readouterr().out


def test_a_row_names_the_scheduler_module_its_process_imported():
    assert bench.core_module().endswith("kvplan/engine/core/scheduler.py")  # the pure module, in this suite
