"""Request records, loaders for public trace formats, transforms and synthetic workloads.

`load(path)` reads any supported trace into the columnar `Trace`; `Trace.records()` yields `RequestRecord`s.
"""

from __future__ import annotations

from pathlib import Path

from traces.detect import choose_format
from traces.loaders import FORMATS, LoadOptions
from traces.schema import LoadReport, RequestRecord, Trace, TraceFormatError


def load(path: str | Path, format: str | None = None, skip_bad: bool = False, *,
         order_tolerance_s: float = 1.0, keep_failed: bool = False) -> Trace:
    """Load a trace file; the format is detected from the content unless named (see `FORMATS`)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such trace file")
    opts = LoadOptions(skip_bad=skip_bad, order_tolerance_s=order_tolerance_s, keep_failed=keep_failed)
    return choose_format(path, format).load(path, opts)


__all__ = ["FORMATS", "LoadReport", "RequestRecord", "Trace", "TraceFormatError", "load"]
