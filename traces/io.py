"""Our interchange formats: the Request record as JSONL, CSV or Parquet, read back by `traces.load`.

Rendering returns bytes; the caller writes them (atomically, through `kvplan.output.write_atomic`), so a
crash never leaves half a trace behind.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd

from traces.schema import NO_VALUE, Trace

KINDS = ("jsonl", "csv", "parquet")


def kind_of(path: str | Path, kind: str | None = None) -> str:
    """The output kind: named, or from the file extension."""
    kind = kind or Path(path).suffix.lstrip(".").lower()
    if kind not in KINDS:
        raise ValueError(f"{path}: cannot tell the output format from the extension; allowed: "
                         f"{', '.join('.' + k for k in KINDS)} (or --to)")
    return kind


def render(trace: Trace, kind: str) -> bytes:
    if kind == "jsonl":
        return _jsonl(trace).encode()
    frame = to_frame(trace, hashes_as_text=kind == "csv")
    if kind == "csv":
        buffer = io.StringIO()
        frame.to_csv(buffer, index=False)
        return buffer.getvalue().encode()
    return frame.to_parquet(index=False)


def to_frame(trace: Trace, *, hashes_as_text: bool = False) -> pd.DataFrame:
    """One row per request; absent session/turn as nulls, prefix hashes as lists (or '3 17 42' text)."""
    nullable = {name: pd.array(np.where(values == NO_VALUE, None, values), dtype="Int64")
                for name, values in (("session_id", trace.session_id), ("turn", trace.turn))}
    frame = pd.DataFrame({
        "request_id": trace.request_id, "arrival_s": trace.arrival_s, "prompt_tokens": trace.prompt_tokens,
        "output_tokens": trace.output_tokens, **nullable, "priority": trace.priority, "n": trace.n,
        "hash_granularity": np.full(len(trace), trace.hash_granularity, dtype=np.int64),
    })
    if trace.has_prefix:
        lists = np.split(trace.hash_ids, trace.hash_offsets[1:-1]) if len(trace) else []
        frame["prefix_hashes"] = [" ".join(map(str, h.tolist())) for h in lists] if hashes_as_text else lists
    return frame


def _jsonl(trace: Trace) -> str:
    lines = []
    for r in trace.records():
        obj = {"request_id": int(r.request_id), "arrival_s": r.arrival_s, "prompt_tokens": r.prompt_tokens,
               "output_tokens": r.output_tokens, "session_id": r.session_id, "turn": r.turn,
               "priority": r.priority, "n": r.n, "hash_granularity": r.hash_granularity,
               "prefix_hashes": None if r.prefix_hashes is None else list(r.prefix_hashes)}
        lines.append(json.dumps(obj, separators=(",", ":")))
    return "".join(line + "\n" for line in lines)
