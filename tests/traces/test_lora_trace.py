"""A trace row may name a LoRA adapter (`lora`; absent or null: the base model): the column survives a load, a
transform and a round trip through every kvplan format, and a value that is no adapter name is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvplan import traces
from kvplan.cli import main
from kvplan.traces.io import render
from kvplan.traces.schema import Trace

ROWS = [{"request_id": 1, "arrival_s": 0.0, "prompt_tokens": 10, "output_tokens": 3, "lora": "sql"},
        {"request_id": 2, "arrival_s": 0.5, "prompt_tokens": 12, "output_tokens": 4},
        {"request_id": 3, "arrival_s": 1.0, "prompt_tokens": 8, "output_tokens": 2, "lora": "chat"},
        {"request_id": 4, "arrival_s": 1.5, "prompt_tokens": 8, "output_tokens": 2, "lora": None}]
NAMES = ["sql", None, "chat", None]


def _write(tmp_path, rows) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_the_adapter_column_loads_and_round_trips_through_every_format(tmp_path):
    trace = traces.load(_write(tmp_path, ROWS))
    assert trace.lora_names == ("chat", "sql") and [trace.lora_of(i) for i in range(4)] == NAMES
    assert [r.lora for r in trace.records()] == NAMES
    assert [trace.take(np.array([2, 0])).lora_of(i) for i in range(2)] == ["chat", "sql"]
    for kind in ("jsonl", "csv", "parquet"):
        path = tmp_path / f"out.{kind}"
        path.write_bytes(render(trace, kind))
        back = traces.load(str(path))
        assert [back.lora_of(i) for i in range(4)] == NAMES, kind
        assert back.lora_names == trace.lora_names and not back.report.notes, kind


def test_a_trace_without_adapters_has_no_column_and_writes_none(tmp_path):
    trace = traces.load(_write(tmp_path, [{k: v for k, v in r.items() if k != "lora"} for r in ROWS]))
    assert trace.lora is None and trace.lora_names == ()
    assert b"lora" not in render(trace, "jsonl") and b"lora" not in render(trace, "csv")
    assert Trace.build([0.0], [4], [2]).lora_of(0) is None


@pytest.mark.parametrize("value", [5, ["sql"], 1.5])
def test_a_value_that_is_no_adapter_name_is_refused_in_one_line(tmp_path, capsys, value):
    path = _write(tmp_path, [{**ROWS[0], "lora": value}])
    assert main(["trace", "stats", path]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "t.jsonl:1: lora" in err and "allowed: a non-empty string" in err, err


def test_an_endpoint_replay_names_each_rows_adapter_in_model(tmp_path):
    from kvplan.endpoint.loadgen import LoadGenerator
    from kvplan.endpoint.prompts import endpoint_requests

    requests = endpoint_requests(traces.load(_write(tmp_path, ROWS)), vocab_size=100, seed=0)
    assert [r.lora for r in requests] == NAMES
    client = LoadGenerator("http://127.0.0.1:1", "base-model")
    assert [client.body(r)["model"] for r in requests] == ["sql", "base-model", "chat", "base-model"]


def test_adapters_assigned_by_popularity_round_trip(tmp_path):
    from kvplan.errors import UserError
    from kvplan.traces.transforms import assign_adapters

    trace = Trace.build(np.zeros(4000), np.full(4000, 8), np.full(4000, 2))
    skewed = assign_adapters(trace, 8, skew=1.2, base_fraction=0.25, seed=3)
    counts = np.bincount(skewed.lora, minlength=9)
    assert abs(counts[0] / 4000 - 0.25) < 0.03 and list(counts[1:]) == sorted(counts[1:], reverse=True)
    uniform = np.bincount(assign_adapters(trace, 4, seed=1).lora, minlength=5)
    assert uniform[0] == 0 and uniform[1:].min() > 900
    path = tmp_path / "a.jsonl"
    path.write_bytes(render(skewed, "jsonl"))
    back = traces.load(str(path))  # names only the adapters used, sorted: compare by name
    assert [back.lora_of(i) for i in range(4000)] == [skewed.lora_of(i) for i in range(4000)]
    for bad in ({"adapters": 0}, {"adapters": 2, "skew": -1}, {"adapters": 2, "base_fraction": 1.0}):
        with pytest.raises(UserError, match="allowed"):
            assign_adapters(trace, **bad)
