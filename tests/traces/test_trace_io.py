"""Our interchange formats round-trip every column exactly."""

from __future__ import annotations

import numpy as np
import pytest

from kvplan import traces
from tests.traces.trace_fixtures import AZURE_2023, QWEN, write_jsonl, write_text
from kvplan.traces.io import kind_of, render, to_frame
from kvplan.traces.schema import Trace


def _same(a: Trace, b: Trace) -> None:
    for name in ("arrival_s", "prompt_tokens", "output_tokens", "request_id", "session_id", "turn",
                 "priority", "n", "hash_ids", "hash_offsets"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None and y is None) or np.array_equal(x, y), name
    assert a.hash_granularity == b.hash_granularity


@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet"])
@pytest.mark.parametrize("source", ["qwen", "azure"])
def test_round_trip_is_lossless(tmp_path, kind, source):
    original = (traces.load(write_jsonl(tmp_path, "q.jsonl", QWEN)) if source == "qwen"
                else traces.load(write_text(tmp_path, "a.csv", AZURE_2023)))
    out = tmp_path / f"out.{kind}"
    out.write_bytes(render(original, kind))
    loaded = traces.load(out)
    assert loaded.report.format == f"kvplan-{kind}"
    _same(original, loaded)


def test_native_csv_bad_hash_text_names_the_line(tmp_path):
    original = traces.load(write_jsonl(tmp_path, "q.jsonl", QWEN))
    text = render(original, "csv").decode().splitlines()
    text[2] = text[2].rsplit(",", 1)[0] + ",1 2 x"
    path = write_text(tmp_path, "t.csv", "\n".join(text) + "\n")
    with pytest.raises(traces.TraceFormatError, match=r"t.csv:3: prefix_hashes must be a list of integers"):
        traces.load(path)


def test_output_kind_from_extension():
    assert kind_of("a/b.parquet") == "parquet"
    assert kind_of("a/b.txt", "csv") == "csv"
    with pytest.raises(ValueError, match=r"b.txt: cannot tell the output format.*\.jsonl"):
        kind_of("a/b.txt")


def test_native_jsonl_bad_row_names_the_line(tmp_path):
    original = traces.load(write_jsonl(tmp_path, "q.jsonl", QWEN))
    lines = render(original, "jsonl").decode().splitlines()
    lines[1] = lines[1].replace('"prompt_tokens":40', '"prompt_tokens":0')
    path = write_text(tmp_path, "t.jsonl", "\n".join(lines) + "\n")
    with pytest.raises(traces.TraceFormatError, match=r"t.jsonl:2: prompt_tokens 0 is out of range; allowed: "
                                                      r"an integer >= 1"):
        traces.load(path)


def test_native_parquet_bad_row_names_the_row(tmp_path):
    frame = to_frame(traces.load(write_jsonl(tmp_path, "q.jsonl", QWEN)))
    frame.loc[2, "granularity_check"] = 0  # an unknown extra column is ignored
    frame["hash_granularity"] = [16, 16, 512, 16]
    frame.to_parquet(tmp_path / "t.parquet")
    with pytest.raises(traces.TraceFormatError, match=r"t.parquet:3: hash_granularity 512 differs from the "
                                                      r"trace's 16; allowed: one value per trace"):
        traces.load(tmp_path / "t.parquet")
    assert traces.load(tmp_path / "t.parquet", skip_bad=True).report.bad_lines == [3]
