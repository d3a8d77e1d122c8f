"""Choosing a loader: by name, or from the file's content (Parquet magic, first JSON object, CSV header)."""

from __future__ import annotations

import json
from pathlib import Path

from traces.loaders import FORMATS, Format
from traces.schema import TraceFormatError

PARQUET_MAGIC = b"PAR1"


def choose_format(path: str | Path, name: str | None = None) -> Format:
    if name is not None:
        if name not in FORMATS:
            raise TraceFormatError(f"unknown trace format {name!r}; allowed: {', '.join(FORMATS)}")
        return FORMATS[name]
    return detect(path)


def detect(path: str | Path) -> Format:
    """The most specific format whose required fields all appear in the first record (or header)."""
    kind, keys = _sniff(Path(path))
    candidates = [f for f in FORMATS.values() if f.kind == kind and set(f.required) <= keys]
    if not candidates:
        allowed = "; ".join(f"{f.name}: {f.layout}" for f in FORMATS.values())
        raise TraceFormatError(f"{path}:1: cannot tell the trace format from fields {sorted(keys)}; "
                               f"pass --format. Allowed: {allowed}")
    return max(candidates, key=lambda f: len(f.required))


def _sniff(path: Path) -> tuple[str, set[str]]:
    with open(path, "rb") as f:
        if f.read(4) == PARQUET_MAGIC:
            import pandas as pd

            return "parquet", set(pd.read_parquet(path).columns)
    with open(path, encoding="utf-8-sig") as f:
        first = next((line for line in f if line.strip()), "")
    if first.lstrip().startswith("{"):
        try:
            return "jsonl", set(json.loads(first))
        except json.JSONDecodeError as exc:
            raise TraceFormatError(f"{path}:1: first line is not a JSON object ({exc.msg})") from exc
    return "csv", {h.strip() for h in first.rstrip("\r\n").split(",")}
