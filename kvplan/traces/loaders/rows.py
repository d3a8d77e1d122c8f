"""The raw rows of one trace file, with their line numbers, and their validation into columns.

Every loader goes through `Rows`, so every format reports bad input the same way: each bad row keeps its first
problem, and `finish` stops the load at the first one (`path:LINE: problem; allowed: ...`) or, with `skip_bad`,
drops them all and counts them in the trace's `LoadReport` (never silently). The readers that fill `Rows` are
`csv_rows` and `jsonl_rows`.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvplan.traces.schema import TraceFormatError, short_repr


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
        self.flag(bad, lambda r: f"{name} must be a list of integers, got {short_repr(raw[r])}")
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
