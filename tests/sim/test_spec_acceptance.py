"""The simulator's acceptance model (sim.spec_decode): its distributions against brute force and by-hand sums."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.errors import UserError
from kvplan.sim.spec_decode import (
    AcceptanceModel,
    acceptance_model,
    counts_from_records,
    from_counts,
    from_distribution,
    from_rate,
    uniform,
)


def test_a_rate_gives_the_truncated_geometric_distribution():
    model = from_rate(3, 0.5)
    assert model.accepted_distribution == pytest.approx((0.5, 0.25, 0.125, 0.125))
    assert model.mean_accepted == pytest.approx(0.25 + 2 * 0.125 + 3 * 0.125)
    assert model.acceptance_rate == pytest.approx(model.mean_accepted / 3)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=2, max_size=7).filter(lambda p: sum(p) > 0.01))
def test_a_distribution_round_trips_through_position_rates(weights):
    total = sum(weights)
    p = [w / total for w in weights]
    p[-1] = max(0.0, 1.0 - sum(p[:-1]))  # 1 within rounding, as a user's list would be
    model = from_distribution(len(p) - 1, p)
    assert model.accepted_distribution == pytest.approx(p, abs=1e-9)


def test_draws_follow_the_distribution():
    model = from_distribution(4, [0.1, 0.2, 0.3, 0.15, 0.25])
    draws = [model.outcome(uniform(7, key, i)) for key in range(200) for i in range(200)]
    assert all(d == 4 for d, _ in draws)
    freq = np.bincount([a for _, a in draws], minlength=5) / len(draws)
    assert freq == pytest.approx([0.1, 0.2, 0.3, 0.15, 0.25], abs=0.01)


def test_the_counter_based_variates_are_uniform_and_independent_of_order():
    u = np.array([uniform(3, key, i) for key in range(100) for i in range(100)])
    assert u.min() >= 0 and u.max() < 1
    assert np.histogram(u, bins=10, range=(0, 1))[0] == pytest.approx([1000] * 10, rel=0.1)
    assert uniform(3, 5, 9) == uniform(3, 5, 9) != uniform(4, 5, 9)
    # consecutive proposals of one request are not correlated
    pairs = np.array([[uniform(1, key, 0), uniform(1, key, 1)] for key in range(5000)])
    assert abs(np.corrcoef(pairs.T)[0, 1]) < 0.05


def test_measured_counts_keep_the_empty_proposals_and_the_position_rates():
    # 100 proposals of 2 drafts: 40 accepted none, 30 one, 30 both; 25 more steps proposed nothing
    counts = {(2, 0): 40, (2, 1): 30, (2, 2): 30, (0, 0): 25}
    model = from_counts(2, counts, "test")
    assert model.no_draft == pytest.approx(25 / 125)
    assert model.position_rates == pytest.approx((60 / 100, 30 / 60))
    # asked for more drafts than measured: the last position's rate carries on
    wider = from_counts(4, counts, "test")
    assert wider.position_rates == pytest.approx((0.6, 0.5, 0.5, 0.5))
    assert {wider.outcome(u)[0] for u in np.linspace(0, 0.999, 500)} == {0, 4}


def test_the_profile_records_are_summed_by_outcome():
    assert counts_from_records([[2, 1, 3], [2, 1, 4], [0, 0, 1]]) == {(2, 1): 7, (0, 0): 1}


def test_the_config_wins_over_a_measurement_and_none_is_an_error_naming_the_keys():
    measured = {"method": "ngram", "counts": [[3, 3, 10]]}
    assert acceptance_model(3, 0.5, None, measured, "ngram").source.startswith("acceptance_rate")
    assert acceptance_model(3, None, None, measured, "ngram").position_rates == (1.0, 1.0, 1.0)
    with pytest.raises(UserError, match=r"acceptance_rate.*acceptance.*calibrate"):
        acceptance_model(3, None, None, measured, "draft_model")
    with pytest.raises(UserError, match="sums to"):
        from_distribution(1, [0.5, 0.6])
    with pytest.raises(UserError, match="list of 3"):
        from_distribution(2, [0.5, 0.5])


def test_the_invariant_holds_for_every_draw():
    model = AcceptanceModel(3, (0.9, 0.5, 0.2), 0.3, "test")
    for u in np.linspace(0, 1, 2001, endpoint=False):
        drafts, accepted = model.outcome(float(u))
        assert 0 <= accepted <= drafts <= 3
