"""Calibrated profiles: the format round-trips, the fit recovers known coefficients, NNLS matches brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.sim.cost.calibrated import COEFFICIENTS, CalibratedCost, feature_columns, load_profile, save_profile
from kvplan.sim.cost.features import step_features
from kvplan.sim.cost.fit import fit_with_holdout, nnls
from kvplan.sim.cost.recorded import ProfiledItem, ProfiledStep

TRUE = {"step": 2e-3, "request": 5e-5, "prefill_tokens": 3e-4, "prefill_attention": 2e-8, "decode_requests": 1e-4,
        "decode_context": 4e-7, "decode_context_max": 2e-6, "blocks_touched": 3e-6, "sampled": 8e-4,
        "batched": 2e-2}


def test_profile_round_trips(tmp_path):
    cost = CalibratedCost(dict(TRUE), 2e-5, 1e-6, 1234,
                          {"model": "llama-100m", "device": "cpu-local", "dtype": "bfloat16", "block_size": 16,
                           "block_sizes": [8, 16, 32], "fit": {"r2": 0.99}, "provenance": {"torch": "2.13.0"}})
    path = tmp_path / "p.yaml"
    save_profile(cost, path, "a header comment")
    loaded = load_profile(path)
    assert loaded.to_dict() == cost.to_dict()
    assert path.read_text().startswith("# a header comment\n")
    step = [ProfiledItem("a", 40, 100, False, True), ProfiledItem("b", 1, 70, True, True)]
    f = step_features(step, 16)
    assert loaded.step_times(f) == cost.step_times(f)
    expected = sum(TRUE[k] * v for k, v in zip(COEFFICIENTS, feature_columns(f), strict=True))
    assert cost.step_times(f) == pytest.approx(expected)


def synthetic_steps(count: int, rng: np.random.Generator) -> list[ProfiledStep]:
    """Random batches: prefill chunks after cached prefixes, decodes over a spread of contexts, at 3 block
    sizes."""
    steps = []
    for i in range(count):
        items = []
        for j in range(int(rng.integers(0, 8))):
            n = int(rng.integers(1, 400))
            items.append(ProfiledItem(f"p{j}", n, int(rng.integers(0, 600)), False, bool(rng.random() < 0.5)))
        for j in range(int(rng.integers(0 if items else 1, 40))):
            items.append(ProfiledItem(f"d{j}", 1, int(rng.integers(10, 1500)), True, True))
        steps.append(ProfiledStep(i, int(rng.choice([8, 16, 32])), items, 0, 0, 0.0))
    return steps


def test_fit_recovers_known_coefficients_within_one_percent():
    rng = np.random.default_rng(7)
    steps = synthetic_steps(600, rng)
    x = np.array([feature_columns(step_features(s.items, s.block_size)) for s in steps], dtype=float)
    c = np.array([TRUE[k] for k in COEFFICIENTS])
    t = x @ c * (1 + rng.normal(0, 1e-4, len(steps)))
    t[rng.choice(len(t), 12, replace=False)] *= 4  # a background process stretched a few steps
    fit = fit_with_holdout(x, t, rng.random(len(t)) < 0.2)
    assert np.allclose(fit.coefficients, c, rtol=0.01), dict(zip(COEFFICIENTS, fit.coefficients / c, strict=True))
    assert np.median(np.abs(fit.relative_errors)) < 1e-3


def brute_force_nnls(a: np.ndarray, b: np.ndarray) -> float:
    """The least residual over every support set whose unconstrained solution is non-negative."""
    best = float(np.sum(b**2))
    for size in range(1, a.shape[1] + 1):
        for support in itertools.combinations(range(a.shape[1]), size):
            x = np.linalg.lstsq(a[:, support], b, rcond=None)[0]
            if (x >= 0).all():
                best = min(best, float(np.sum((a[:, support] @ x - b) ** 2)))
    return best


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1), st.integers(1, 4), st.integers(4, 12))
def test_nnls_matches_brute_force(seed, cols, rows):
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=(rows, cols)), rng.normal(size=rows)
    x = nnls(a, b)
    assert (x >= 0).all()
    assert float(np.sum((a @ x - b) ** 2)) == pytest.approx(brute_force_nnls(a, b), rel=1e-9, abs=1e-12)
