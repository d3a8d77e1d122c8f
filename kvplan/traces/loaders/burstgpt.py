"""BurstGPT CSV: `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`; release 3 adds
`Session ID` and `Elapsed time`, and excerpts circulate without `Log Type` or `Total tokens`.

A failed request has 0 response tokens, and usually 0 request tokens too (17 of the first 400 rows of
BurstGPT_1). Failed requests are dropped unless `keep_failed`, and the report says how many either way.
"""

from __future__ import annotations

import numpy as np

from kvplan.traces.loaders.options import LoadOptions
from kvplan.traces.loaders.rows import Rows
from kvplan.traces.loaders.spec import Field, csv_format
from kvplan.traces.schema import NO_VALUE, LoadReport


def _failed(rows: Rows, columns: dict[str, np.ndarray], opts: LoadOptions, report: LoadReport) -> np.ndarray:
    failed = (columns["output_tokens"] == 0) & rows.ok()
    if opts.keep_failed:
        report.kept_failed = int(np.count_nonzero(failed))
        return np.zeros(len(rows), dtype=bool)
    report.dropped_failed = int(np.count_nonzero(failed))
    return failed


BURSTGPT = csv_format(
    "burstgpt",
    (Field("arrival_s", "Timestamp", integer=False),
     Field("prompt_tokens", "Request tokens", minimum=0),
     Field("output_tokens", "Response tokens"),
     Field("session_id", "Session ID", default=NO_VALUE, kind="label")),
    "BurstGPT CSV (releases 1-3; failed requests dropped unless --keep-failed)",
    adjust=_failed, extra_required=("Model",), optional=("Total tokens", "Log Type", "Elapsed time"),
    failed_requests=True,
)
