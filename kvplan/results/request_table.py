"""The per-request table: one row per generated sequence (an n > 1 request gives n rows, `sample` 0..n-1), as
whoever served a trace records it - the simulator's replicas, the live engine's replay, an endpoint's load
generator - and its derived latency columns (TTFT, TPOT, worst inter-token gap, E2E latency, queueing delay), as a
client sees them, with the engine's own TTFT, TPOT and E2E beside them (`*_engine_ms`)."""

from __future__ import annotations

import struct
from typing import Final

import numpy as np
import pandas as pd

RAW_COLUMNS: Final = ("request", "sample", "replica", "arrival_s", "first_scheduled_s", "first_token_s",
                      "finish_s", "prompt_tokens", "output_tokens", "cached_prompt_tokens", "preemptions", "itl_max_s")
_INT_COLUMNS: Final = {"request", "sample", "replica", "prompt_tokens", "output_tokens", "cached_prompt_tokens",
                       "preemptions"}
# One finished sequence's record, packed (8 bytes per cell: int64 for the int columns, float64 for the others)
_RECORD: Final = struct.Struct("<" + "".join("q" if name in _INT_COLUMNS else "d" for name in RAW_COLUMNS))
_RECORD_DTYPE: Final = np.dtype([(name, "<i8" if name in _INT_COLUMNS else "<f8") for name in RAW_COLUMNS])


class RequestLog:
    """Finished sequences, one packed record each (`RAW_COLUMNS` in order, 8 bytes per cell) in one growing
    buffer: one call per sequence, where a column per array took one per cell (a million-request run adds a
    million)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def add(self, *values: object) -> None:
        """Record one sequence: its `RAW_COLUMNS` values in order (ints for the int columns)."""
        self.data += _RECORD.pack(*values)

    def extend(self, other: RequestLog) -> None:
        self.data += other.data

    def renumber_requests(self, names: list[int]) -> None:
        """Record r's request becomes names[r] (a replica's share of a trace, numbered as the whole trace), in
        place."""
        records = np.frombuffer(self.data, dtype=_RECORD_DTYPE)  # a writable view of the buffer
        records["request"] = np.asarray(names, dtype=np.int64)[records["request"]]
        del records  # (the buffer can grow again)

    def __len__(self) -> int:
        return len(self.data) // _RECORD.size

    def raw_columns(self, request_ids: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The recorded columns (`RAW_COLUMNS`), ordered by (request, sample), each an array of its own; with
        `request_ids` (by request), a `request_id` column first."""
        records = np.frombuffer(self.data, dtype=_RECORD_DTYPE)  # a view: each column's take copies it
        order = np.lexsort((records["sample"], records["request"]))  # stable, as the records' own order
        columns = {name: records[name][order] for name in RAW_COLUMNS}
        del records  # (the buffer can grow again)
        if request_ids is None:
            return columns
        return {"request_id": np.asarray(request_ids)[columns["request"]], **columns}

    def raw_frame(self) -> pd.DataFrame:
        """The recorded columns (`RAW_COLUMNS`), ordered by (request, sample), without the derived ones."""
        return pd.DataFrame(self.raw_columns(), copy=False)

    def to_frame(self, request_ids: np.ndarray | None = None) -> pd.DataFrame:
        """The per-request table, ordered by (request, sample), with the derived latency columns."""
        return pd.DataFrame(latency_columns(self.raw_columns(request_ids)), copy=False)


# The engine-internal view beside the client's (`sim.frontend`): where no API server stands in front (a live
# engine's replay, the LLM class), the engine's times are the client's; a black-box endpoint's are unknown (NaN).
ENGINE_TIME_COLUMNS: Final = ("engine_arrival_s", "first_token_engine_s", "finish_engine_s")
ENGINE_LATENCY_COLUMNS: Final = ("ttft_engine_ms", "tpot_engine_ms", "e2el_engine_ms")


def _ttft_tpot_e2el(out: np.ndarray, arrival: np.ndarray, first: np.ndarray, finish: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ttft = first - arrival
    e2el = finish - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2el - ttft) / np.maximum(out - 1, 1), np.nan)
    return ttft, tpot, e2el


def latency_columns(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`columns` (a table's, with `itl_max_s`) without `itl_max_s`, followed by TTFT, TPOT (mean gap after the
    first token, vLLM's definition), worst inter-token gap, E2E latency and queueing delay, as a client sees them,
    and the engine's own TTFT, TPOT and E2E (`ENGINE_LATENCY_COLUMNS`) from the engine's timestamps where the
    columns have them (`ENGINE_TIME_COLUMNS`), else equal to the client's. Arrays in, arrays out: one table is
    made of them once (a frame's column inserts each copied its blocks)."""
    out = columns["output_tokens"]
    arrival = columns["arrival_s"]
    ttft, tpot, e2el = _ttft_tpot_e2el(out, arrival, columns["first_token_s"], columns["finish_s"])
    derived = {name: values for name, values in columns.items() if name != "itl_max_s"}
    derived.update(ttft_ms=ttft * 1e3, tpot_ms=tpot * 1e3, itl_max_ms=np.where(out > 1, columns["itl_max_s"] * 1e3,
                                                                                 np.nan),
                   e2el_ms=e2el * 1e3, queueing_ms=(columns["first_scheduled_s"] - arrival) * 1e3)
    if all(c in columns for c in ENGINE_TIME_COLUMNS):
        ttft, tpot, e2el = _ttft_tpot_e2el(out, *(columns[c] for c in ENGINE_TIME_COLUMNS))
    derived.update(ttft_engine_ms=ttft * 1e3, tpot_engine_ms=tpot * 1e3, e2el_engine_ms=e2el * 1e3)
    return derived


def add_latency_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame (with `itl_max_s`) with its derived latency columns (`latency_columns`) instead."""
    return pd.DataFrame(latency_columns({name: frame[name].to_numpy() for name in frame.columns}))
