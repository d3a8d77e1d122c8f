"""Inter-token latencies as a multiset of (gap, count) at microsecond resolution: one entry per distinct gap
instead of one per token, so a million requests fit in memory. Filled by every side that serves a trace."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class ItlLog:
    """Multiset of inter-token gaps, counted per microsecond: gap -> count. Microsecond bins keep the table small
    on long runs (a bin per distinct float would grow with the number of steps) and lose nothing at the
    millisecond precision the summary reports."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}

    def add(self, seconds: float, count: int = 1) -> None:
        self.add_many((seconds,), (count,))

    def add_many(self, seconds: Iterable[float], counts: Iterable[int]) -> None:
        table = self.counts
        for gap, count in zip(seconds, counts, strict=True):
            key = round(gap * 1e6)
            table[key] = table.get(key, 0) + count

    def merge(self, others: Iterable[ItlLog]) -> ItlLog:
        for other in others:
            for key, count in other.counts.items():
                self.counts[key] = self.counts.get(key, 0) + count
        return self

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(sorted gaps in seconds, counts)."""
        keys = np.fromiter(self.counts.keys(), dtype=np.int64, count=len(self.counts))
        counts = np.fromiter(self.counts.values(), dtype=np.int64, count=len(self.counts))
        order = np.argsort(keys, kind="stable")
        return keys[order] / 1e6, counts[order]
