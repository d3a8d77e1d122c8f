"""Fuzzing trace files through `kvplan trace stats`, `trace convert`, `simulate` and `run --explain`: every format
the loaders accept (CSV, JSONL, Parquet layouts), in every codec (plain, gzip, bz2, xz, zstd), valid-ish rows with
random values, unknown fields, truncated or garbage bytes, corrupt containers, and bombs (one endless line, endless
lines, a Parquet file declaring more rows than fit). Every example must succeed or be refused with one line and
exit 2, never a traceback, within bounded time and memory: the whole suite runs in one child process under RLIMIT_AS
and a timeout (bounded_child).

The generated examples run with small trace limits (SMALL_LIMITS), so that each bomb costs milliseconds; the
streaming checks read the limits at every call, so the mechanism is the one the real limits use, and one bomb
per codec also runs against the real limits (real_limit_bombs)."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.reliability import bounded_child

SUITE_TIMEOUT_S = 150.0
SMALL_LIMITS = {"MAX_TRACE_LINE_BYTES": 256 * 2**10, "MAX_TRACE_BYTES": 4 * 2**20, "MAX_TRACE_LINES": 20_000,
                "MAX_TRACE_CELLS": 12 * 20_000}
CODECS = ("plain", "gzip", "bz2", "xz", "zstd")


def compress(data: bytes, codec: str) -> bytes:
    import bz2
    import gzip
    import lzma

    import zstandard

    if codec == "plain":
        return data
    if codec == "gzip":
        return gzip.compress(data, compresslevel=6, mtime=0)
    if codec == "bz2":
        return bz2.compress(data)
    if codec == "xz":
        return lzma.compress(data)
    return zstandard.ZstdCompressor().compress(data)


def bomb(head: bytes, chunk: bytes, copies: int, codec: str) -> bytes:
    """`head` then `chunk` `copies` times, as concatenated members (gzip, bz2, xz and zstd all read on across
    members): a file of a few KB that inflates to copies x len(chunk) bytes, without compressing them all."""
    member = compress(chunk, codec)
    return compress(head, codec) + member * copies if codec != "plain" else head + chunk * min(copies, 4)


def _child() -> None:
    import io
    import json

    import pandas as pd
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from kvplan import limits
    from kvplan.traces import FORMATS

    failures: list[dict] = []
    real = {name: getattr(limits, name) for name in SMALL_LIMITS}

    def datetime_cell() -> st.SearchStrategy:
        return st.sampled_from(["2023-11-16 18:15:46.6800000", "2024-05-10 00:00:00+00:00",
                                "2024-10-15T12:00:00.269Z", "2023-13-45 99:99:99", "yesterday", ""])

    numbers = st.one_of(st.integers(0, 5000), st.integers(0, 5000), st.integers(-10, 10),
                        st.integers(min_value=2**53, max_value=10**30), st.floats(allow_nan=True, allow_infinity=True))
    cells = st.one_of(numbers, st.sampled_from(["", "abc", "1e400", "NaN", "-0", "1.5", "true", "null", "\"q,\"",
                                                "\u00e9", "0x10"]))
    hash_lists = st.one_of(st.lists(st.integers(0, 2**63 - 1), max_size=8), st.lists(st.integers(-5, 5), max_size=3),
                           st.just("3 17 42"), st.just([1.5, "a"]), st.none())

    @st.composite
    def table(draw) -> tuple[str, list[str], list[dict]]:
        """A format, its columns (required, some optional, maybe unknown ones) and a few rows: in half the examples
        rows the format accepts (ordered arrivals, unique ids, ordered stamps), else random cells."""
        fmt = FORMATS[draw(st.sampled_from(sorted(FORMATS)))]
        columns = list(fmt.required)
        optional = sorted(fmt.known - set(columns))
        columns += draw(st.lists(st.sampled_from(optional), unique=True)) if optional else []
        columns += draw(st.lists(st.sampled_from(["extra", "output_len", "Unnamed: 0", "x" * 300]), unique=True,
                                 max_size=2))
        valid = draw(st.sampled_from([True, True, False]))
        if columns and not valid and draw(st.integers(0, 4)) == 0:
            columns.remove(draw(st.sampled_from(columns)))  # a required column missing
        by_source = {f.source: f for f in fmt.fields}
        rows = []
        for row_index in range(draw(st.integers(0, 6))):
            row: dict = {}
            for name in columns:
                field = by_source.get(name)
                if field is not None and field.kind == "datetime":
                    row[name] = f"2023-11-16 18:15:{10 + row_index:02d}.0000000" if valid else draw(datetime_cell())
                elif name == fmt.hashes:
                    row[name] = None if valid else draw(hash_lists)
                elif not valid:
                    row[name] = draw(cells)
                elif field is not None and field.column in ("arrival_s", "request_id"):
                    row[name] = row_index
                elif field is not None and field.column.endswith("_ts"):
                    row[name] = row_index + list(by_source).index(name)  # queued <= scheduled <= ... in order
                elif name in ("batch_size", "n"):
                    row[name] = 1
                elif name == "parent_chat_id":
                    row[name] = -1
                else:
                    row[name] = draw(st.integers(1, 4000))
            rows.append(row)
        return fmt.name, columns, rows

    def render(kind: str, columns: list[str], rows: list[dict]) -> bytes:
        if kind == "jsonl":
            return "".join(json.dumps(r, default=str) + "\n" for r in rows).encode()
        if kind == "csv":
            lines = [",".join(columns)]
            lines += [",".join(" ".join(map(str, v)) if isinstance(v, list) else "" if v is None else str(v)
                               for v in r.values()) for r in rows]
            return ("\n".join(lines) + "\n").encode()
        frame = pd.DataFrame({c: [_plain(r[c]) for r in rows] for c in columns})
        buffer = io.BytesIO()
        try:
            frame.to_parquet(buffer, index=False)
        except Exception:
            frame.astype(str).to_parquet(buffer, index=False)
        return buffer.getvalue()

    def run(data: bytes, command: str, fmt: str | None, case: str) -> None:
        path = Path("trace.bin")
        path.write_bytes(data)
        options = ["--format", fmt] if fmt else []
        if command == "stats":
            argv = ["trace", "stats", str(path), *options]
        elif command == "convert":
            argv = ["trace", "convert", str(path), "out.jsonl", *options]
        elif command == "simulate":
            argv = ["simulate", "--trace", str(path), "--model", "llama-3-8b",
                    *(["--trace-format", fmt] if fmt else [])]
        else:
            Path("experiment.yaml").write_text(f"name: fuzz\nworkload:\n  trace: {path.resolve()}\n"
                                               + (f"  format: {fmt}\n" if fmt else ""))
            argv = ["run", "--explain", "experiment.yaml"]
        bounded_child.check(case, argv, failures)

    commands = st.sampled_from(["stats", "stats", "stats", "convert", "simulate", "explain"])
    options = settings(max_examples=50, deadline=None, derandomize=True, database=None,
                       suppress_health_check=list(HealthCheck))

    @options
    @given(table(), st.sampled_from(CODECS), commands, st.booleans(), st.data())
    def tables(spec: tuple, codec: str, command: str, named: bool, data: st.DataObject) -> None:
        name, columns, rows = spec
        data_bytes = render(FORMATS[name].kind, columns, rows)
        damage = data.draw(st.sampled_from(["none", "none", "none", "truncate", "garbage", "compressed", "deep"]))
        if damage == "deep":  # a line nested past Python's stack, anywhere
            at = data_bytes.find(b"\n", data.draw(st.integers(0, len(data_bytes)))) + 1
            deep = b'{"x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}\n"
            data_bytes = data_bytes[:at] + deep + data_bytes[at:]
        elif damage == "truncate":
            data_bytes = data_bytes[:data.draw(st.integers(0, len(data_bytes)))]
        elif damage == "garbage":
            at = data.draw(st.integers(0, len(data_bytes)))
            data_bytes = data_bytes[:at] + data.draw(st.binary(min_size=1, max_size=16)) + data_bytes[at:]
        packed = compress(data_bytes, codec)
        if damage == "compressed" and codec != "plain":
            packed = packed[:data.draw(st.integers(1, max(1, len(packed) - 1)))]
        run(packed, command, name if named else None, f"{name} {codec} {damage} {columns} {rows}"[:1500])

    @settings(max_examples=35, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(CODECS),
           st.sampled_from(["line", "lines", "header", "jsonl-line", "parquet-rows", "wide-header", "wide-jsonl"]),
           commands)
    def bombs(codec: str, kind: str, command: str) -> None:
        one = b"1" * 2**20
        if kind == "line":  # one endless line after a valid header
            data = bomb(b"arrived_at,num_prefill_tokens,num_decode_tokens\n", one, 64, codec)
        elif kind == "header":  # the first line itself endless (format detection reads it)
            data = bomb(b"arrived_at", one, 64, codec)
        elif kind == "jsonl-line":
            data = bomb(b'{"timestamp": 0, "input_length": 5, "output_length": 3}\n{"timestamp": ', one, 64, codec)
        elif kind == "wide-header":  # a header of distinct names, each a column
            data = bomb(b"arrived_at,num_prefill_tokens,num_decode_tokens", b",c" * 2**16, 4, codec)
        elif kind == "wide-jsonl":  # many keys once, then rows of `{}` (each still a value for every key)
            keys = ", ".join(f'"k{i}": 0' for i in range(900))
            data = bomb(b'{"timestamp": 0, "input_length": 5, "output_length": 3, ' + keys.encode() + b"}\n",
                        b"{}\n" * 1000, 2, codec)
        elif kind == "lines":  # endless short valid rows
            data = bomb(b"arrived_at,num_prefill_tokens,num_decode_tokens\n", b"1,2,3\n" * 2**17, 64, codec)
        else:  # a Parquet file declaring more rows than the limit, a few KB on disk
            buffer = io.BytesIO()
            pd.DataFrame({"request_id": range(50_000), "arrival_s": 0.0, "prompt_tokens": 1,
                          "output_tokens": 1}).to_parquet(buffer, index=False)
            data = compress(buffer.getvalue(), codec)
        run(data, command, None, f"bomb {kind} {codec}")

    def real_limit_bombs() -> None:
        """Against the real limits: per codec, one line that inflates to 4 GiB (more than the child's whole address
        space: read whole, it fails the suite), refused at 64 MB; and 4 GiB of short rows, refused at 20M lines."""
        for name, value in real.items():
            setattr(limits, name, value)
        chunk = b"1" * 4 * 2**20
        copies = 4 * 2**30 // len(chunk)
        for codec in CODECS[1:]:
            data = bomb(b"arrived_at,num_prefill_tokens,num_decode_tokens\n", chunk, copies, codec)
            run(data, "stats", None, f"real-limit 4 GiB line bomb {codec}")
        data = bomb(b'{"timestamp": ', chunk, copies, "zstd")
        for command in ("convert", "simulate", "explain"):
            run(data, command, None, f"real-limit 4 GiB zstd line bomb via {command}")
        rows = b"1,2,3\n" * (2**20 // 6)
        data = bomb(b"arrived_at,num_prefill_tokens,num_decode_tokens\n", rows, 4 * 2**30 // len(rows), "zstd")
        run(data, "stats", None, "real-limit 4 GiB zstd bomb of short rows")

    for name, value in SMALL_LIMITS.items():
        setattr(limits, name, value)
    tables()
    bombs()
    real_limit_bombs()
    bounded_child.report(failures)


def _plain(value: object) -> object:
    """A cell as Parquet can hold it: lists of integers kept, other lists as text."""
    if isinstance(value, list):
        return value if all(isinstance(v, int) for v in value) else str(value)
    return value


def test_trace_fuzz_never_crashes_hangs_or_runs_out_of_memory(tmp_path):
    bounded_child.check_suite(Path(__file__), SUITE_TIMEOUT_S, tmp_path, minimum=75)  # every strategy ran


if __name__ == "__main__" and "--child" in sys.argv:
    _child()
