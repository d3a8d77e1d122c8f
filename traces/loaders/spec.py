"""One loading mechanism, parameterized per format: which reader, which source field feeds which column.

A format is data (a `Format`), plus at most a small `adjust` hook for what is truly format-specific
(BurstGPT's failed requests, Qwen-Bailian's conversation chains).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from traces.loaders.rows import LoadOptions, Rows, finish, read_csv, read_jsonl
from traces.schema import LoadReport, Trace


@dataclass(slots=True, frozen=True)
class Field:
    column: str  # Trace column: arrival_s, prompt_tokens, output_tokens, request_id, session_id, turn, ...
    source: str  # the field's name in the file
    per_second: float = 1.0  # source units per second (Mooncake: 1000, milliseconds)
    integer: bool = True
    minimum: float | None = 0
    default: float | None = None  # None: the field is required in every row
    kind: str = "number"  # "number", "datetime", or "label" (identifiers that may not be numbers)


# Hook: (rows, parsed columns, options, report) -> mask of rows the format leaves out on purpose, or None.
Adjust = Callable[[Rows, dict[str, np.ndarray], LoadOptions, LoadReport], "np.ndarray | None"]


@dataclass(slots=True, frozen=True)
class Format:
    name: str
    kind: str  # file kind for detection: "csv", "jsonl" or "parquet"
    reader: Callable[[str | Path], Rows]
    fields: tuple[Field, ...]
    description: str
    hashes: str | None = None  # field holding prefix hash lists
    granularity: int = 0  # tokens per hash (0: read from the `hash_granularity` field)
    timed: bool = True
    adjust: Adjust | None = None
    extra_required: tuple[str, ...] = field(default=())  # identify the format during detection

    @property
    def required(self) -> list[str]:
        names = [f.source for f in self.fields if f.default is None]
        return names + ([self.hashes] if self.hashes and self.granularity else []) + list(self.extra_required)

    @property
    def layout(self) -> str:
        return ",".join(f.source for f in self.fields) + (f",{self.hashes}" if self.hashes else "")

    def load(self, path: str | Path, opts: LoadOptions) -> Trace:
        rows = self.reader(path)
        rows.require(self.required, self.layout)
        columns = {f.column: parse(rows, f) for f in self.fields}
        report = LoadReport(source=str(path), format=self.name)
        exclude = self.adjust(rows, columns, opts, report) if self.adjust else None
        hashes, granularity = self._hashes(rows, columns)
        columns = {k: v for k, v in columns.items() if not k.startswith("_")}
        if not self.timed:
            columns["arrival_s"] = np.zeros(len(rows))
        return finish(rows, columns, opts, report, hashes=hashes, exclude=exclude,
                      hash_granularity=granularity, timed=self.timed)

    def _hashes(self, rows: Rows, columns: dict[str, np.ndarray]) -> tuple[tuple | None, int]:
        if self.hashes is None or self.hashes not in rows.fields:
            return None, 0
        granularity = self.granularity or uniform_granularity(rows, columns.get("_granularity"))
        if not granularity:  # our own format writes null hashes and granularity 0 for hash-free traces
            return None, 0
        return rows.hash_lists(self.hashes), granularity


def parse(rows: Rows, f: Field) -> np.ndarray:
    if f.kind == "datetime":
        return rows.datetime(f.source)
    if f.kind == "label":
        return rows.label(f.source, missing_value=int(f.default if f.default is not None else -1))
    values = rows.number(f.source, integer=f.integer, minimum=f.minimum, default=f.default)
    return values / f.per_second if f.per_second != 1.0 else values


def uniform_granularity(rows: Rows, per_row: np.ndarray | None) -> int:
    """The one granularity of a trace that states it per row (our own format); rows disagreeing are bad."""
    if per_row is None:
        return 0
    ok = rows.ok() & (per_row > 0)
    if not ok.any():
        return 0
    first = per_row[np.flatnonzero(ok)[0]]
    rows.flag(ok & (per_row != first),
              lambda r: f"hash_granularity {per_row[r]:g} differs from the trace's {first:g}; "
                        "allowed: one value per trace")
    return int(first)


def csv_format(name: str, fields: tuple[Field, ...], description: str, **kwargs: object) -> Format:
    return Format(name, "csv", read_csv, fields, description, **kwargs)


def jsonl_format(name: str, fields: tuple[Field, ...], description: str, **kwargs: object) -> Format:
    return Format(name, "jsonl", read_jsonl, fields, description, **kwargs)
