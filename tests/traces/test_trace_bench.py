"""`kvplan bench traces` on a tiny --rows: both files generated, loaded in a child process and reported."""

from __future__ import annotations

import json

import pytest

from kvplan.cli import main


@pytest.mark.slow
def test_bench_traces_reports_both_loads(capsys):
    assert main(["bench", "traces", "--rows", "40", "--seed", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["rows"] == 40 and result["load_budget_s"] == 10.0 and result["memory_budget_bytes"] == 10**9
    azure, mooncake = result["loads"]["azure_csv"], result["loads"]["mooncake_jsonl"]
    assert (azure["format"], azure["rows"], azure["hash_ids"], azure["memory_bytes"]) == ("azure", 40, 0, 40 * 8 * 8)
    assert (mooncake["format"], mooncake["rows"]) == ("mooncake", 40)
    # Mooncake-like prompts: one 512-token hash id per (partial) block, eight int64 columns plus the ids.
    assert mooncake["hash_ids"] >= 40 and mooncake["memory_bytes"] == 40 * 8 * 8 + 41 * 8 + mooncake["hash_ids"] * 8
    for load in (azure, mooncake):
        assert load["seconds_vs_budget"] == load["seconds"] / 10.0 and load["peak_rss_increase_bytes"] >= 0
    assert main(["bench", "traces", "--rows", "40"]) == 0
    assert "mooncake_jsonl" in capsys.readouterr().out
    assert main(["bench", "traces", "--rows", "0"]) == 2
    assert "argument --rows: 0; allowed: an integer >= 1" in capsys.readouterr().err
