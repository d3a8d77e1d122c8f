"""The garbage collector's thresholds while a simulation runs.

A simulated step allocates and frees thousands of objects (outputs, lists, boxed ints), nearly all freed by
reference counting the moment they die; what a run keeps (its request log, series, the cache's blocks) lives until
the run ends. CPython's default thresholds (700, 10, 10) were made for programs whose young objects form cycles:
here a young collection finds next to nothing, and the full collections they lead to walk every live object -
the cache's blocks, the trace, the tables of the probes before. A quickstart search (17 probes) spent 0.42-0.56 s of
its 10-12 s there (966 young, 88 middle and 8 full collections; `gc.callbacks`). While a cluster runs, young
collections wait for `YOUNG` net allocations instead (a full one for ten middle ones, as before): 195, 16 and 1
collections in 0.13 s. Only garbage in reference cycles waits longer - at most `YOUNG` objects' worth.
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
