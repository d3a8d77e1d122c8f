"""Requests that were never served (rejected by the scheduler, failed in the trace, failed at an endpoint), in the
terms every report uses: the trace's `request_id` and the file line (`Trace.reference`), and as rows of the
per-request table with their reason and no latencies.

The summary's percentiles never include them (they are computed from the served rows alone); the written table
does, so that a rejection named in a report can be found by its request_id.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvplan.traces import Trace

REASON = "rejected"  # the per-request table's column: why the request was never served ("" when it was)


def references(trace: Trace, rejected: list[tuple[int, str]], limit: int = 3) -> list[str]:
    """The first `limit` rejections as report lines: 'request_id R (file:line): reason'."""
    return [f"{trace.reference(row)}: {why}" for row, why in rejected[:limit]]


def rejected_rows(trace: Trace, rejected: list[tuple[int, str]]) -> pd.DataFrame:
    """One table row per never-served request: its ids, arrival and lengths as the trace has them, NaN where a
    served request has a time, and the reason."""
    rows = np.array([row for row, _ in rejected], dtype=np.int64)
    nan = np.full(len(rows), np.nan)
    zero = np.zeros(len(rows), dtype=np.int64)
    return pd.DataFrame({
        "request_id": trace.request_id[rows], "request": rows, "sample": zero, "replica": zero - 1,
        "arrival_s": trace.arrival_s[rows], "first_scheduled_s": nan, "first_token_s": nan, "finish_s": nan,
        "prompt_tokens": trace.prompt_tokens[rows], "output_tokens": trace.output_tokens[rows],
        "cached_prompt_tokens": zero, "preemptions": zero, "ttft_ms": nan, "tpot_ms": nan, "itl_max_ms": nan,
        "e2el_ms": nan, "queueing_ms": nan, REASON: [why for _, why in rejected]})


def with_rejected(served: pd.DataFrame, rejected: pd.DataFrame | None) -> pd.DataFrame:
    """The per-request table as written: served rows (reason "") and rejected rows, in request order."""
    table = served.assign(**{REASON: ""})
    if rejected is None or not len(rejected):
        return table
    missing = [c for c in table.columns if c not in rejected.columns]
    rejected = rejected.assign(**{c: np.nan for c in missing})[list(table.columns)]
    merged = pd.concat([table, rejected], ignore_index=True)
    return merged.sort_values(["request", "sample"], kind="stable").reset_index(drop=True)
