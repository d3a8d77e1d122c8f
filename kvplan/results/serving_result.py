"""What serving a trace produced, the same whoever served it - the simulator, the live engine or an endpoint:
the per-request table, the time series, the summary and how the run went, plus writing them as a result set's
tables. `kvplan simulate`, `replay`, `validate` and the experiments write exactly these files, so that two runs
compare cell by cell."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvplan.output import json_text, write_atomic
from kvplan.results.rejected import with_rejected


@dataclass(slots=True)
class ServingResult:
    summary: dict
    requests: pd.DataFrame
    series: pd.DataFrame
    info: dict
    token_times: dict[tuple[int, int], list[float]] | None = None  # (row, sample) -> every token's time
    rejected: pd.DataFrame | None = None  # never-served requests as table rows (results.rejected), not in `requests`


def write_tables(result: ServingResult, out: Path, fmt: str) -> None:
    """requests.FMT (never-served requests included: reason, no latencies - a report's request_id is in it),
    series.FMT and summary.json, each written atomically."""
    requests = with_rejected(result.requests, result.rejected)
    for name, frame in (("requests", requests), ("series", result.series)):
        buffer = io.BytesIO()
        if fmt == "parquet":
            # Dictionary pages for the text columns only (ids, phases, reasons repeat): on the float columns,
            # whose values are nearly all distinct, they were most of the writing time and made the file larger
            text = [column for column in frame.columns if not pd.api.types.is_numeric_dtype(frame[column])]
            frame.to_parquet(buffer, index=False, use_dictionary=text)
        else:
            frame.to_csv(buffer, index=False)
        write_atomic(out / f"{name}.{fmt}", buffer.getvalue())
    write_atomic(out / "summary.json", json_text({"summary": result.summary, "info": result.info}))
