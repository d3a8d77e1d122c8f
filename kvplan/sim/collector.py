"""The garbage collector's thresholds while a cluster runs.

A simulated step allocates and frees thousands of objects (outputs, lists, boxed ints), nearly all freed by
reference counting the moment they die; what a run keeps (its request log, series, the cache's blocks) lives until
the run ends. CPython's default thresholds (700, 10, 10) suit programs whose young objects form cycles: here a
young collection finds next to nothing, and the full collections they lead to walk every live object - the
cache's blocks, the trace, the requests. So while a cluster runs (`sim.stopping.Stoppable.run_to`) young
collections wait for `YOUNG` net allocations and middle ones for `MIDDLE` young ones (a full one for ten middle
ones, as before): azure_conv_x4 spent 67 ms of its 1.3 s in the collector (105 young, 9 middle, 1 full
collection), 3 ms after (23, 2, 0). Only garbage in reference cycles waits longer, at most `YOUNG` objects' worth.
Not beyond the run: building a run's tables leaves pandas frames in reference cycles, and holding their arrays
for 20,000 allocations raised the 70B experiment's peak memory from 293 to 498 MB.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

YOUNG: Final = 20_000  # net container allocations between young collections (CPython's default: 700)
MIDDLE: Final = 20  # young collections between middle ones (default: 10)


@contextmanager
def simulation_collector() -> Iterator[None]:
    """Raise the young and middle thresholds (never lower them; a young threshold of 0, collection off, stays off)
    for the block; restore them after."""
    young, middle, old = gc.get_threshold()
    gc.set_threshold(young and max(young, YOUNG), max(middle, MIDDLE), old)
    try:
        yield
    finally:
        gc.set_threshold(young, middle, old)
