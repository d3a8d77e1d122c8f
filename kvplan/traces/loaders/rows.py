"""Reading raw rows with their line numbers, and validating them into columns.

Every loader goes through here, so every format reports bad input the same way: the first bad row stops the
load with `path:LINE: problem; allowed: ...`, or, with `skip_bad`, all bad rows are dropped and counted in the
trace's `LoadReport` (never silently).
"""

from __future__ import annotations

import csv
import io
import json
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from kvplan.errors import UserError
from kvplan.traces.compression import open_text, read_bytes
from kvplan.traces.schema import LoadReport, Trace, TraceFormatError, gather_segments, offsets_from_counts, short_repr

EXTRA_FIELDS = 8  # a CSV row may carry this many fields beyond its header before pandas itself gives up
SHOWN_BAD_LINES = 5
_DECODER = json.JSONDecoder()


def object_column(values: list) -> np.ndarray:
    """A 1-D object array even when every value is a list (numpy would otherwise build a 2-D array)."""
    # fromiter stores each value as it is; slice assignment would probe every array('q') as a sequence (slow).
    return np.fromiter(values, dtype=object, count=len(values))


@dataclass(slots=True)
class Rows:
    """Raw values of one file: a column per field (object arrays; None where absent) and each row's line."""

    path: str
    header: list[str]
    line: np.ndarray
    fields: dict[str, np.ndarray]
    problems: dict[int, str] = field(default_factory=dict)  # row index -> first problem found in it

    def __len__(self) -> int:
        return len(self.line)

    def require(self, names: list[str], layout: str) -> None:
        missing = [n for n in names if n not in self.fields]
        if missing and self.problems and len(self.problems) == len(self):
            # Not one row could be read (invalid JSON everywhere): that, not the columns, is the news.
            first = min(self.problems)
            raise TraceFormatError(f"{self.path}:{self.line[first]}: {self.problems[first]}")
        if missing:
            raise TraceFormatError(f"{self.path}:1: missing column {', '.join(map(repr, missing))}; "
                                   f"found {', '.join(self.header) or 'nothing'}; allowed: {layout}")

    def flag(self, mask: np.ndarray, message: object) -> None:
        """Record a problem for each row in `mask` that has none yet (`message`: text or f(row))."""
        for row in np.flatnonzero(mask):
            if row not in self.problems:
                self.problems[int(row)] = message(int(row)) if callable(message) else str(message)

    def ok(self) -> np.ndarray:
        mask = np.ones(len(self), dtype=bool)
        mask[list(self.problems)] = False
        return mask

    def number(self, name: str, *, integer: bool = True, minimum: float | None = 0,
               default: float | None = None) -> np.ndarray:
        """Column `name` as float64, flagging missing, non-numeric, fractional and too-small values.

        With a `default`, a missing value (absent column, empty cell, JSON null) takes it instead of failing.
        """
        raw = self.fields.get(name)
        if raw is None:
            raw = np.full(len(self), None, dtype=object)
        missing = pd.isna(raw) | (raw == "")
        if default is None:
            self.flag(missing, f"missing value for column {short_repr(name)}")
        values = pd.to_numeric(pd.Series(raw, dtype=object), errors="coerce").to_numpy(np.float64, copy=True)
        present = ~missing
        self.flag(present & ~np.isfinite(values),
                  lambda r: f"non-numeric {name} {short_repr(raw[r])}; allowed: a number")
        kind = "an integer" if integer else "a number"
        with np.errstate(invalid="ignore"):
            if integer:
                self.flag(present & np.isfinite(values) & (values != np.round(values)),
                          lambda r: f"{name} {short_repr(raw[r])} is not an integer")
            if minimum is not None:
                self.flag(present & (values < minimum),
                          lambda r: f"{name} {values[r]:g} is out of range; allowed: {kind} >= {minimum:g}")
        if default is not None:
            values[missing] = default
        return values

    def label(self, name: str, missing_value: int) -> np.ndarray:
        """An identifier column (session ids): integers kept as they are, any other labels numbered 0, 1, ...
        in order of first appearance; missing values become `missing_value`."""
        raw = self.fields.get(name)
        if raw is None:
            return np.full(len(self), missing_value, dtype=np.float64)
        missing = pd.isna(raw) | (raw == "")
        numbers = pd.to_numeric(pd.Series(raw, dtype=object), errors="coerce").to_numpy(np.float64, copy=True)
        present = ~missing
        if not np.all(np.isfinite(numbers[present]) & (numbers[present] == np.round(numbers[present]))):
            numbers[present] = pd.factorize(pd.Series(raw[present], dtype=object).astype(str))[0]
        numbers[missing] = missing_value
        return numbers

    def datetime(self, name: str) -> np.ndarray:
        """Wall-clock strings (7 fractional digits, or ISO 8601 with a zone) as seconds since the earliest."""
        raw = self.fields[name]
        times = pd.to_datetime(pd.Series(raw, dtype=object), format="ISO8601", utc=True, errors="coerce")
        self.flag(times.isna().to_numpy(),
                  lambda r: f"bad {name} {short_repr(raw[r])}; allowed: 'YYYY-MM-DD HH:MM:SS[.fffffff][+HH:MM]'")
        valid = times.notna().to_numpy()
        nanos = times.to_numpy(dtype="datetime64[ns]", na_value=np.datetime64("NaT")).astype(np.int64)
        # Subtract in integers first: epoch seconds as float64 would lose the 7th fractional digit.
        start = nanos[valid].min() if valid.any() else 0
        return np.where(valid, (nanos - start) / 1e9, np.nan)

    def hash_lists(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """A column of integer lists in [0, 2^63) as (flat values, per-row counts); bad rows count 0.

        A missing value (null) is an empty list: that request carries no shared prefix.
        """
        raw = self.fields[name]
        arrays = [int_array(v) for v in raw]
        bad = np.fromiter((a is None for a in arrays), dtype=bool, count=len(arrays))
        self.flag(bad, lambda r: f"{name} must be a list of integers, got {_short(raw[r])}")
        counts = np.fromiter((0 if a is None else len(a) for a in arrays), dtype=np.int64, count=len(arrays))
        # A bytearray keeps the ids writable without a copy (finish may hand this very array to the Trace).
        flat = np.frombuffer(bytearray().join(a for a in arrays if a is not None), dtype=np.int64)
        negative = flat < 0
        if negative.any():
            owner = np.repeat(np.arange(len(arrays)), counts)
            rows = np.unique(owner[negative])
            self.flag(np.isin(np.arange(len(arrays)), rows), f"{name} must hold integers >= 0")
            flat = flat[~np.isin(owner, rows)]
            counts[rows] = 0
        return flat, counts


def int_array(value: object) -> array | None:
    """A list (or array) of integers as a compact array('q'); None for anything else (a bad value).

    Loaders turn hash lists into these as soon as they are read: 8 bytes per id instead of a Python int.
    """
    if value is None:
        return array("q")
    if isinstance(value, array) and value.typecode == "q":
        return value
    if isinstance(value, np.ndarray) and value.dtype.kind in "iu":
        out = array("q")
        out.frombytes(value.astype("<i8").tobytes())
        return out
    if not isinstance(value, list):
        return None
    try:
        return array("q", value)  # rejects floats and strings; ints beyond 64 bits overflow
    except (TypeError, OverflowError):
        return None


def _compact(value: object) -> object:
    """Integer lists as array('q') as soon as a line is read (a million rows hold tens of millions of hash
    ids); other values, and lists that are not all integers, stay as they are for validation to name."""
    if isinstance(value, list):
        compact = int_array(value)
        if compact is not None:
            return compact
    return value


def _short(value: object) -> str:
    return short_repr(value)


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


def read_jsonl(path: str | Path, errors: str = "strict") -> Rows:
    """One JSON object per non-blank line, gathered straight into columns (no per-row dicts kept).

    `errors="surrogateescape"` (the --skip-bad retry after a decode error) reads lines that are not UTF-8 and
    marks them bad instead of stopping at them."""
    path = str(path)
    columns: dict[str, list] = {}
    lines: list[int] = []
    problems: dict[int, str] = {}
    # Fast path: a line with exactly the keys of the line before, in the same order, when those are all the
    # columns so far (nothing to pad), appends straight to the cached column lists. A million-line trace
    # spends most of its load in this loop.
    same_keys: tuple[str, ...] | None = None
    same_columns: list[list] = []
    with open_text(path, errors) as f:
        for number, text in enumerate(f, start=1):
            if not text or text.isspace():  # what `not text.strip()` tests, without copying the line
                continue
            row = len(lines)
            lines.append(number)
            obj = _parse_line(text)
            if isinstance(obj, str):
                obj, problems[row] = {}, obj
            elif errors != "strict" and not text.isascii() and not _is_utf8(text):
                problems[row] = "not UTF-8 text; allowed: UTF-8"
            elif "true" in text or "false" in text:  # rare: look for booleans (the row keeps its columns)
                problem = _boolean_problem(obj)
                if problem:
                    problems[row] = problem
            keys = tuple(obj)
            if keys == same_keys:
                for column, value in zip(same_columns, obj.values(), strict=True):
                    if type(value) is list:  # _compact inlined, and try rather than suppress: this runs per line
                        try:  # noqa: SIM105
                            value = array("q", value)
                        except (TypeError, OverflowError):
                            pass
                    column.append(value)
                continue
            _append_row(columns, obj, row)
            same_keys = keys if len(keys) == len(columns) else None
            same_columns = [columns[k] for k in keys]
    header = list(columns)
    fields = {k: object_column(v) for k, v in columns.items()}
    return Rows(path, header, np.array(lines, dtype=np.int64), fields, problems)


def _boolean_problem(obj: dict) -> str | None:
    """The problem when a value is a JSON boolean (or a list holding one): `true` is not the number 1."""
    for key, value in obj.items():
        if type(value) is bool or (type(value) is list and any(type(v) is bool for v in value)):
            what = "holds a boolean" if type(value) is list else "is a boolean"
            return f"{key} {_short(value)} {what}; allowed: numbers (and lists of integers)"
    return None


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: bytes that were not UTF-8, escaped by surrogateescape
        return False
    return True


def _parse_line(text: str) -> dict | str:
    """The line's JSON object, or the problem with it.

    Fast path: `raw_decode` skips the whitespace checks of `json.loads` (a third of the parse time), and is
    taken only where the two agree: a line that starts with the value and ends right after it (or its
    newline). Anything else goes to `json.loads`, which decides as it always did.
    """
    try:
        obj, end = _DECODER.raw_decode(text)
        if end != len(text) and text[end:] not in ("\n", "\r\n"):
            raise UserError("not the whole line")
    except ValueError:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            return f"invalid JSON ({exc.msg}); allowed: one object per line"
    if not isinstance(obj, dict):
        return "not a JSON object; allowed: one JSON object per line"
    return obj


def _append_row(columns: dict[str, list], obj: dict, row: int) -> None:
    """Append row `row` to the columns: a key first seen here gets a new column (earlier rows lack it, so
    None), and columns this row lacks get None."""
    for key, value in obj.items():
        if key not in columns:
            columns[key] = [None] * row
        columns[key].append(_compact(value))
    for column in columns.values():
        if len(column) == row:
            column.append(None)


@dataclass(slots=True)
class LoadOptions:
    skip_bad: bool = False  # drop malformed rows (counted in the report) instead of stopping
    order_tolerance_s: float = 1.0  # how far a timestamp may fall behind an earlier one and still be sorted
    keep_failed: bool = False  # BurstGPT: keep failed requests (0 response tokens)
    hash_granularity: int | None = None  # tokens per prefix hash, overriding what the format states
    decode_errors: str = "strict"  # "surrogateescape": rows that are not UTF-8 become bad rows (--skip-bad)


def finish(rows: Rows, columns: dict[str, np.ndarray], opts: LoadOptions, report: LoadReport, *,
           hashes: tuple[np.ndarray, np.ndarray] | None = None, exclude: np.ndarray | None = None,
           **trace_args: object) -> Trace:
    """Check arrival order, then raise on the first bad row or drop the bad rows, and build the sorted Trace.

    `exclude` marks rows the format itself leaves out (already counted in `report`); they are not checked.
    """
    if exclude is not None:
        rows.flag(exclude, "excluded")
    _check_order(rows, columns["arrival_s"], opts.order_tolerance_s)
    if "request_id" in columns:
        _check_unique(rows, columns["request_id"])
    ok = rows.ok()
    excluded = np.zeros(len(rows), dtype=bool) if exclude is None else exclude
    if not (ok | excluded).all():
        bad_rows = np.flatnonzero(~ok & ~excluded)
        if not opts.skip_bad:
            first = int(bad_rows[0])
            raise TraceFormatError(f"{rows.path}:{rows.line[first]}: {rows.problems[first]}")
        report.dropped_bad += len(bad_rows)
        report.bad_lines = [int(rows.line[r]) for r in bad_rows[:SHOWN_BAD_LINES]]
    kept = {name: values[ok] for name, values in columns.items()}
    arrival = kept["arrival_s"]
    report.reordered = int(np.count_nonzero(arrival[1:] < np.maximum.accumulate(arrival)[:-1]))
    order = np.argsort(arrival, kind="stable")
    kept = {name: values[order] for name, values in kept.items()}
    if len(order) and trace_args.get("timed", True):
        kept["arrival_s"] = kept["arrival_s"] - kept["arrival_s"][0]
    source_index = np.flatnonzero(ok)[order]
    kept.setdefault("request_id", source_index)  # the source row: a stable id under any transform
    kept["source_line"] = rows.line[source_index]
    if hashes is not None:
        flat, counts = hashes
        offsets = offsets_from_counts(counts)
        if np.array_equal(source_index, np.arange(len(rows))):
            # Every row kept, already in order (the usual file): the ids are in place. Gathering would only
            # copy them, with several id-sized temporaries (a million-request trace holds tens of millions).
            kept["hash_ids"], kept["hash_offsets"] = flat, offsets
        else:
            kept["hash_ids"], kept["hash_offsets"] = gather_segments(flat, offsets, source_index)
    return Trace.build(**kept, report=report, **trace_args)


def _check_unique(rows: Rows, ids: np.ndarray) -> None:
    """Flag each row whose request id an earlier valid row already has (the first keeps it)."""
    valid = np.flatnonzero(rows.ok())
    _, first = np.unique(ids[valid], return_index=True)
    repeated = np.setdiff1d(valid, valid[first])
    if len(repeated):
        line_of = {float(ids[r]): int(rows.line[r]) for r in valid[first]}
        rows.flag(np.isin(np.arange(len(rows)), repeated),
                  lambda r: f"request_id {ids[r]:.0f} repeats the id of line {line_of[float(ids[r])]}; allowed: "
                            "unique ids")


def _check_order(rows: Rows, arrival: np.ndarray, tolerance_s: float) -> None:
    """Flag the rows whose timestamp is out of order by more than the tolerance; the rest is sorted later.

    Which rows are to blame: the longest run of rows already in order (a longest non-decreasing subsequence,
    the earliest rows preferred) is the trace; a row outside it is flagged when it falls more than the
    tolerance behind that run's rows before it, or jumps more than the tolerance ahead of its rows after it.
    So one early outlier (a timestamp far in the future) is the one row blamed, not every row after it.
    """
    ok = rows.ok() & np.isfinite(arrival)
    valid = np.flatnonzero(ok)
    if len(valid) < 2:
        return
    times = arrival[valid]
    latest_before = np.maximum.accumulate(np.concatenate(([times[0]], times[:-1])))
    if not (latest_before - times > tolerance_s).any():  # the usual file: nothing to blame, no search needed
        return
    in_order = _earliest_longest_ordered(times)
    before = np.maximum.accumulate(np.where(in_order, times, -np.inf))
    before = np.concatenate(([-np.inf], before[:-1]))
    after = np.minimum.accumulate(np.where(in_order, times, np.inf)[::-1])[::-1]
    after = np.concatenate((after[1:], [np.inf]))
    behind, ahead = before - times, times - after
    late = ~in_order & (behind > tolerance_s)
    early = ~in_order & ~late & (ahead > tolerance_s)
    lag = dict(zip(valid.tolist(), behind.tolist(), strict=True))
    lead = dict(zip(valid.tolist(), ahead.tolist(), strict=True))
    allowed = f"allowed: at most {tolerance_s:g} s (--order-tolerance)"
    rows.flag(np.isin(np.arange(len(rows)), valid[late]),
              lambda r: f"timestamp goes backwards by {lag[r]:.6g} s; {allowed}")
    rows.flag(np.isin(np.arange(len(rows)), valid[early]),
              lambda r: f"timestamp jumps {lead[r]:.6g} s ahead of the rows after it; {allowed}")


def _earliest_longest_ordered(times: np.ndarray) -> np.ndarray:
    """Mask of a longest non-decreasing subsequence of `times`, the lexicographically earliest one.

    longest[i] = the longest such run starting at i (patience sorting from the right, O(n log n)); then, left
    to right, take each row that can still start a run of the remaining length."""
    import bisect

    n = len(times)
    longest = np.empty(n, dtype=np.int64)
    tails: list[float] = []  # tails[k]: the largest -time a run of length k + 1 can start with, seen so far
    for i in range(n - 1, -1, -1):
        x = -float(times[i])
        k = bisect.bisect_right(tails, x)
        if k == len(tails):
            tails.append(x)
        else:
            tails[k] = x
        longest[i] = k + 1
    keep = np.zeros(n, dtype=bool)
    need, last = len(tails), -np.inf
    for i in range(n):
        if need and longest[i] == need and times[i] >= last:
            keep[i], need, last = True, need - 1, times[i]
    return keep
