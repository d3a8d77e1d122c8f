"""One loading mechanism, parameterized per format: which reader, which source field feeds which column.

A format is data (a `Format`), plus at most a small `adjust` hook for what is truly format-specific
(BurstGPT's failed requests, Qwen-Bailian's conversation chains).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvplan.errors import listed
from kvplan.limits import MAX_TOKENS
from kvplan.traces.loaders.csv_rows import MissingHeader, read_csv
from kvplan.traces.loaders.finish import finish
from kvplan.traces.loaders.jsonl_rows import read_jsonl
from kvplan.traces.loaders.options import LoadOptions
from kvplan.traces.loaders.rows import Rows
from kvplan.traces.schema import MAX_ARRIVAL_S, LoadReport, Trace, TraceFormatError, short_repr


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
    hashes: str | None = None  # field holding prefix hash lists (optional in every row and every file)
    granularity: int = 0  # tokens per hash (0: read from the `hash_granularity` field)
    # "exact": a row has one hash per (partial) prompt block, ceil(prompt / granularity), as every row of the
    # published Mooncake traces does; "at_most": no more than that (a hash list may cover only a prefix).
    hash_count: str = "at_most"
    timed: bool = True
    adjust: Adjust | None = None
    extra_required: tuple[str, ...] = field(default=())  # identify the format during detection
    optional: tuple[str, ...] = field(default=())  # published columns the loader reads nothing from
    # A failed request (0 output tokens) may have 0 prompt tokens: BurstGPT logs failures that way.
    failed_requests: bool = False
    lora: str | None = None  # field naming each row's LoRA adapter (a string; absent or null: the base model)

    @property
    def required(self) -> list[str]:
        return [f.source for f in self.fields if f.default is None] + list(self.extra_required)

    @property
    def known(self) -> set[str]:
        """Every column the layout defines, required or not."""
        return {f.source for f in self.fields} | set(self.extra_required) | set(self.optional) | (
            {self.hashes} if self.hashes else set()) | ({self.lora} if self.lora else set())

    @property
    def layout(self) -> str:
        optional = [f.source for f in self.fields if f.default is not None] + list(self.optional)
        optional += [self.hashes] if self.hashes else []
        return ",".join(self.required) + (f" (optional: {','.join(optional)})" if optional else "")

    def load(self, path: str | Path, opts: LoadOptions) -> Trace:
        try:
            rows = self.reader(path, opts.decode_errors)
        except MissingHeader as exc:
            raise TraceFormatError(exc.message(f"the {self.name} header {self.layout}")) from None
        rows.require(self.required, self.layout)
        columns = {f.column: parse(rows, f) for f in self.fields}
        if self.failed_requests:
            check_failed_prompts(rows, columns, self.field("prompt_tokens"))
        report = LoadReport(source=str(path), format=self.name)
        self._note_unused(rows, report)
        exclude = self.adjust(rows, columns, opts, report) if self.adjust else None
        hashes, granularity = self._hashes(rows, columns, opts.hash_granularity, report, str(path))
        columns = {k: v for k, v in columns.items() if not k.startswith("_")}
        lora_names: tuple[str, ...] = ()
        if self.lora is not None and self.lora in rows.fields:
            columns["lora"], lora_names = adapter_column(rows, self.lora)
        if not self.timed:
            columns["arrival_s"] = np.zeros(len(rows))
        return finish(rows, columns, opts, report, hashes=hashes, exclude=exclude,
                      hash_granularity=granularity, timed=self.timed, lora_names=lora_names)

    def field(self, column: str) -> Field:
        return next(f for f in self.fields if f.column == column)

    def _note_unused(self, rows: Rows, report: LoadReport) -> None:
        """Fields of the file that this format reads nothing from, named once per file in the load report (shown
        by `trace stats` and `simulate`): never dropped in silence, since a misspelt column (`output_len`) or a
        layout's field kvplan does not model is then visible. CSV: the header's columns; JSONL: every key any
        row has; Parquet: the schema's columns."""
        unused = [name for name in rows.header if name not in self.known]
        if unused:
            names = listed(short_repr(name, 40) for name in unused)
            report.notes.append(f"ignored {len(unused)} field{'s' if len(unused) > 1 else ''} the {self.name} "
                                f"layout does not read: {names}")

    def _hashes(self, rows: Rows, columns: dict[str, np.ndarray], override: int | None, report: LoadReport,
                path: str) -> tuple[tuple | None, int]:
        """The hash lists and their granularity. An override must agree with the file: a file that states its
        granularity (our own format) takes only that; a layout whose rows carry exactly ceil(prompt / G) hashes
        (Mooncake) keeps that exact check at the override, so a G that makes the counts wrong is refused with
        the G the data implies (16 on a 512-token trace understated reuse 30x, silently); an override the
        counts allow but that differs from the layout's G changes what a hash covers, and the load report says
        so."""
        if self.hashes is None or self.hashes not in rows.fields:
            return None, 0
        flat, counts = rows.hash_lists(self.hashes)
        stated = self.granularity or uniform_granularity(rows, columns.get("_granularity"))
        if override and stated and override != stated and not self.granularity and (counts > 0).any():
            raise TraceFormatError(f"--hash-granularity {override}: {path} states hash_granularity {stated} in its "
                                   f"rows; allowed: {stated}, or no --hash-granularity")
        granularity = override or stated
        if not granularity:  # our own format writes null hashes and granularity 0 for hash-free traces
            rows.flag(counts > 0, f"{self.hashes} given but hash_granularity is missing or 0; allowed: the "
                                  "tokens each hash covers (an integer >= 1), or no hashes")
            return None, 0
        check_hash_counts(rows, counts, columns["prompt_tokens"], granularity, self.hashes,
                          exact=self.hash_count == "exact")
        if override and stated and override != stated:
            report.notes.append(f"--hash-granularity {override}: each of {self.hashes} covers {override} tokens, "
                                f"not the {self.name} layout's {stated}")
        return (flat, counts), granularity


def adapter_column(rows: Rows, name: str) -> tuple[np.ndarray, tuple[str, ...]]:
    """Each row's adapter as an index into the trace's sorted adapter names (k > 0: names[k - 1]; 0: none given,
    the base model); a value that is no non-empty string is a bad row."""
    raw = rows.fields[name]
    given = [v for v in raw if v is not None and not (isinstance(v, float) and np.isnan(v))]
    names = tuple(sorted({v for v in given if isinstance(v, str) and v}))
    index = {n: k + 1 for k, n in enumerate(names)}
    column = np.zeros(len(rows), dtype=np.int64)
    for r, value in enumerate(raw):
        if value is None or value == "" or (isinstance(value, float) and np.isnan(value)):
            continue  # (CSV writes the base model's null as an empty cell)
        if isinstance(value, str) and value:
            column[r] = index[value]
        else:
            rows.flag(np.arange(len(rows)) == r, f"{name} {short_repr(value)}: not an adapter name; allowed: a "
                                                 "non-empty string naming a LoRA adapter, or no value (the base model)")
    return column, names


def check_failed_prompts(rows: Rows, columns: dict[str, np.ndarray], prompt: Field) -> None:
    """Prompt tokens are parsed with a minimum of 0; only a failed request (0 output tokens) may have 0."""
    empty = (columns["prompt_tokens"] == 0) & (columns["output_tokens"] != 0)
    rows.flag(empty, f"{prompt.source} 0 is out of range; allowed: an integer >= 1 (0 only for a failed request, "
                     "one with 0 output tokens)")


def check_hash_counts(rows: Rows, counts: np.ndarray, prompt: np.ndarray, granularity: int, name: str, *,
                      exact: bool) -> None:
    """One hash per `granularity` prompt tokens, the last block partial: ceil(prompt / granularity) hashes
    (exactly, or at most). A file whose counts do not fit is usually one written at another granularity:
    the message says which granularity every row's counts would fit."""
    valid = rows.ok() & (prompt >= 1)  # bad prompts (NaN) are flagged already
    blocks = -(-np.where(valid, prompt, 1).astype(np.int64) // granularity)
    # An empty list is a request without prefix identity, in any format.
    wrong = valid & (counts > 0) & ((counts != blocks) if exact else (counts > blocks))
    if not wrong.any():
        return
    hint = suggest_granularity(counts[valid], prompt[valid], exact)
    rule = "exactly" if exact else "at most"
    rows.flag(wrong, lambda r: f"{counts[r]} {name} for {int(prompt[r])} prompt tokens; at {granularity} tokens "
                               f"per hash allowed: {rule} ceil({int(prompt[r])}/{granularity}) = {blocks[r]}{hint}")


def suggest_granularity(counts: np.ndarray, prompt: np.ndarray, exact: bool) -> str:
    """The granularity (a power of two where one fits) that makes every row's hash count right, as advice."""
    # ceil(p / g) == k  <=>  ceil(p / k) <= g <= floor((p - 1) / (k - 1))  (no upper bound when k == 1);
    # ceil(p / g) >= k needs only the upper bound.
    with_hashes = counts > 0
    if not with_hashes.any():
        return ""
    k, p = counts[with_hashes].astype(np.int64), prompt[with_hashes].astype(np.int64)
    low = int((-(-p // k)).max()) if exact else 1
    several = k > 1
    high = int(((p[several] - 1) // (k[several] - 1)).min()) if several.any() else 1 << 20
    if low > high:
        return "; no single granularity fits every row's count"
    powers = [1 << i for i in range(21) if low <= 1 << i <= high]
    best = powers[-1] if powers else high
    return f"; this file's counts fit {best}-token hashes (--hash-granularity {best})"


# Upper bounds per Trace column, so that nothing wraps or rounds silently on the way to int64 and float64: token
# counts beyond any model's context (1e30 would wrap to a negative int64), ids beyond 2^53 (two ids above it can
# read as the same float64), arrivals beyond 1e10 s (~300 years; past that float64 seconds lose microseconds,
# and at 1e27 every TTFT rounds to 0).
EXACT_IDS = 2**53 - 1
MAXIMA = {"prompt_tokens": (MAX_TOKENS, "longer than any model's context"),
          "output_tokens": (MAX_TOKENS, "longer than any model's context"),
          "request_id": (EXACT_IDS, "ids are exact only up to 2^53"),
          "session_id": (EXACT_IDS, "ids are exact only up to 2^53"),
          "_parent": (EXACT_IDS, "ids are exact only up to 2^53"),
          "turn": (EXACT_IDS, "ids are exact only up to 2^53"),
          "priority": (EXACT_IDS, "exact only up to 2^53"),
          "n": (1024, "parallel samples of one request"),
          "arrival_s": (MAX_ARRIVAL_S, "float64 seconds keep microseconds only up to there")}


def parse(rows: Rows, f: Field) -> np.ndarray:
    if f.kind == "datetime":
        return rows.datetime(f.source)
    if f.kind == "label":
        return rows.label(f.source, missing_value=int(f.default if f.default is not None else -1))
    values = rows.number(f.source, integer=f.integer, minimum=f.minimum, default=f.default)
    values = values / f.per_second if f.per_second != 1.0 else values
    if f.column in MAXIMA:
        limit, why = MAXIMA[f.column]
        with np.errstate(invalid="ignore"):
            too_large = rows.ok() & (np.abs(values) > limit)
        raw = rows.fields.get(f.source)
        shown = limit * f.per_second
        shown = f"{int(shown)}" if float(shown).is_integer() and shown < 1e16 else f"{shown:g}"
        rows.flag(too_large, lambda r: f"{f.source} {_short_value(raw[r])} is out of range; allowed: at most "
                                       f"{shown} ({why})")
    return values


def _short_value(value: object) -> str:
    text = str(value)
    return text if len(text) <= 40 else text[:40] + "..."


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
