"""Our interchange formats: the Request record as JSONL, CSV or Parquet, read back by `traces.load`.

Rendering returns bytes; the caller writes them (atomically, through `kvplan.output.write_atomic`), so a
crash never leaves half a trace behind.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from kvplan.errors import UserError
from kvplan.traces.schema import NO_VALUE, Trace

KINDS = ("jsonl", "csv", "parquet")
MOONCAKE_GRANULARITY = 512
AZURE_START = datetime(2023, 11, 16, 18, 15, 46, tzinfo=UTC)  # the first request of the 2023 conv trace
AZURE_START_TICKS = int(AZURE_START.timestamp()) * 10**7


def kind_of(path: str | Path, kind: str | None = None) -> str:
    """The output kind: named, or from the file extension."""
    kind = kind or Path(path).suffix.lstrip(".").lower()
    if kind not in KINDS:
        raise UserError(f"{path}: cannot tell the output format from the extension; allowed: "
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
    if trace.lora is not None:  # the adapter's name, null for the base model
        frame["lora"] = [trace.lora_of(i) for i in range(len(trace))]
    if trace.has_prefix:
        lists = np.split(trace.hash_ids, trace.hash_offsets[1:-1]) if len(trace) else []
        frame["prefix_hashes"] = [" ".join(map(str, h.tolist())) for h in lists] if hashes_as_text else lists
    return frame


def render_layout(trace: Trace, layout: str) -> bytes:
    """The trace in a public layout that its loader reads back: "mooncake" (512-token hash_ids required) or
    "azure" (2023 wall-clock strings from AZURE_START). Lossy: other columns are dropped."""
    if layout == "mooncake":
        if trace.hash_granularity != MOONCAKE_GRANULARITY:
            raise UserError(f"the Mooncake layout holds {MOONCAKE_GRANULARITY}-token hash_ids; this trace "
                             f"has granularity {trace.hash_granularity or 'none'}")
        millis = np.rint(trace.arrival_s * 1000).astype(np.int64).tolist()
        lines = [json.dumps({"timestamp": millis[i], "input_length": int(trace.prompt_tokens[i]),
                             "output_length": int(trace.output_tokens[i]),
                             "hash_ids": trace.hashes_of(i).tolist()}) for i in range(len(trace))]
        return "".join(line + "\n" for line in lines).encode()
    if layout == "azure":
        # 100 ns resolution, printed with 7 fractional digits as the 2023 release does.
        ticks = np.rint(trace.arrival_s * 1e7).astype(np.int64) + AZURE_START_TICKS
        stamps = [f"{_wall_clock(t // 10**7)}.{t % 10**7:07d}" for t in ticks.tolist()]
        frame = pd.DataFrame({"TIMESTAMP": stamps, "ContextTokens": trace.prompt_tokens,
                              "GeneratedTokens": trace.output_tokens})
        return frame.to_csv(index=False).encode()
    raise UserError(f"unknown layout {layout!r}; allowed: mooncake, azure")


def _wall_clock(epoch_s: int) -> str:
    return datetime.fromtimestamp(epoch_s, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _jsonl(trace: Trace) -> str:
    lines = []
    for r in trace.records():
        obj = {"request_id": int(r.request_id), "arrival_s": r.arrival_s, "prompt_tokens": r.prompt_tokens,
               "output_tokens": r.output_tokens, "session_id": r.session_id, "turn": r.turn,
               "priority": r.priority, "n": r.n, "hash_granularity": r.hash_granularity,
               "prefix_hashes": None if r.prefix_hashes is None else list(r.prefix_hashes)}
        if r.lora is not None:  # absent: the base model
            obj["lora"] = r.lora
        lines.append(json.dumps(obj, separators=(",", ":")))
    return "".join(line + "\n" for line in lines)
