"""Reading a CSV trace into `Rows`: all fields as strings, each row with the line it starts on, and the header
checks (a first line that is data, a column named twice) that run before pandas could blame something else."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pandas as pd

from kvplan import limits
from kvplan.traces.compression import open_text, read_bytes
from kvplan.traces.loaders.rows import Rows
from kvplan.traces.schema import TraceFormatError, short_repr

EXTRA_FIELDS = 8  # a CSV row may carry this many fields beyond its header before pandas itself gives up


def read_csv(path: str | Path, errors: str = "strict") -> Rows:
    """All fields as strings, one row per non-blank line, keeping each row's line number (a quoted field may
    span lines: then each row is numbered by the line it starts on)."""
    path = str(path)
    with open_text(path, errors) as f:
        first = f.readline()
    header = [h.strip() for h in first.rstrip("\r\n").split(",")]
    check_header(path, header)
    names = header + [f"__extra{i}" for i in range(EXTRA_FIELDS)]
    # Read whole, once: a compressed file is decompressed here (pandas' own decompression reads a truncated
    # archive as a shorter file and blames its last row), and the bytes tell whether any field is quoted.
    data = read_bytes(path)
    records = max(data.count(b"\n"), data.count(b"\r")) + 1  # at least as many as pandas will make
    if records * len(names) > limits.MAX_TRACE_CELLS:
        raise TraceFormatError(f"{path}: {len(header)} columns (and {EXTRA_FIELDS} spare) x {records} lines; allowed: "
                               f"at most {limits.MAX_TRACE_CELLS} values in all (limits.MAX_TRACE_CELLS)")
    try:
        # Escaped bytes (the --skip-bad retry) cannot live in pandas' Arrow strings: plain objects then.
        frame = pd.read_csv(io.BytesIO(data), header=None, skiprows=1, names=names,
                            dtype=str if errors == "strict" else object, keep_default_na=False,
                            skip_blank_lines=False, encoding="utf-8-sig", encoding_errors=errors)
    except pd.errors.ParserError as exc:
        problem = " ".join(str(exc).split())  # pandas' message spans lines
        raise TraceFormatError(f"{path}: {problem}; allowed: the header's {len(header)} fields per row") from None
    line = _record_lines(data, errors, len(frame)) if b'"' in data else np.arange(2, len(frame) + 2, dtype=np.int64)
    cells = frame.to_numpy(dtype=object)
    filled = cells != ""
    blank = ~filled.any(axis=1) if len(frame) else np.zeros(0, dtype=bool)
    rows = Rows(path, header, line[~blank], {})
    cells, filled = cells[~blank], filled[~blank]
    for j, name in enumerate(header):
        rows.fields[name] = np.where(filled[:, j], cells[:, j], None)
    rows.flag(filled[:, len(header):].any(axis=1), f"more fields than the header's {len(header)}")
    if errors != "strict":
        escaped = np.zeros(len(rows), dtype=bool)
        for j in range(cells.shape[1]):
            escaped |= pd.Series(cells[:, j], dtype=object).str.contains("[\udc80-\udcff]", regex=True).fillna(
                False).to_numpy(dtype=bool)
        rows.flag(escaped, "not UTF-8 text; allowed: UTF-8")
    return rows


def _record_lines(data: bytes, errors: str, expected: int) -> np.ndarray:
    """The line each data record starts on, by Python's csv reader (it counts the lines inside quoted fields)."""
    text = data.decode("utf-8-sig", errors)
    reader = csv.reader(io.StringIO(text, newline=""))
    next(reader, None)  # the header
    starts, previous = [], reader.line_num
    for _ in reader:
        starts.append(previous + 1)
        previous = reader.line_num
    if len(starts) != expected:  # the two parsers disagree on what a record is: keep pandas' rows, count lines
        return np.arange(2, expected + 2, dtype=np.int64)
    return np.array(starts, dtype=np.int64)


class MissingHeader(TraceFormatError):
    """A CSV whose first line is data: whoever knows the expected layout adds it to the message (`allowed`)."""

    def __init__(self, path: str, first_line: str) -> None:
        self.path, self.first_line = path, first_line
        super().__init__(self.message("a header line naming the columns"))

    def message(self, allowed: str) -> str:
        return f"{self.path}:1: the first line {short_repr(self.first_line)} is data, not a header; allowed: {allowed}"


def check_header(path: str, header: list[str]) -> None:
    """A CSV's first line must name its columns, each once: a file without a header (its first line is data)
    or with a repeated name is refused here, before pandas gives a message that names neither."""
    if header_is_data(header):
        raise MissingHeader(path, ",".join(header)[:80])
    if len(header) > limits.MAX_TRACE_FIELDS:
        raise TraceFormatError(f"{path}:1: the header names {len(header)} columns; allowed: at most "
                               f"{limits.MAX_TRACE_FIELDS} (limits.MAX_TRACE_FIELDS)")
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise TraceFormatError(f"{path}:1: the header names column {short_repr(name)} twice; allowed: distinct "
                                   "names")
        seen.add(name)


def is_value(text: str) -> bool:
    """A number or a date: what a data row holds and a column name never is."""
    if not text:
        return False
    try:
        float(text)
        return True
    except ValueError:
        return text[:4].isdigit() and text[4:5] == "-"  # 2023-11-16 18:15:46.68, 2024-10-15T12:00:00Z


def header_is_data(header: list[str]) -> bool:
    """Every field of the line a number or a date: values, where a header would have names."""
    return bool(header) and all(is_value(h) for h in header)
