"""The cost on every answer (`sim.dollars`): the split between input and output tokens adds up to the hour's
cost, the replicas' prefill time is what splits it, `kvplan simulate --json` carries it and `--prices` /
`--price-kind` change it, an unpriced GPU gets nulls and a reason, and bad price input is one line, exit 2."""

from __future__ import annotations

import json
import math

import pytest

from kvplan.cli import main
from kvplan.sim.dollars import COST_KEYS, cost_fields, cost_line
from kvplan.sim.run import simulate
from kvplan.sim.spec import SimSpec
from kvplan.sim.specs.prices import PRICES, PriceTable, price_table
from kvplan.traces import Trace

SUMMARY = {"request_throughput": 2.0, "output_throughput": 300.0, "total_token_throughput": 2300.0,
           "request_goodput": None}


def test_input_and_output_tokens_pay_the_whole_hour():
    fields = cost_fields(PriceTable(PRICES), "h100-sxm", 16, SUMMARY, {"busy_s": 80.0, "prefill_busy_s": 20.0})
    assert set(fields) == set(COST_KEYS)
    hour = 16 * PRICES["h100-sxm"].on_demand
    assert fields["cost_per_hour"] == pytest.approx(hour, rel=1e-15)
    assert fields["prefill_share"] == 0.25
    paid = (fields["usd_per_m_input_tokens"] * 2000.0 * 3600 / 1e6
            + fields["usd_per_m_output_tokens"] * 300.0 * 3600 / 1e6)
    assert paid == pytest.approx(hour, rel=1e-12)
    assert fields["usd_per_m_input_tokens"] == pytest.approx(hour * 0.25 / (2000 * 3600 / 1e6))
    assert fields["goodput_basis"] == "completed"
    assert fields["goodput_per_usd"] == pytest.approx(2.0 * 3600 / hour)
    slo = cost_fields(PriceTable(PRICES, "reserved"), "h100-sxm", 16, {**SUMMARY, "request_goodput": 1.5},
                      {"busy_s": 80.0, "prefill_busy_s": 20.0})
    assert slo["goodput_basis"] == "slo" and slo["cost_per_hour"] == 16 * PRICES["h100-sxm"].reserved
    assert slo["goodput_per_usd"] == pytest.approx(1.5 * 3600 / slo["cost_per_hour"])
    assert "req/$ meeting the SLO" in cost_line(slo)


def test_an_unpriced_gpu_has_null_dollars_and_says_why():
    fields = cost_fields(PriceTable(PRICES), "cpu-local", 1, SUMMARY, {"busy_s": 1.0, "prefill_busy_s": 0.5})
    assert all(fields[k] is None for k in ("cost_per_hour", "usd_per_m_input_tokens", "usd_per_m_output_tokens",
                                           "goodput_per_usd", "price_source"))
    assert "no price for cpu-local" in fields["cost_note"] and cost_line(fields).startswith("cost: none: ")


def test_prefill_time_follows_the_prefill_rows():
    """One request of 1 output token is all prefill; long outputs of short prompts are mostly decode; the fast
    path's decode stretches add no prefill time (bit-identical to stepping, tests/sim/test_fast_plain_equivalence)."""
    def run(prompt: int, output: int, fast: bool = True) -> dict:
        trace = Trace.build([0.0, 0.1], [prompt] * 2, [output] * 2)
        return simulate(trace, SimSpec(model="llama-3-8b", hardware="a100-40gb", num_blocks=400,
                                       fast_path=fast)).info

    only_prefill = run(600, 1)
    assert only_prefill["prefill_busy_s"] == pytest.approx(only_prefill["busy_s"], rel=1e-12)
    decode = run(40, 200)
    assert 0 < decode["prefill_busy_s"] < 0.2 * decode["busy_s"]
    assert (decode["busy_s"], decode["prefill_busy_s"]) == (lambda i: (i["busy_s"], i["prefill_busy_s"]))(
        run(40, 200, fast=False))


def _trace(tmp_path) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(f'{{"timestamp": {i * 200}, "input_length": 300, "output_length": 40}}\n'
                            for i in range(6)))
    return str(path)


def test_simulate_json_carries_the_cost_and_price_flags_change_it(tmp_path, capsys):
    base = ["simulate", "--trace", _trace(tmp_path), "--hardware", "h100-sxm", "--num-blocks", "400",
            "--replicas", "2", "--json"]
    assert main(base) == 0
    default = json.loads(capsys.readouterr().out)["cost"]
    assert default["cost_per_hour"] == pytest.approx(2 * PRICES["h100-sxm"].on_demand)
    assert default["billed_gpus"] == 2 and default["price_date"] == PRICES["h100-sxm"].date
    assert 0 < default["prefill_share"] < 1 and default["usd_per_m_output_tokens"] > 0
    prices = tmp_path / "prices.yaml"
    prices.write_text("h100-sxm: {on_demand: 1.0, reserved: 0.5, source: our contract, date: '2026-11-01'}\n")
    assert main([*base, "--prices", str(prices)]) == 0
    mine = json.loads(capsys.readouterr().out)["cost"]
    assert (mine["cost_per_hour"], mine["price_source"]) == (2.0, "our contract")
    assert mine["usd_per_m_output_tokens"] == pytest.approx(
        default["usd_per_m_output_tokens"] / PRICES["h100-sxm"].on_demand)
    assert main([*base, "--prices", str(prices), "--price-kind", "reserved"]) == 0
    assert json.loads(capsys.readouterr().out)["cost"]["cost_per_hour"] == 1.0
    assert main(base[:-1]) == 0  # the terminal: one cost line under the table
    assert "cost: $" in capsys.readouterr().out


@pytest.mark.parametrize(("text", "says"), [
    ("h100-sxm: -2\n", ": h100-sxm.on_demand: -2 is not a price; allowed: a number of dollars per GPU-hour"),
    ("h100-sxm: {on_demand: .nan}\n", ": h100-sxm.on_demand: nan is not a price"),
    ("tpu: 1\n", ": tpu: unknown GPU; allowed: kind, file, or a GPU of a100-40gb"),
    ("kind: spot\n", ": kind: 'spot'; allowed: on_demand, reserved"),
    ("h100-sxm: {price: 2}\n", ": h100-sxm.price: unknown key; allowed: on_demand, reserved, source, date"),
])
def test_bad_prices_are_one_line_and_exit_2(tmp_path, capsys, text, says):
    prices = tmp_path / "p.yaml"
    prices.write_text(text)
    assert main(["simulate", "--trace", _trace(tmp_path), "--prices", str(prices)]) == 2
    err = capsys.readouterr().err.strip()
    assert str(prices) + says in err and "\n" not in err and "Traceback" not in err


def test_a_missing_price_file_names_the_flag(tmp_path, capsys):
    assert main(["simulate", "--trace", _trace(tmp_path), "--prices", str(tmp_path / "none.yaml")]) == 2
    assert "--prices" in capsys.readouterr().err


def test_a_price_of_zero_or_a_word_is_refused_in_a_block():
    for value in (0, "2 dollars", math.inf, None):
        with pytest.raises(ValueError, match=r"prices\.l4\.on_demand"):
            price_table({"l4": value})
