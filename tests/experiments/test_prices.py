"""The price table: every built-in GPU priced from a cited, dated offer; overrides and files replace entries; bad
input is one line naming its key path."""

from __future__ import annotations

import datetime
import json

import pandas as pd
import pytest
import yaml

from kvplan.errors import UserError
from kvplan.sim.specs.hardware import HARDWARE
from kvplan.sim.specs.prices import PRICES, PriceTable, price_rows, price_table, with_kind


def test_every_built_in_gpu_has_a_cited_dated_positive_price():
    assert set(PRICES) == set(HARDWARE)
    for name, entry in PRICES.items():
        assert entry.hardware == name
        assert 0 < entry.reserved <= entry.on_demand, name
        assert entry.source.startswith("https://"), name
        assert datetime.date.fromisoformat(entry.date) <= datetime.date(2026, 12, 31), name
    assert [row[0] for row in price_rows()] == sorted(PRICES)


def test_kind_picks_the_column_and_deployment_hour_scales_with_gpus():
    on_demand, reserved = PriceTable(PRICES), PriceTable(PRICES, "reserved")
    assert on_demand.gpu_hour("h100-sxm") == PRICES["h100-sxm"].on_demand
    assert reserved.gpu_hour("h100-sxm") == PRICES["h100-sxm"].reserved
    assert on_demand.deployment_hour("h200", 8) == 8 * PRICES["h200"].on_demand
    assert with_kind(on_demand, "reserved").gpu_hour("l4") == PRICES["l4"].reserved


def test_overrides_files_and_kinds(tmp_path):
    table = price_table({"kind": "reserved", "h100-sxm": 2.5, "h200": {"reserved": 3.0}})
    assert table.kind == "reserved"
    assert table.gpu_hour("h100-sxm") == 2.5  # a bare number is both columns: no discount assumed
    assert table.gpu_hour("h200") == 3.0 and table.entries["h200"].on_demand == PRICES["h200"].on_demand
    assert table.entries["l4"] == PRICES["l4"]
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"kind": "reserved", "l40s": {"on_demand": 2.0, "reserved": 1.5, "source": "q",
                                                             "date": "2026-11-30"}}))
    from_file = price_table(str(path))
    assert from_file.kind == "reserved" and from_file.gpu_hour("l40s") == 1.5
    assert from_file.entries["l40s"].source == "q"
    # the block's own keys win over its file's
    assert price_table({"file": str(path), "kind": "on_demand", "l40s": 9.0}).gpu_hour("l40s") == 9.0
    assert price_table({"cpu-local": 0.05}).gpu_hour("cpu-local") == 0.05


@pytest.mark.parametrize(("block", "says"), [
    ({"h100-sxm": -1}, "prices.h100-sxm.on_demand: -1 is not a price"),
    ({"h100-sxm": 0}, "prices.h100-sxm.on_demand: 0 is not a price"),
    ({"h100-sxm": float("nan")}, "prices.h100-sxm.on_demand: nan is not a price"),
    ({"h100-sxm": "cheap"}, "prices.h100-sxm.on_demand: 'cheap' is not a price"),
    ({"h100-sxm": {"reserved": -2}}, "prices.h100-sxm.reserved: -2 is not a price"),
    ({"h100-sxm": {"spot": 1}}, "prices.h100-sxm.spot: unknown key; allowed: on_demand, reserved"),
    ({"tpu-v5": 1}, "prices.tpu-v5: unknown GPU; allowed: kind, file, or a GPU of a100-40gb"),
    ({"kind": "spot"}, "prices.kind: 'spot'; allowed: on_demand, reserved"),
    ({"file": "/no/such/prices.yaml"}, "prices.file: /no/such/prices.yaml"),
    ([1, 2], "prices: [1, 2] is not a mapping"),
])
def test_bad_input_is_one_line_naming_the_key(block, says):
    with pytest.raises(UserError) as err:
        price_table(block)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_missing_gpu_names_the_table():
    with pytest.raises(UserError, match="no price for GPU 'cpu-local'; the table prices a100-40gb"):
        PriceTable(PRICES).gpu_hour("cpu-local")


def test_a_bad_file_names_the_file_and_key(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("h200: {on_demand: -3}\n")
    with pytest.raises(UserError, match=f"{path}: h200.on_demand: -3 is not a price"):
        price_table({"file": str(path)})


TINY = {"name": "priced", "model": "llama-3-8b", "hardware": "a100-40gb",
        "workload": {"mode": "burst", "synthetic": {
            "seed": 4, "requests": 30, "arrivals": {"process": "poisson", "rate": 4},
            "lengths": {"prompt": {"dist": "lognormal", "median": 300, "sigma": 0.6, "max": 2000},
                        "output": {"dist": "lognormal", "median": 30, "sigma": 0.5, "max": 200}}}},
        "cluster": {"replicas": 2}, "slo": {"p99_ttft_ms": 5000},
        "outputs": {"plots": False, "report": True, "tables": False}}


def _run(tmp_path, capsys, doc: dict, *flags: str) -> tuple[pd.Series, dict, str]:
    """Run (or, with --resume, re-price) the experiment `doc`; its one point's points.parquet row, its
    result.json point and the terminal answer."""
    from kvplan.cli import main

    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet", *flags]) == 0
    printed = capsys.readouterr().out
    point = pd.read_parquet(tmp_path / "out" / "points.parquet").iloc[0]
    return point, json.loads((tmp_path / "out" / "result.json").read_text())["points"][0], printed


def test_an_experiment_prices_every_point_and_a_prices_block_reprices_it(tmp_path, capsys):
    point, doc, printed = _run(tmp_path, capsys, TINY)
    hour = 2 * PRICES["a100-40gb"].on_demand
    assert point["cost_per_hour"] == pytest.approx(hour) and doc["cost_per_hour"] == pytest.approx(hour)
    assert point["price_source"] == PRICES["a100-40gb"].source and point["goodput_basis"] == "slo"
    assert 0 < point["prefill_share"] < 1 and point["usd_per_m_output_tokens"] > point["usd_per_m_input_tokens"]
    assert "Cost: base: $" in printed
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "## Cost" in summary and PRICES["a100-40gb"].source in summary
    assert "<h2>Cost</h2>" in (tmp_path / "out" / "report.html").read_text()
    # a prices: block re-prices the stored runs (--resume: nothing simulated again), JSON and parquet alike
    repriced, doc2, _ = _run(tmp_path, capsys, {**TINY, "prices": {"kind": "reserved", "a100-40gb": {
        "on_demand": 3.0, "reserved": 1.0, "source": "quote", "date": "2026-12-01"}}}, "--resume")
    assert (repriced["cost_per_hour"], repriced["price_kind"], doc2["price_source"]) == (2.0, "reserved", "quote")
    assert repriced["usd_per_m_output_tokens"] == pytest.approx(point["usd_per_m_output_tokens"] * 2.0 / hour)
    assert repriced["request_throughput"] == point["request_throughput"]  # the same runs
    prices = tmp_path / "p.json"
    prices.write_text(json.dumps({"a100-40gb": 5.0}))
    flagged, _, _ = _run(tmp_path, capsys, TINY, "--resume", "--prices", str(prices), "--price-kind", "reserved")
    assert flagged["cost_per_hour"] == 10.0  # a bare price is both columns


def test_a_bad_prices_block_names_the_file_and_key(tmp_path, capsys):
    from kvplan.cli import main

    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump({**TINY, "prices": {"a100-40gb": -1}}))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{path}: prices.a100-40gb.on_demand: -1 is not a price" in err and "\n" not in err
