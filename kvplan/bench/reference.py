"""A fixed pure-Python reference workload: the machine's speed, measured beside a benchmark in the same run.

The simulator's cost is interpreted Python per scheduler step, so a benchmark's wall time moves with the machine
(other processes on a shared core, frequency drift) as much as with the code. Reporting the speed of a fixed
workload of the same kind - attribute updates on slotted records, dict lookups and inserts, list appends, small
integer arithmetic, as a scheduler step does - measured in the same process just before and after, lets figures
from two runs or two machines be compared: divide each ratio by its reference figure.

One "op" is one iteration of the inner loop below; the figure is millions of them per second, the best of a few
repeats (a repeat slowed by another process only lowers its own figure).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

REFERENCE_OPS = 400_000  # ~0.1 s a repeat on the machines this runs on
REPEATS = 3
_RECORDS = 64


@dataclass(slots=True)
class _Record:
    pos: int
    left: int


def workload(ops: int = REFERENCE_OPS) -> int:
    """The fixed workload: `ops` iterations; returns a checksum (so nothing is optimised away)."""
    records = [_Record(i, i % 7 + 1) for i in range(_RECORDS)]
    table: dict[int, int] = {}
    seen: list[int] = []
    total = 0
    for step in range(ops // _RECORDS):
        for record in records:
            record.pos += 1
            if record.pos % 16 == 0:
                table[record.pos] = step
                seen.append(record.pos)
            total += table.get(record.pos - 16, 0) + record.left
        if len(seen) > 4096:
            seen.clear()
    return total


def reference_mops(repeats: int = REPEATS, ops: int = REFERENCE_OPS) -> float:
    """Millions of reference ops per second on this machine now (the best of `repeats`)."""
    ops -= ops % _RECORDS
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        workload(ops)
        best = min(best, time.perf_counter() - start)
    return ops / best / 1e6
