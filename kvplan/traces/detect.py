"""Choosing a loader: by name, or from the file's (decompressed) content: Parquet magic, the first JSON
object's keys, or the CSV header.

Detection picks the most specific format whose required fields all appear. When another format would explain
more of the file's fields than that one (a Qwen-Bailian file missing its `type` column still loads as
Mooncake, with timestamps 1000x off), the choice is ambiguous and is refused, naming both and `--format`.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvplan.traces.compression import open_binary
from kvplan.traces.loaders import FORMATS, Format
from kvplan.traces.loaders.csv_rows import MissingHeader, check_header, is_value
from kvplan.traces.loaders.jsonl_rows import NESTED_TOO_DEEPLY
from kvplan.traces.loaders.native import parquet_source
from kvplan.traces.schema import TraceFormatError, short_repr

PARQUET_MAGIC = b"PAR1"


def choose_format(path: str | Path, name: str | None = None) -> Format:
    if name is not None:
        if name not in FORMATS:
            raise TraceFormatError(f"unknown trace format {short_repr(name)}; allowed: {', '.join(FORMATS)}")
        fmt = FORMATS[name]
        kind = _kind(Path(path))
        if kind != fmt.kind:
            raise TraceFormatError(f"{path}: format {name} reads {fmt.kind.upper()}, but this file is "
                                   f"{kind.upper()}; allowed: a {fmt.kind.upper()} file, or another --format")
        return fmt
    return detect(path)


def _kind(path: Path) -> str:
    with open_binary(path, text=False) as f:
        if f.read(4) == PARQUET_MAGIC:
            return "parquet"
    with open_binary(path) as f:
        raw = next((line for line in f if line.strip()), b"")
    return "jsonl" if raw.lstrip().startswith(b"{") else "csv"


def detect(path: str | Path) -> Format:
    kind, keys = _sniff(Path(path))
    same_kind = [f for f in FORMATS.values() if f.kind == kind]
    candidates = [f for f in same_kind if set(f.required) <= keys]
    if not candidates:
        if not keys - {""}:
            raise TraceFormatError(f"{path}: empty (no header line); allowed: a trace whose first line names its "
                                   f"columns, in one of the layouts {', '.join(f.name for f in same_kind)}")
        near = sorted(same_kind, key=lambda f: -len(keys & f.known))  # the nearest layout first
        raise TraceFormatError(f"{path}:1: cannot tell the trace format from fields {short_repr(sorted(keys), 40)}; "
                               f"allowed: a layout's columns ({_layouts(near)}), or --format")
    best = max(candidates, key=lambda f: len(f.required))
    explained = len(keys & best.known)
    for other in same_kind:
        if other not in candidates and len(keys & other.known) > explained:
            missing = ", ".join(short_repr(n) for n in other.required if n not in keys)
            ignored = ", ".join(short_repr(n) for n in sorted(keys - best.known)[:8])
            raise TraceFormatError(f"{path}:1: ambiguous trace format: its fields look like {other.name} but lack "
                                   f"{missing}; as {best.name} its {ignored} would be ignored; allowed: --format "
                                   f"{other.name} (after adding {missing}) or --format {best.name}")
    return best


def _layouts(formats: list[Format]) -> str:
    """The first layout's columns and the others' names: all their columns would make a 700-character line."""
    first, *others = formats
    return f"{first.name}: {','.join(first.required)}; or {', '.join(f.name for f in others)}"


def _sniff(path: Path) -> tuple[str, set[str]]:
    with open_binary(path, text=False) as f:
        magic = f.read(4)
    if magic == PARQUET_MAGIC:
        import pyarrow.parquet as pq

        return "parquet", set(pq.read_schema(parquet_source(path)).names)
    with open_binary(path) as f:  # the first line alone: a bad byte further on is the loader's to report
        raw = next((line for line in f if line.strip()), b"")
    first = raw.decode("utf-8-sig")  # not UTF-8: the loader names the line (traces.load)
    if first.lstrip().startswith("{"):
        try:
            return "jsonl", set(json.loads(first))
        except json.JSONDecodeError as exc:
            raise TraceFormatError(f"{path}:1: first line is not a JSON object ({exc.msg})") from exc
        except RecursionError:
            raise TraceFormatError(f"{path}:1: first line is {NESTED_TOO_DEEPLY}") from None
    header = [h.strip() for h in first.rstrip("\r\n").split(",")]
    csv_formats = [f for f in FORMATS.values() if f.kind == "csv"]
    try:
        check_header(str(path), header)
        # A line with numbers or dates among its fields (`5,ChatGPT,472,18`) that names no layout's columns is a
        # data row too: saying "cannot tell the format from fields ['5', ...]" would call values fields.
        if any(is_value(h) for h in header) and not any(set(f.required) <= set(header) for f in csv_formats):
            raise MissingHeader(str(path), ",".join(header)[:80])
    except MissingHeader as exc:
        raise TraceFormatError(exc.message(f"a header line naming the columns of a layout ({_layouts(csv_formats)})"))\
            from None
    return "csv", set(header)
