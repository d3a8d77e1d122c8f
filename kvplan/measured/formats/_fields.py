"""Reading a benchmark tool's parsed result document by key path, for the format readers.

Every reader needs the same three things: a value at a key path (`input_config.phases[0].rate`) that is either
required - its absence is one `UserError` line "<source>: <what>: missing <path>; <expected>" - or optional
(None); numbers that are numbers (not booleans or strings; `strict_json` already refuses NaN); and a tool's
table of percentiles turned into the record's keys in seconds. A sibling file the tool wrote next to the one the
user named (per-request records, the run's config) is read here too, bounded, with the same one-line errors.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from kvplan import strict_json
from kvplan.errors import UserError

Key = str | int

# A sibling file is parsed whole (the per-request JSON array) or a line at a time (JSON lines). 256 MiB of JSON
# is ~30,000 inference-perf requests with their streamed chunks, ~80,000 AIPerf records, and takes a few GiB of
# memory to parse at once: more than any run a planner compares against, less than the 24 GiB machine holds.
MAX_SIBLING_BYTES = 256 * 2**20
MAX_LINE_BYTES = 16 * 2**20  # one JSON-lines record: an AIPerf record with 100,000 chunk gaps is ~2 MB


def key_path(keys: tuple[Key, ...]) -> str:
    """`("input_config", "phases", 0, "rate")` -> "input_config.phases[0].rate"; `()` -> "the document"."""
    if not keys:
        return "the document"
    out = ""
    for key in keys:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else key)
    return out


@dataclass(slots=True)
class Fields:
    """Required and optional values of one document. `source` names it in messages (a path, or `path:line`),
    `what` the kind of document ("AIPerf export"), `expected` what a complete one is (said after a missing field)."""

    source: str
    what: str
    expected: str

    def fail(self, problem: str) -> UserError:
        return UserError(f"{self.source}: {self.what}: {problem}")

    def get(self, doc: object, *keys: Key, required: bool = True) -> object:
        """The value at `keys` under `doc`; a JSON null counts as absent (tools write null for "not measured")."""
        node = doc
        for depth, key in enumerate(keys):
            if isinstance(key, int):
                present = isinstance(node, list) and 0 <= key < len(node)
            else:
                present = isinstance(node, dict) and key in node
            value = node[key] if present else None  # type: ignore[index]
            if value is None:
                if required:
                    raise self.fail(f"missing {key_path(keys[:depth + 1])}; {self.expected}")
                return None
            node = value
        return node

    def mapping(self, doc: object, *keys: Key, required: bool = True) -> dict | None:
        value = self.get(doc, *keys, required=required)
        if value is not None and not isinstance(value, dict):
            raise self.fail(f"{key_path(keys)} is {strict_json.short(value)}; allowed: an object")
        return value

    def items(self, doc: object, *keys: Key, required: bool = True) -> list | None:
        value = self.get(doc, *keys, required=required)
        if value is not None and not isinstance(value, list):
            raise self.fail(f"{key_path(keys)} is {strict_json.short(value)}; allowed: a list")
        return value

    def number(self, doc: object, *keys: Key, required: bool = True, low: float = 0.0) -> float | None:
        """A finite number >= `low` (every time, count and rate a tool writes is one)."""
        value = self.get(doc, *keys, required=required)
        if value is None:
            return None
        number = math.nan
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value) if abs(value) < 2**1023 else math.inf  # float(10**400) would raise
        if not math.isfinite(number) or number < low:
            raise self.fail(f"{key_path(keys)} is {strict_json.short(value)}; allowed: a number >= {low:g}")
        return number

    def count(self, doc: object, *keys: Key, required: bool = True, low: int = 0,
              high: int | None = None) -> int | None:
        """A whole number in [low, high] (tools write counts as 16 or 16.0, nanosecond clocks as exact integers;
        `low` 1 for a number of streams or a concurrency cap)."""
        value = self.get(doc, *keys, required=required)
        if value is None:
            return None
        number = None
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, float) and value.is_integer():
            number = int(value)
        if number is None or number < low or (high is not None and number > high):
            bound = f" <= {high}" if high is not None else ""
            raise self.fail(f"{key_path(keys)} is {strict_json.short(value)}; allowed: a whole number >= {low}{bound}")
        return number

    def text(self, doc: object, *keys: Key, required: bool = True) -> str | None:
        value = self.get(doc, *keys, required=required)
        if value is not None and not isinstance(value, str):
            raise self.fail(f"{key_path(keys)} is {strict_json.short(value)}; allowed: a string")
        return value

    def figures(self, doc: object, keys: tuple[Key, ...], names: Mapping[str, str], scale: float,
                required: bool = True) -> dict[str, float]:
        """The tool's figures of one metric at `keys` as the record keeps them: `names` maps the tool's key
        ("p50", "median", "avg") to the record's ("50", "mean"), each value times `scale` (to seconds). A tool
        writes only the percentiles it was configured for: the ones it lacks are left out, never made up."""
        table = self.mapping(doc, *keys, required=required)
        if table is None:
            return {}
        return {ours: value * scale for theirs, ours in names.items()
                if (value := self.number(doc, *keys, theirs, required=False)) is not None}


def sibling(source: str, name: str) -> Path | None:
    """The file `name` in the folder of `source` (the file the user named), if it is a regular file there."""
    path = Path(source).parent / name
    return path if path.is_file() else None


def _read_bounded(path: Path, what: str) -> bytes:
    try:
        size = path.stat().st_size
        if size > MAX_SIBLING_BYTES:
            raise UserError(f"{path}: {what}: {size} bytes; allowed: at most {MAX_SIBLING_BYTES}")
        return path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: {what}: cannot read: {exc.strerror or exc}") from None


def read_json(path: Path, what: str) -> object:
    """A sibling JSON document, parsed strictly (`strict_json.loads`) and bounded (MAX_SIBLING_BYTES)."""
    try:
        return strict_json.loads(_read_bounded(path, what))
    except UserError as exc:
        if str(exc).startswith(f"{path}:"):
            raise
        raise UserError(f"{path}: {what}: {exc}") from None


def read_json_lines(path: Path, what: str) -> Iterator[tuple[int, object]]:
    """(line number, parsed object) of each non-blank line of a sibling JSON-lines file, read a line at a time
    (MAX_LINE_BYTES a line, MAX_SIBLING_BYTES in all) so that a big run never sits in memory as text."""
    total = 0
    try:
        with path.open("rb") as lines:
            for number, line in enumerate(iter(lambda: lines.readline(MAX_LINE_BYTES + 1), b""), start=1):
                total += len(line)
                if len(line) > MAX_LINE_BYTES or total > MAX_SIBLING_BYTES:
                    raise UserError(f"{path}:{number}: {what}: more than "
                                    f"{MAX_LINE_BYTES if len(line) > MAX_LINE_BYTES else MAX_SIBLING_BYTES} bytes; "
                                    f"allowed: at most {MAX_LINE_BYTES} a line, {MAX_SIBLING_BYTES} in all")
                if not line.strip():
                    continue
                try:
                    yield number, strict_json.loads(line)
                except UserError as exc:
                    raise UserError(f"{path}:{number}: {what}: {exc}") from None
    except OSError as exc:
        raise UserError(f"{path}: {what}: cannot read: {exc.strerror or exc}") from None
