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

    def raw_frame(self) -> pd.DataFrame:
        """The recorded columns (`RAW_COLUMNS`), ordered by (request, sample), without the derived ones."""
        records = np.frombuffer(self.data, dtype=_RECORD_DTYPE)  # a view: the frame copies it (one copy at the peak)
        frame = pd.DataFrame({name: records[name] for name in RAW_COLUMNS}, copy=True)
        del records  # (the buffer can grow again)
        return frame.sort_values(["request", "sample"], kind="stable").reset_index(drop=True)

    def to_frame(self, request_ids: np.ndarray | None = None) -> pd.DataFrame:
        """The per-request table, ordered by (request, sample), with the derived latency columns."""
        frame = self.raw_frame()
        if request_ids is not None:
            frame.insert(0, "request_id", np.asarray(request_ids)[frame["request"].to_numpy()])
        return add_latency_columns(frame)


# The engine-internal view beside the client's (`sim.frontend`): where no API server stands in front (a live
# engine's replay, the LLM class), the engine's times are the client's; a black-box endpoint's are unknown (NaN).
ENGINE_TIME_COLUMNS: Final = ("engine_arrival_s", "first_token_engine_s", "finish_engine_s")
ENGINE_LATENCY_COLUMNS: Final = ("ttft_engine_ms", "tpot_engine_ms", "e2el_engine_ms")


def _ttft_tpot_e2el(out: np.ndarray, arrival: pd.Series, first: pd.Series, finish: pd.Series
                    ) -> tuple[pd.Series, np.ndarray, pd.Series]:
    ttft = first - arrival
    e2el = finish - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2el - ttft) / np.maximum(out - 1, 1), np.nan)
    return ttft, tpot, e2el


def add_latency_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """TTFT, TPOT (mean gap after the first token, vLLM's definition), E2E latency and queueing delay, as a client
    sees them, and the engine's own TTFT, TPOT and E2E (`ENGINE_LATENCY_COLUMNS`) from the engine's timestamps
    where the frame has them (`ENGINE_TIME_COLUMNS`), else equal to the client's."""
    out = frame["output_tokens"].to_numpy()
    ttft, tpot, e2el = _ttft_tpot_e2el(out, frame["arrival_s"], frame["first_token_s"], frame["finish_s"])
    frame["ttft_ms"] = ttft * 1e3
    frame["tpot_ms"] = tpot * 1e3
    frame["itl_max_ms"] = np.where(out > 1, frame["itl_max_s"] * 1e3, np.nan)
    frame["e2el_ms"] = e2el * 1e3
    frame["queueing_ms"] = (frame["first_scheduled_s"] - frame["arrival_s"]) * 1e3
    if all(c in frame for c in ENGINE_TIME_COLUMNS):
        ttft, tpot, e2el = _ttft_tpot_e2el(out, *(frame[c] for c in ENGINE_TIME_COLUMNS))
    frame["ttft_engine_ms"] = ttft * 1e3
    frame["tpot_engine_ms"] = tpot * 1e3
    frame["e2el_engine_ms"] = e2el * 1e3
    return frame.drop(columns=["itl_max_s"])
