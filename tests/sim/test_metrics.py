"""Summary statistics: weighted percentiles equal numpy's on the expanded data; the ITL log's bins; the summary key
set."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.results import itl
from kvplan.results.itl import ItlLog
from kvplan.results.summary import SUMMARY_KEYS, _stats, weighted_percentile
from kvplan.sim.run import simulate
from kvplan.sim.spec import SimSpec
from tests.sim.helpers import random_trace


@pytest.mark.parametrize("seed", range(5))
def test_weighted_percentile_is_numpys_linear_percentile(seed):
    rng = np.random.default_rng(seed)
    values = np.sort(rng.random(rng.integers(1, 30)))
    weights = rng.integers(1, 6, len(values))
    expanded = np.repeat(values, weights)
    for q in (0, 1, 50, 90, 99, 100):
        assert weighted_percentile(values, weights, q) == pytest.approx(np.percentile(expanded, q), abs=1e-15)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(-2**42, 2**42), st.integers(-30, 0), st.integers(1, 1000)), min_size=1,
                max_size=40))
def test_weighted_mean_is_the_exactly_rounded_sum(entries):
    """The summary's mean is the exact weighted sum rounded once, then divided: no machine-dependent BLAS
    summation order (a multithreaded dot product split long columns across the machine's cores) and no
    cancellation. The values are m × 2^e (|m| < 2^42, weights < 2^10: every product exact), so the exact sum is
    known."""
    values = np.sort(np.array([math.ldexp(m, e) for m, e, _ in entries], dtype=np.float64))
    weights = np.array([w for *_, w in entries], dtype=np.int64)
    exact = sum((Fraction(float(v)) * int(w) for v, w in zip(values, weights, strict=True)), Fraction(0))
    assert _stats("x", values, weights)["mean_x_ms"] == float(exact) / int(weights.sum())


def test_itl_log_counts_merge():
    a, b = ItlLog(), ItlLog()
    a.add(0.5, 3)
    a.add(0.25)
    b.add(0.5000000004)  # the same microsecond
    values, counts = ItlLog().merge([a, b]).arrays()
    assert values.tolist() == [0.25, 0.5] and counts.tolist() == [1, 4]


HALF_MICROSECONDS = st.integers(0, 10**7).map(lambda u: (u + 0.5) / 1e6)  # rounding ties, where rules differ


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.floats(0, 100, allow_nan=False), HALF_MICROSECONDS), st.integers(1, 10**6)),
                max_size=300), st.integers(1, 64))
def test_itl_log_bins_as_round_does(entries, limit):
    """Binned in bulk (numpy's rint, at most `limit` pending) the table is the one `round` gives gap by gap,
    half-microsecond gaps included (both round half to even)."""
    expected: dict[int, int] = {}
    for gap, count in entries:
        expected[round(gap * 1e6)] = expected.get(round(gap * 1e6), 0) + count
    log = ItlLog()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(itl, "PENDING_LIMIT", limit)
        for i, (gap, count) in enumerate(entries):
            if i % 3:
                log.add(gap, count)
            else:
                log.add_many([gap], [count])
    assert log.counts == expected


def test_itl_log_refuses_a_gap_that_is_not_a_number():
    log = ItlLog()
    log.add(math.nan)
    with pytest.raises(ValueError, match="finite"):
        log.arrays()


def test_summary_has_exactly_the_design_keys():
    result = simulate(random_trace(3, 20), SimSpec(num_blocks=200))
    assert tuple(result.summary) == SUMMARY_KEYS
    # request_goodput beside the throughputs; 4 counters and the bytes its link moved per prefix tier
    # + the engine-internal TTFT, TPOT and E2E beside the client's (4 statistics each)
    assert len(SUMMARY_KEYS) == 6 + 16 + 12 + 9 + 5 + 3 * 5
    assert result.summary["request_goodput"] is None  # no per-request bounds given
    for tier in ("cpu", "disk", "shared"):  # no tier: null
        assert result.summary[f"kv_offload_{tier}_hits"] is None and result.summary[f"kv_offload_{tier}_bytes"] is None
    memory = sum(result.summary[k] for k in ("token_states", "internal_fragmentation", "reserved_unused",
                                             "external_fragmentation", "free"))
    assert memory == pytest.approx(1.0)
    table = result.requests
    assert result.summary["mean_ttft_ms"] == pytest.approx(table["ttft_ms"].mean())
    assert result.summary["p99_e2el_ms"] == pytest.approx(np.percentile(table["e2el_ms"], 99))
    assert result.summary["output_throughput"] == pytest.approx(table["output_tokens"].sum()
                                                                / result.summary["duration_s"])
