"""Fitting the calibrated cost model: non-negative, outlier-robust least squares on relative error.

The model is t ≈ X·c with X the design rows of `calibrated.feature_columns` (plus swapped and copied blocks) and
c >= 0: a negative coefficient would price some step below zero. Steps span two orders of magnitude (a one-token
decode to a full prefill budget), so the residual that matters is relative: each row is weighted by 1/t, and a
Huber re-weighting (iteratively reweighted least squares) keeps the few steps a background process stretched
from pulling the fit. NNLS is Lawson–Hanson's active-set method (numpy only: the simulator runs without scipy).

    rows ──► weight 1/t ──► NNLS ──► residuals r ──► Huber weights w(r) ──┐
               ▲                                                       │
               └──────────────────── (a few rounds) ◄──────────────────┘
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvplan.errors import UserError

HUBER_K = 1.345  # the classic 95%-efficiency tuning constant, in units of the residuals' robust scale


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """argmin ||a x − b||₂ subject to x >= 0 (Lawson & Hanson, 1974, ch. 23)."""
    rows, cols = a.shape
    x = np.zeros(cols)
    passive = np.zeros(cols, dtype=bool)
    tol = 10 * np.finfo(float).eps * np.linalg.norm(a, 1) * max(rows, cols)
    for _ in range(max_iter or 3 * cols):
        gradient = a.T @ (b - a @ x)
        candidates = ~passive & (gradient > tol)
        if not candidates.any():
            break
        passive[np.argmax(np.where(candidates, gradient, -np.inf))] = True
        while True:
            z = np.zeros(cols)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            # Step back towards x until the first passive coefficient reaches zero, and drop it.
            shrink = passive & (z <= 0)
            alpha = np.min(x[shrink] / (x[shrink] - z[shrink]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
    return x


@dataclass(slots=True)
class Fit:
    coefficients: np.ndarray
    r2: float  # on the rows fitted
    relative_errors: np.ndarray  # (predicted − measured) / measured on the held-out rows


def robust_nnls(x: np.ndarray, t: np.ndarray, rounds: int = 8) -> np.ndarray:
    """Non-negative coefficients minimising the Huber loss of the relative residuals (X·c − t) / t."""
    scale = np.maximum(np.abs(x).max(axis=0), 1e-300)  # unit columns: conditioning, not the answer
    a = x / scale / t[:, None]
    b = np.ones(len(t))
    weights = np.ones(len(t))
    c = np.zeros(x.shape[1])
    for _ in range(rounds):
        root = np.sqrt(weights)
        c = nnls(a * root[:, None], b * root)
        residual = a @ c - b
        spread = 1.4826 * np.median(np.abs(residual - np.median(residual)))  # MAD: a robust σ
        if spread <= 1e-12:
            break
        limit = HUBER_K * spread
        weights = np.minimum(1.0, limit / np.maximum(np.abs(residual), 1e-300))
    return c / scale


def r_squared(predicted: np.ndarray, measured: np.ndarray) -> float:
    total = float(np.sum((measured - measured.mean()) ** 2))
    return 1.0 - float(np.sum((measured - predicted) ** 2)) / total if total > 0 else 1.0


def fit_with_holdout(x: np.ndarray, t: np.ndarray, holdout: np.ndarray) -> Fit:
    """Fit on the rows not in `holdout` (a boolean mask), report R² there and relative errors on `holdout`."""
    train = ~holdout
    if train.sum() < x.shape[1]:
        raise UserError(f"calibration: {int(train.sum())} steps to fit {x.shape[1]} coefficients; "
                         "allowed: more steps (a larger --repeats)")
    if np.any(t <= 0) or not np.all(np.isfinite(t)):
        raise UserError("calibration: every measured step time must be a finite number > 0")
    c = robust_nnls(x[train], t[train])
    errors = (x[holdout] @ c - t[holdout]) / t[holdout]
    return Fit(c, r_squared(x[train] @ c, t[train]), errors)
