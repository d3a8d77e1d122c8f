"""Bounded parsing, case by case (the fuzz suites in tests/reliability cover the classes): YAML aliases, size and
depth limited while the document is composed, with the file:line of the alias; trace content limited while it
streams, for every codec, with the file, the line and the limit; unknown trace fields named once per file."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
from pathlib import Path

import pandas as pd
import pytest
import zstandard

from kvplan import limits, traces
from kvplan.errors import UserError
from kvplan.traces.specs import read_yaml

LAUGHS = """name: x
workload:
  {section}:
    l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]
    l1: &l1 [*l0, *l0, *l0, *l0, *l0, *l0, *l0, *l0, *l0, *l0]
    l2: &l2 [*l1, *l1, *l1, *l1, *l1, *l1, *l1, *l1, *l1, *l1]
    l3: &l3 [*l2, *l2, *l2, *l2, *l2, *l2, *l2, *l2, *l2, *l2]
    l4: &l4 [*l3, *l3, *l3, *l3, *l3, *l3, *l3, *l3, *l3, *l3]
    l5: &l5 [*l4, *l4, *l4, *l4, *l4, *l4, *l4, *l4, *l4, *l4]
    l6: &l6 [*l5, *l5, *l5, *l5, *l5, *l5, *l5, *l5, *l5, *l5]
    l7: &l7 [*l6, *l6, *l6, *l6, *l6, *l6, *l6, *l6, *l6, *l6]
    l8: &l8 [*l7, *l7, *l7, *l7, *l7, *l7, *l7, *l7, *l7, *l7]
"""


@pytest.mark.parametrize("section", ["synthetic", "transforms"])
def test_an_alias_bomb_is_refused_at_its_alias_line_before_anything_reads_it(tmp_path, section, capsys):
    from kvplan import cli

    path = tmp_path / "bomb.yaml"
    path.write_text(LAUGHS.format(section=section))
    assert cli.main(["run", "--explain", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path}:9: alias *l4 takes the document past {limits.MAX_YAML_NODES} values" in err[0]


@pytest.mark.parametrize(("text", "expected"), [
    ("a: &x [1, *x]\n", ":1: alias *x refers to a value that contains it"),
    ("a: " + "[" * 200 + "]" * 200 + "\n", f":1: nested more than {limits.MAX_YAML_DEPTH} deep"),
    ("a: &x 1\n" + "".join(f"b{i}: *x\n" for i in range(limits.MAX_YAML_ALIASES + 1)),
     f":{limits.MAX_YAML_ALIASES + 2}: alias *x is the document's {limits.MAX_YAML_ALIASES + 1}th"),
    ("a: " + "1" * 5000 + "\n", ":1: not valid YAML: cannot read"),
    ("a: &l0 " + "[" * 60 + "]" * 60 + "\n" + "".join(f"l{i}: &l{i} [*l{i - 1}]\n" for i in range(1, 60)),
     ":41: alias *l39: nested more than 100 deep with its aliases expanded"),  # shallow as written, not as read
    ("a: 2024-13-45\n", ":1: not valid YAML: cannot read '2024-13-45' (month must be in 1..12)"),
    ("a: '" + "x" * limits.MAX_YAML_BYTES + "'\n", f"bytes of YAML; allowed: at most {limits.MAX_YAML_BYTES}"),
])
def test_every_yaml_limit_is_one_line_naming_the_file(tmp_path, text, expected):
    path = tmp_path / "doc.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as caught:
        read_yaml(path, "SPEC")
    assert expected in str(caught.value) and str(caught.value).startswith(str(path))


def test_aliases_within_the_limits_still_load(tmp_path):
    path = tmp_path / "doc.yaml"
    path.write_text("base: &b {rate: 2, cv: 1}\none: {<<: *b, cv: 3}\ntwo: *b\n")
    assert read_yaml(path, "SPEC") == {"base": {"rate": 2, "cv": 1}, "one": {"rate": 2, "cv": 3},
                                       "two": {"rate": 2, "cv": 1}}


def _compressed(codec: str, chunks: list[bytes]) -> bytes:
    """`chunks` as concatenated members of `codec`: each is compressed once, however often it repeats."""
    one = {"gzip": lambda d: gzip.compress(d, mtime=0), "bz2": bz2.compress, "xz": lzma.compress,
           "zstd": zstandard.ZstdCompressor().compress, "plain": lambda d: d}[codec]
    cache: dict[bytes, bytes] = {}
    return b"".join(cache.setdefault(c, one(c)) for c in chunks)


@pytest.fixture
def small_limits(monkeypatch):
    """Limits small enough that a bomb costs milliseconds: the streaming checks read them at every call."""
    monkeypatch.setattr(limits, "MAX_TRACE_LINE_BYTES", 2**16)
    monkeypatch.setattr(limits, "MAX_TRACE_BYTES", 2**20)
    monkeypatch.setattr(limits, "MAX_TRACE_LINES", 1000)


HEADER = b"arrived_at,num_prefill_tokens,num_decode_tokens\n"


@pytest.mark.parametrize("codec", ["plain", "gzip", "bz2", "xz", "zstd"])
@pytest.mark.parametrize(("chunks", "expected"), [
    ([HEADER] + [b"1" * 2**14] * 32, ":2: line longer than 65536 bytes"),
    ([b"arrived_at"] + [b"1" * 2**14] * 32, ":1: line longer than 65536 bytes"),
    ([HEADER] + [b"1,2,3\n" * 100] * 20, ": more than 1000 lines"),
    ([HEADER] + [b"1,2,3\r" * 100] * 20, ": more than 1000 lines"),
])
def test_trace_limits_hold_while_streaming_every_codec(tmp_path, small_limits, codec, chunks, expected):
    path = tmp_path / "trace"
    path.write_bytes(_compressed(codec, chunks))
    with pytest.raises(UserError, match=expected.replace(".", r"\.")):
        traces.load(path)


def test_total_size_is_limited_while_streaming(tmp_path, small_limits):
    path = tmp_path / "trace.gz"
    path.write_bytes(_compressed("gzip", [HEADER] + [b"1,2,3" + b" " * 2000 + b"\n"] * 600))
    with pytest.raises(UserError, match=f"{path}: more than 1048576 bytes \\(gzip-decompressed\\)"):
        traces.load(path)


def test_a_parquet_file_declaring_too_many_rows_is_refused_before_decoding(tmp_path, small_limits):
    buffer = io.BytesIO()
    pd.DataFrame({"request_id": range(5000), "arrival_s": 0.0, "prompt_tokens": 1, "output_tokens": 1}).to_parquet(
        buffer, index=False)
    path = tmp_path / "t.parquet"
    path.write_bytes(buffer.getvalue())
    with pytest.raises(UserError, match="5000 rows; allowed: at most 1000"):
        traces.load(path)


@pytest.mark.parametrize(("name", "content", "note"), [
    ("t.csv", "arrived_at,num_prefill_tokens,num_decode_tokens,foo,output_len\n0,5,3,x,1\n1,5,3,y,2\n",
     "ignored 2 fields the vidur layout does not read: 'foo', 'output_len'"),
    ("t.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 3, "zz": 1}\n'
                '{"timestamp": 1, "input_length": 5, "output_length": 3, "yy": 1}\n',
     "ignored 2 fields the mooncake layout does not read: 'zz', 'yy'"),
])
def test_unknown_trace_fields_are_named_once_per_file(tmp_path, name, content, note, capsys):
    from kvplan import cli

    path = tmp_path / name
    path.write_text(content)
    assert traces.load(path).report.lines() == [note]
    assert cli.main(["trace", "stats", str(path)]) == 0
    assert capsys.readouterr().out.count(note) == 1


def test_a_parquet_files_unknown_columns_are_named(tmp_path):
    path = tmp_path / "t.parquet"
    pd.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 1.0], "prompt_tokens": [5, 5], "output_tokens": [3, 3],
                  "colour": ["red", "blue"]}).to_parquet(path, index=False)
    assert traces.load(path).report.lines() == ["ignored 1 field the kvplan-parquet layout does not read: 'colour'"]


def test_a_trace_that_uses_every_field_has_no_note(tmp_path):
    path = Path(tmp_path / "t.csv")
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,3\n")
    assert traces.load(path).report.lines() == []


@pytest.mark.parametrize(("name", "content", "expected"), [
    ("t.csv", ",".join(f"c{i}" for i in range(1500)) + "\n",
     ":1: the header names 1500 columns; allowed: at most 1000"),
    ("t.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 3}\n'
     + "".join(f'{{"k{i}": 1}}\n' for i in range(1200)), ":999: 1001 distinct keys so far; allowed: at most 1000"),
])
def test_the_number_of_fields_is_limited(tmp_path, name, content, expected):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(UserError, match=expected):
        traces.load(path)


def test_values_in_all_are_limited_however_few_each_row_writes(tmp_path, small_limits, monkeypatch):
    monkeypatch.setattr(limits, "MAX_TRACE_CELLS", 5000)
    path = tmp_path / "t.jsonl"  # 500 keys once, then rows of `{}`: each still holds a value for every field
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 3, '
                    + ", ".join(f'"k{i}": 0' for i in range(497)) + "}\n" + "{}\n" * 50)
    with pytest.raises(UserError, match=":11: 500 fields x 11 rows; allowed: at most 5000 values"):
        traces.load(path)


@pytest.mark.parametrize("name", ["deep.jsonl", "deep-first.jsonl"])
def test_a_jsonl_value_nested_past_the_stack_is_a_bad_line(tmp_path, name):
    deep = "[" * 100_000 + "]" * 100_000
    good = '{"timestamp": 0, "input_length": 5, "output_length": 3}\n'
    path = tmp_path / name
    path.write_text(good + '{"x": ' + deep + "}\n" if name == "deep.jsonl" else '{"x": ' + deep + "}\n" + good)
    with pytest.raises(UserError, match=f"{name}:[12]: (first line is )?nested too deeply"):
        traces.load(path)


def test_an_xz_stream_needing_more_memory_than_allowed_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "t.xz"  # preset 6: an 8 MiB dictionary, ~9 MiB to decompress
    path.write_bytes(lzma.compress(HEADER + b"0,1,1\n", preset=6))
    assert len(traces.load(path)) == 1
    monkeypatch.setattr(limits, "MAX_XZ_MEMORY", 4 * 2**20)
    with pytest.raises(UserError, match=f"{path}: the xz stream needs more than 4194304 bytes of memory"):
        traces.load(path)
