"""`kvplan bench sim`'s comparison with the plain reference path: what each row times on both paths, the ratio it
reports, and the table's columns."""

from __future__ import annotations

import pytest

from kvplan.bench import sim as bench
from kvplan.commands.bench import _show_sim
from tests.sim.helpers import random_trace


def test_against_plain_times_fast_plain_fast_and_compares_the_results():
    from kvplan.sim.run import simulate
    from kvplan.sim.spec import SimSpec

    trace, spec, calls = random_trace(3, 30, rate=10.0, output=(1, 60)), SimSpec(num_blocks=200, block_size=16), []

    def run_once(fast_path: bool):
        calls.append(fast_path)
        out = simulate(trace, SimSpec(num_blocks=spec.num_blocks, block_size=16, fast_path=fast_path))
        return out, out.summary["duration_s"], len(trace)

    row = bench.against_plain(run_once)
    assert calls == [True, False, True]
    assert row["identical"] and row["requests"] == 30 and len(row["fast_walls_s"]) == 2
    assert row["fast_wall_s"] == pytest.approx(sum(row["fast_walls_s"]) / 2)
    assert row["vs_plain"] == pytest.approx(row["wall_s"] / row["fast_wall_s"])
    assert row["speedup"] == pytest.approx(row["simulated_s"] / row["wall_s"])


def test_a_multi_replica_row_times_replica_zeros_share_and_the_table_shows_the_ratio(capsys):
    row = bench.synthetic(300, 4, per_replica_rate=5.0, seed=2)
    plain = row["plain"]
    assert plain["requests"] == 75 and "replica 0's first 75 requests" in plain["rule"]  # rows 0, 4, 8, ...
    assert plain["identical"] and plain["wall_s"] > 0 and plain["vs_plain"] > 0
    assert 0 < plain["simulated_s"] <= row["simulated_s"]
    row["reference_mops"] = 10.0
    differing = {**row, "plain": {**plain, "identical": False}}
    _show_sim({"regimes": {"synthetic": row, "other": differing}, "speedup_target": 2000.0,
               "burst_wall_target_s": 10.0, "reference_mops": 10.0})
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("regime"))
    assert "vs_plain" in header and "plain_speedup" in header and "speedup" in header
    assert f"{plain['vs_plain']:.2f}x" in out and f"{plain['speedup']:.0f}x" in out
    assert "other: the fast and plain paths' results differ" in out
    assert "synthetic: the fast and plain paths' results differ" not in out


def test_a_search_probe_runs_on_both_paths(tmp_path):
    from kvplan.bench.steady_search import probe_against_plain
    from kvplan.commands.run import load
    from kvplan.experiments.points import expand, run_config

    experiment = tmp_path / "tiny.yaml"
    experiment.write_text(
        "name: tiny\nmodel: llama-3-8b\nhardware: h100-sxm\nworkload: {trace: sample:chat}\n"
        "probe: {duration_s: 10, min_requests: 5}\nseeds: [3]\n"
        "search: {target: max_rate, low: 1, high: 8, tolerance: 0.5}\nslo: {p99_ttft_ms: 1000}\n")
    exp, _ = load(experiment)
    row = probe_against_plain(run_config(expand(exp)[0].config, 3, {"workload.rate": 2.0}))
    assert row["rule"] == "the search's first probe (2 req/s)" and row["identical"]
    assert row["requests"] > 0 and row["simulated_s"] >= 10 and row["vs_plain"] > 0
