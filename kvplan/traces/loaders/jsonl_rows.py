"""Reading a JSON-lines trace into `Rows`: one object per non-blank line, gathered straight into columns, hash
lists compacted as they are read, each bad line (invalid JSON, not an object, a boolean, not UTF-8) kept as a
row with its problem."""

from __future__ import annotations

import json
from array import array
from pathlib import Path

import numpy as np

from kvplan import limits
from kvplan.errors import UserError
from kvplan.traces.compression import open_text
from kvplan.traces.loaders.rows import Rows, int_array, object_column
from kvplan.traces.schema import TraceFormatError, short_repr

_DECODER = json.JSONDecoder()
NESTED_TOO_DEEPLY = "nested too deeply; allowed: one JSON object per line, of numbers and lists of integers"


def _compact(value: object) -> object:
    """Integer lists as array('q') as soon as a line is read (a million rows hold tens of millions of hash
    ids); other values, and lists that are not all integers, stay as they are for validation to name."""
    if isinstance(value, list):
        compact = int_array(value)
        if compact is not None:
            return compact
    return value


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
    max_cells = limits.MAX_TRACE_CELLS
    with open_text(path, errors) as f:
        for number, text in enumerate(f, start=1):
            if not text or text.isspace():  # what `not text.strip()` tests, without copying the line
                continue
            row = len(lines)
            lines.append(number)
            if (row + 1) * len(columns) > max_cells:  # every row holds a value (or None) for every field
                raise TraceFormatError(f"{path}:{number}: {len(columns)} fields x {row + 1} rows; allowed: at most "
                                       f"{max_cells} values in all (limits.MAX_TRACE_CELLS)")
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
            if len(columns) > limits.MAX_TRACE_FIELDS:  # checked only here: the fast path adds no column
                raise TraceFormatError(f"{path}:{number}: {len(columns)} distinct keys so far; allowed: at most "
                                       f"{limits.MAX_TRACE_FIELDS} (limits.MAX_TRACE_FIELDS)")
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
            return f"{key} {short_repr(value)} {what}; allowed: numbers (and lists of integers)"
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
    newline). Anything else goes to `json.loads`, which decides as it always did. A value nested past Python's
    recursion limit (`[[[[...` a few thousand deep, which a 64 MB line allows) is a bad line like any other.
    """
    try:
        try:
            obj, end = _DECODER.raw_decode(text)
            if end != len(text) and text[end:] not in ("\n", "\r\n"):
                raise UserError("not the whole line")
        except ValueError:
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                return f"invalid JSON ({exc.msg}); allowed: one object per line"
    except RecursionError:
        return NESTED_TOO_DEEPLY
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
