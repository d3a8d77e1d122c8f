"""`step_sums.stretch_sums` against the brute-force table it replaces: every request's attended tokens at
every step of the stretch (n × k), summed per step with numpy."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.sim.cost.features import FEATURE_NAMES, decode_stretch_features
from kvplan.sim.cost.step_sums import stretch_sums


def table_sums(contexts: list[int], remaining: list[int], k: int, block_size: int, window: int) -> dict:
    """The n × k table: request i attends contexts[i] + j tokens in step j while j < remaining[i], else 0."""
    steps = np.arange(k, dtype=np.int64)
    alive = steps < np.array(remaining, dtype=np.int64)[:, None]
    attended = (np.array(contexts, dtype=np.int64)[:, None] + steps) * alive
    capped = np.minimum(attended, window) if window else np.zeros_like(attended)
    return {"live": alive.sum(axis=0), "attended": attended.sum(axis=0),
            "blocks": (-(-attended // block_size)).sum(axis=0), "longest": attended.max(axis=0, initial=0),
            "capped": capped.sum(axis=0), "capped_blocks": (-(-capped // block_size)).sum(axis=0)}


stretches = st.integers(1, 40).flatmap(lambda n: st.tuples(
    st.lists(st.integers(1, 5000), min_size=n, max_size=n), st.lists(st.integers(-2, 90), min_size=n, max_size=n),
    st.integers(1, 80), st.sampled_from([1, 2, 3, 16, 32]), st.sampled_from([0, 1, 7, 64, 1024, 4096])))


@settings(max_examples=300, deadline=None)
@given(stretches, st.booleans())
def test_stretch_sums_are_the_tables_sums(stretch, spread):
    contexts, remaining, k, block_size, window = stretch
    live, attended, blocks, longest, capped, capped_blocks = stretch_sums(contexts, remaining, k, block_size, window,
                                                                         spread)
    want = table_sums(contexts, remaining, k, block_size, window)
    assert live == want["live"].tolist()
    assert attended == want["attended"].tolist()
    assert blocks == want["blocks"].tolist()
    assert longest == (want["longest"].tolist() if spread else [])
    assert capped == (want["capped"].tolist() if window else [])
    assert capped_blocks == (want["capped_blocks"].tolist() if window else [])


def test_an_empty_stretch_and_arrays_in():
    """No requests: every step has nothing live. numpy arrays in give the same features as lists."""
    assert stretch_sums([], [], 3, 16, 0, True) == ([0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0], [], [])
    contexts, remaining = [700, 31, 16, 17], [3, 9, 1, 5]
    from_lists = decode_stretch_features(contexts, remaining, 6, 16, 24)
    from_arrays = decode_stretch_features(np.array(contexts), np.array(remaining), 6, 16, 24)
    for name in FEATURE_NAMES:
        a, b = getattr(from_lists, name), getattr(from_arrays, name)
        assert type(a) is type(b) and np.array_equal(a, b), name
    assert from_lists.num_requests is from_lists.decode_requests is from_lists.sampled  # one array: a decode stretch


def test_every_way_to_leave_a_short_stretch():
    """Exhaustively for short stretches: a request leaving at each step, or live past the end, from contexts at and
    around block edges and the window (random stretches seldom end a growing request exactly at the last step)."""
    for k in range(1, 6):
        for block_size in (1, 2, 4):
            for window in (0, 3, 8):
                for context in range(1, 12):
                    for remaining in range(-1, k + 2):
                        got = stretch_sums([context], [remaining], k, block_size, window, True)
                        want = table_sums([context], [remaining], k, block_size, window)
                        names = ["live", "attended", "blocks", "longest", "capped", "capped_blocks"]
                        for name, values in zip(names, got, strict=True):
                            expected = want[name].tolist() if window or not name.startswith("capped") else []
                            assert values == expected, (name, k, block_size, window, context, remaining)
