"""BurstGPT CSV: `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`, and in release 3
also `Session ID` and `Elapsed time`. A failed request has 0 response tokens: it is dropped unless
`keep_failed`, and the report says how many.
"""

from __future__ import annotations

import numpy as np

from traces.loaders.rows import LoadOptions, Rows
from traces.loaders.spec import Field, csv_format
from traces.schema import NO_VALUE, LoadReport


def _failed(rows: Rows, columns: dict[str, np.ndarray], opts: LoadOptions, report: LoadReport) -> np.ndarray:
    failed = columns["output_tokens"] == 0
    if opts.keep_failed:
        return np.zeros(len(rows), dtype=bool)
    report.dropped_failed = int(np.count_nonzero(failed & rows.ok()))
    return failed


BURSTGPT = csv_format(
    "burstgpt",
    (Field("arrival_s", "Timestamp", integer=False),
     Field("prompt_tokens", "Request tokens", minimum=1),
     Field("output_tokens", "Response tokens"),
     Field("session_id", "Session ID", default=NO_VALUE, kind="label")),
    "BurstGPT CSV (releases 1-3; failed requests dropped unless --keep-failed)",
    adjust=_failed, extra_required=("Model", "Log Type"),
)
