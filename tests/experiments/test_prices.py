"""The price table: every built-in GPU priced from a cited, dated offer; overrides and files replace entries; bad
input is one line naming its key path."""

from __future__ import annotations

import datetime
import json

import pytest

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
    with pytest.raises(UserError, match=f"{path}.h200.on_demand: -3 is not a price"):
        price_table({"file": str(path)})
