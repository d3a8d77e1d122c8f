"""The garbage collector's thresholds while a simulation runs.

A simulated step allocates and frees thousands of objects (outputs, lists, boxed ints), nearly all freed by
reference counting the moment they die; what a run keeps (its request log, series, the cache's blocks) lives until
the run ends. CPython's default thresholds (700, 10, 10) suit programs whose young objects form cycles: here a
young collection finds next to nothing, and the full collections they lead to walk every live object - the
cache's blocks, the trace, the tables of the probes before. So a simulation (`sim.run.simulate`, a probe of
`sim.probe.run_probe`, any cluster's run) waits for `YOUNG` net allocations between young collections and `MIDDLE`
young ones between middle ones (a full one for ten middle ones, as before). Only garbage in reference cycles waits
longer, at most `YOUNG` objects' worth. A quickstart search (17 probes; `gc.callbacks`) spent 0.45 s of its ~10 s
in the collector before (966 young, 88 middle and 8 full collections), 0.19 s after (311, 28, 2) - most of what
remains is outside the simulation (writing results); azure_conv_x4 67 ms before, 3 ms after.
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
