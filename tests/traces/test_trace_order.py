"""Whom the order check blames: the rows outside the earliest longest run already in order. Checked against
brute force over every subsequence of small traces."""

from __future__ import annotations

from itertools import combinations, pairwise

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.traces.loaders.arrival_order import earliest_longest_ordered


def _brute_force(times: list[float]) -> tuple[int, ...]:
    """The index set of the longest non-decreasing subsequence, the lexicographically earliest among equals."""
    for size in range(len(times), 0, -1):
        for picked in combinations(range(len(times)), size):  # combinations come in lexicographic order
            if all(times[a] <= times[b] for a, b in pairwise(picked)):
                return picked
    return ()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=9))
def test_the_kept_rows_are_the_earliest_longest_ordered_run(values):
    times = np.array(values, dtype=np.float64)
    kept = tuple(np.flatnonzero(earliest_longest_ordered(times)).tolist())
    assert kept == _brute_force(values)
