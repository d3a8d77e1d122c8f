"""A step-cost term that depends on one integer feature only (the step's token count, its sampled rows), kept as
a table so that pricing a step looks it up instead of re-evaluating the per-op laws.

The analytic cost's linear layers, LM head, routed experts and TP collectives are pure functions of one count
(`AnalyticCost`): every simulated step asked the laws again for the same few hundred counts (a quarter of a
million GEMM-law calls in a one-hour trace). The table evaluates the term once per count, on an int64 `arange`
through the term's own array form, and answers plain ints from a list (a Python float, as the law returns) and
a stretch's int64 array by indexing. The laws apply the same IEEE operations to a number and to an array entry
(`sim.gpu.laws`), so a looked-up entry is the value the law gives for that count, bit for bit
(tests/sim/test_cost_speed.py checks every entry against the law's plain-int answer).

Anything the table does not cover goes to the term itself: a count beyond `limit` (a step that large is rare and
the table stays small), a negative one, a float (a PP micro-batch's share) or an array of another dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import numpy as np

# Most entries one table holds: counts up to 32 Ki tokens per step (vLLM's budgets are 2-16 Ki), about 1 MB of
# floats at the most, grown as larger counts show up.
TABLE_LIMIT: Final = 1 << 15
_FIRST_SIZE: Final = 256  # the first fill: a decode batch's counts; larger counts double it


@dataclass(slots=True)
class TokenTable:
    """`term` tabulated over the counts 0 .. len - 1; `term` maps a number or an int64 array to seconds with the
    same IEEE operations on either."""

    term: Callable
    limit: int = TABLE_LIMIT
    _values: list[float] = field(default_factory=list, repr=False)
    _array: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.float64), repr=False)

    def at(self, x):
        """`term(x)`: looked up for a count or an int64 array of counts the table covers."""
        if type(x) is int:  # exactly int: a bool or numpy scalar takes the term's own path
            if 0 <= x < len(self._values):
                return self._values[x]
            if 0 <= x < self.limit:
                self._grow(x)
                return self._values[x]
            return self.term(x)
        if isinstance(x, np.ndarray) and x.dtype == np.int64 and x.ndim == 1 and len(x):
            # a negative count reads as a huge one: the term handles it (the ufunc's reduce: `.max()` adds a Python
            # layer that cost more than the lookup)
            top = int(np.maximum.reduce(x.view(np.uint64)))
            if top >= len(self._values):
                if top >= self.limit:
                    return self.term(x)
                self._grow(top)
            return self._array[x]
        return self.term(x)

    def _grow(self, count: int) -> None:
        """Extend the table to cover `count` (at least doubling it, up to `limit`)."""
        size = min(max(count + 1, 2 * len(self._values), _FIRST_SIZE), self.limit)
        counts = np.arange(len(self._values), size, dtype=np.int64)
        more = np.broadcast_to(np.asarray(self.term(counts), dtype=np.float64), counts.shape)  # (a constant term)
        self._array = np.concatenate((self._array, more))
        self._values = self._array.tolist()
