"""The end of every load: validated columns become a `Trace`, sorted by arrival, after the checks that need all
rows (arrival order, unique request ids); the first bad row stops the load, or with `skip_bad` the bad rows are
dropped and counted."""

from __future__ import annotations

import numpy as np

from kvplan.traces.loaders.arrival_order import check_order
from kvplan.traces.loaders.options import LoadOptions
from kvplan.traces.loaders.rows import Rows
from kvplan.traces.schema import LoadReport, Trace, TraceFormatError, gather_segments, offsets_from_counts

SHOWN_BAD_LINES = 5


def finish(rows: Rows, columns: dict[str, np.ndarray], opts: LoadOptions, report: LoadReport, *,
           hashes: tuple[np.ndarray, np.ndarray] | None = None, exclude: np.ndarray | None = None,
           **trace_args: object) -> Trace:
    """Check arrival order, then raise on the first bad row or drop the bad rows, and build the sorted Trace.

    `exclude` marks rows the format itself leaves out (already counted in `report`); they are not checked.
    """
    if exclude is not None:
        rows.flag(exclude, "excluded")
    check_order(rows, columns["arrival_s"], opts.order_tolerance_s)
    if "request_id" in columns:
        _check_unique(rows, columns["request_id"])
    ok = rows.ok()
    excluded = np.zeros(len(rows), dtype=bool) if exclude is None else exclude
    if not (ok | excluded).all():
        bad_rows = np.flatnonzero(~ok & ~excluded)
        if not opts.skip_bad:
            first = int(bad_rows[0])
            raise TraceFormatError(f"{rows.path}:{rows.line[first]}: {rows.problems[first]}")
        report.dropped_bad += len(bad_rows)
        report.bad_lines = [int(rows.line[r]) for r in bad_rows[:SHOWN_BAD_LINES]]
    kept = {name: values[ok] for name, values in columns.items()}
    arrival = kept["arrival_s"]
    report.reordered = int(np.count_nonzero(arrival[1:] < np.maximum.accumulate(arrival)[:-1]))
    order = np.argsort(arrival, kind="stable")
    kept = {name: values[order] for name, values in kept.items()}
    if len(order) and trace_args.get("timed", True):
        kept["arrival_s"] = kept["arrival_s"] - kept["arrival_s"][0]
    source_index = np.flatnonzero(ok)[order]
    kept.setdefault("request_id", source_index)  # the source row: a stable id under any transform
    kept["source_line"] = rows.line[source_index]
    if hashes is not None:
        flat, counts = hashes
        offsets = offsets_from_counts(counts)
        if np.array_equal(source_index, np.arange(len(rows))):
            # Every row kept, already in order (the usual file): the ids are in place. Gathering would only
            # copy them, with several id-sized temporaries (a million-request trace holds tens of millions).
            kept["hash_ids"], kept["hash_offsets"] = flat, offsets
        else:
            kept["hash_ids"], kept["hash_offsets"] = gather_segments(flat, offsets, source_index)
    return Trace.build(**kept, report=report, **trace_args)


def _check_unique(rows: Rows, ids: np.ndarray) -> None:
    """Flag each row whose request id an earlier valid row already has (the first keeps it)."""
    valid = np.flatnonzero(rows.ok())
    _, first = np.unique(ids[valid], return_index=True)
    repeated = np.setdiff1d(valid, valid[first])
    if len(repeated):
        line_of = {float(ids[r]): int(rows.line[r]) for r in valid[first]}
        rows.flag(np.isin(np.arange(len(rows)), repeated),
                  lambda r: f"request_id {ids[r]:.0f} repeats the id of line {line_of[float(ids[r])]}; allowed: "
                            "unique ids")
