"""The memory breakdown's one vectorised step (`metrics._distinct_max_sums`) against a dict over the entries."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kvplan.engine.core.metrics import _distinct_max_sums

entries = st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 16), st.integers(0, 16)), max_size=200)


def by_dict(pairs: list[tuple[int, int]]) -> int:
    most: dict[int, int] = {}
    for block, value in pairs:
        most[block] = max(most.get(block, 0), value)
    return sum(most.values())


@given(entries)
def test_each_block_counts_once_with_its_largest_value(rows):
    ids, first, second = (np.array(column, dtype=np.int64) for column in zip(*rows, strict=True)) if rows else (
        np.zeros(0, dtype=np.int64),) * 3
    expected = [by_dict([(b, v) for b, v, _ in rows]), by_dict([(b, v) for b, _, v in rows])]
    assert _distinct_max_sums(ids, first, second) == expected
