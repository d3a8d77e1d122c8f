"""Which rows to blame when a trace's timestamps are out of order: the longest run already in order is the trace,
and a row outside it is flagged when it falls behind that run, or jumps ahead of it, by more than the tolerance."""

from __future__ import annotations

import bisect

import numpy as np

from kvplan.traces.loaders.rows import Rows


def check_order(rows: Rows, arrival: np.ndarray, tolerance_s: float) -> None:
    """Flag the rows whose timestamp is out of order by more than the tolerance; the rest is sorted later.

    Which rows are to blame: the longest run of rows already in order (a longest non-decreasing subsequence,
    the earliest rows preferred) is the trace; a row outside it is flagged when it falls more than the
    tolerance behind that run's rows before it, or jumps more than the tolerance ahead of its rows after it.
    So one early outlier (a timestamp far in the future) is the one row blamed, not every row after it.
    """
    ok = rows.ok() & np.isfinite(arrival)
    valid = np.flatnonzero(ok)
    if len(valid) < 2:
        return
    times = arrival[valid]
    latest_before = np.maximum.accumulate(np.concatenate(([times[0]], times[:-1])))
    if not (latest_before - times > tolerance_s).any():  # the usual file: nothing to blame, no search needed
        return
    in_order = earliest_longest_ordered(times)
    before = np.maximum.accumulate(np.where(in_order, times, -np.inf))
    before = np.concatenate(([-np.inf], before[:-1]))
    after = np.minimum.accumulate(np.where(in_order, times, np.inf)[::-1])[::-1]
    after = np.concatenate((after[1:], [np.inf]))
    behind, ahead = before - times, times - after
    late = ~in_order & (behind > tolerance_s)
    early = ~in_order & ~late & (ahead > tolerance_s)
    lag = dict(zip(valid.tolist(), behind.tolist(), strict=True))
    lead = dict(zip(valid.tolist(), ahead.tolist(), strict=True))
    allowed = f"allowed: at most {tolerance_s:g} s (--order-tolerance)"
    rows.flag(np.isin(np.arange(len(rows)), valid[late]),
              lambda r: f"timestamp goes backwards by {lag[r]:.6g} s; {allowed}")
    rows.flag(np.isin(np.arange(len(rows)), valid[early]),
              lambda r: f"timestamp jumps {lead[r]:.6g} s ahead of the rows after it; {allowed}")


def earliest_longest_ordered(times: np.ndarray) -> np.ndarray:
    """Mask of a longest non-decreasing subsequence of `times`, the lexicographically earliest one.

    longest[i] = the longest such run starting at i (patience sorting from the right, O(n log n)); then, left
    to right, take each row that can still start a run of the remaining length."""
    n = len(times)
    longest = np.empty(n, dtype=np.int64)
    tails: list[float] = []  # tails[k]: the largest -time a run of length k + 1 can start with, seen so far
    for i in range(n - 1, -1, -1):
        x = -float(times[i])
        k = bisect.bisect_right(tails, x)
        if k == len(tails):
            tails.append(x)
        else:
            tails[k] = x
        longest[i] = k + 1
    keep = np.zeros(n, dtype=bool)
    need, last = len(tails), -np.inf
    for i in range(n):
        if need and longest[i] == need and times[i] >= last:
            keep[i], need, last = True, need - 1, times[i]
    return keep
