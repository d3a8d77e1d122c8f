"""Peak resident memory of a benchmark row that may run worker processes: this process plus its live children.

`getrusage` gives each process's own peak, and the children's as the largest one's - peaks that need not
coincide (a row's workers finish before it assembles its result). Sampling the current resident sizes of this
process and every child together, a few times a second, gives the peak of their sum (pages a forked child
still shares with its parent are counted in both: an upper bound). Off Linux (no /proc) it falls back to this
process's own peak plus the largest child's.
"""

from __future__ import annotations

import resource
import threading
from pathlib import Path

PROC = Path("/proc")
SAMPLE_S = 0.05


def _rss_mb(pid: int | str) -> float:
    try:
        status = (PROC / str(pid) / "status").read_text()
    except OSError:  # the child has just exited
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0  # kB
    return 0.0


def _children() -> list[str]:
    pids: list[str] = []
    for task in (PROC / "self" / "task").iterdir():
        try:
            pids += (task / "children").read_text().split()
        except OSError:
            continue
    return pids


class PeakMemory:
    """`with PeakMemory() as peak: ...` then `peak.mb`: the largest sum of this process's and its children's
    resident memory seen while the block ran (MB)."""

    def __init__(self) -> None:
        self.mb = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sampling = (PROC / "self" / "task").is_dir()

    def _sample(self) -> None:
        while True:
            total = _rss_mb("self") + sum(_rss_mb(pid) for pid in _children())
            self.mb = max(self.mb, total)
            if self._stop.wait(SAMPLE_S):
                return

    def __enter__(self) -> PeakMemory:
        if self._sampling:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB
        if self._sampling:
            self.mb = max(self.mb, own)  # a peak between two samples
        else:
            self.mb = own + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
