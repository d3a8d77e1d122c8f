"""Inter-token latencies as a multiset of (gap, count) at microsecond resolution: one entry per distinct gap
instead of one per token, so a million requests fit in memory. Filled by every side that serves a trace."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

PENDING_LIMIT = 1 << 12  # gaps held before they are binned (a simulator adds one per decode step; a few
# thousand amortise numpy's per-call cost, and a million-request run keeps dozens of replicas' logs in memory)


class ItlLog:
    """Multiset of inter-token gaps, counted per microsecond: gap -> count. Microsecond bins keep the table small
    on long runs (a bin per distinct float would grow with the number of steps) and lose nothing at the
    millisecond precision the summary reports.

    Gaps are appended to two pending lists and binned in bulk (`_bin`), at most `PENDING_LIMIT` at a time and
    before anything reads the table: a simulator's decode stretch adds one gap per step, and binning each in
    Python (a multiplication, `round` and a dict update) cost more than the rest of stamping the step. numpy's
    `rint` rounds half to even as `round` does, on the same products, so the bins are the ones `round` gives."""

    __slots__ = ("_counts", "_gaps", "_table")

    def __init__(self) -> None:
        self._table: dict[int, int] = {}
        self._gaps: list[float] = []
        self._counts: list[int] = []

    def add(self, seconds: float, count: int = 1) -> None:
        self._gaps.append(seconds)
        self._counts.append(count)
        if len(self._gaps) >= PENDING_LIMIT:
            self._bin()

    def add_many(self, seconds: Iterable[float], counts: Iterable[int]) -> None:
        gaps, pending = self._gaps, self._counts
        gaps.extend(seconds)
        pending.extend(counts)
        if len(gaps) != len(pending):
            raise ValueError(f"{len(gaps)} gaps but {len(pending)} counts")
        if len(gaps) >= PENDING_LIMIT:
            self._bin()

    @property
    def counts(self) -> dict[int, int]:
        """The table: microseconds -> count."""
        if self._gaps:
            self._bin()
        return self._table

    def _bin(self) -> None:
        micros = np.rint(np.array(self._gaps, dtype=np.float64) * 1e6)
        if not np.isfinite(micros).all():
            raise ValueError("an inter-token gap that is not a finite number of seconds")
        keys = micros.astype(np.int64)
        bins, where = np.unique(keys, return_inverse=True)
        sums = np.zeros(len(bins), dtype=np.int64)
        np.add.at(sums, where, np.array(self._counts, dtype=np.int64))
        table = self._table
        for key, count in zip(bins.tolist(), sums.tolist(), strict=True):
            table[key] = table.get(key, 0) + count
        self._gaps, self._counts = [], []

    def merge(self, others: Iterable[ItlLog]) -> ItlLog:
        table = self.counts
        for other in others:
            for key, count in other.counts.items():
                table[key] = table.get(key, 0) + count
        return self

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(sorted gaps in seconds, counts)."""
        counts = self.counts
        keys = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        values = np.fromiter(counts.values(), dtype=np.int64, count=len(counts))
        order = np.argsort(keys, kind="stable")
        return keys[order] / 1e6, values[order]
