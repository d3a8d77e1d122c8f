"""From recorded engine steps to a calibrated profile: design matrix, robust fit, held-out error, residuals.

The design row of a step is the calibrated model's feature columns (`sim.cost.calibrated.feature_columns`, the
same arithmetic the simulator prices) plus the tokens it swapped and copied: transfers are fitted per token, so
steps measured at different block sizes inform one coefficient, and the profile states them per block of its
own block size.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from kvplan.errors import UserError
from kvplan.sim.cost.calibrated import COEFFICIENTS, CalibratedCost, feature_columns
from kvplan.sim.cost.features import step_features
from kvplan.sim.cost.fit import Fit, fit_with_holdout, r_squared
from kvplan.sim.cost.recorded import ProfiledStep
from kvplan.sim.gpu.model_error import STEP_KINDS, family_error, step_band_pct

TRANSFER_COLUMNS = ("swap_tokens", "copy_tokens")
HOLDOUT_FRACTION = 0.2


def step_kind(step: ProfiledStep) -> str:
    if step.swapped_blocks or step.copied_blocks:
        return "transfers"
    decodes = sum(i.is_decode for i in step.items)
    if decodes == len(step.items):
        return "decode"
    return "prefill" if decodes == 0 else "mixed"


def design_matrix(steps: list[ProfiledStep], attended_limit: int = 0) -> np.ndarray:
    rows = []
    for s in steps:
        f = step_features(s.items, s.block_size, attended_limit)
        rows.append((*feature_columns(f), s.swapped_blocks * s.block_size, s.copied_blocks * s.block_size))
    return np.array(rows, dtype=np.float64)


@dataclass(slots=True)
class Calibration:
    cost: CalibratedCost
    measured: np.ndarray
    predicted: np.ndarray
    holdout: np.ndarray  # boolean mask of held-out steps
    kinds: list[str]

    def residual_table(self) -> list[list[object]]:
        """Per step kind, held-out and fitted together: count, median and p90 |error| %, bias %."""
        error = (self.predicted - self.measured) / self.measured * 100
        rows = []
        for kind in ("prefill", "decode", "mixed", "transfers", "all"):
            mask = np.ones(len(error), bool) if kind == "all" else np.array([k == kind for k in self.kinds])
            if mask.any():
                e = error[mask]
                rows.append([kind, int(mask.sum()), float(np.median(np.abs(e))),
                             float(np.percentile(np.abs(e), 90)), float(np.median(e)),
                             float(self.measured[mask].mean() * 1e3)])
        return rows


def calibrate_steps(steps: list[ProfiledStep], block_size: int, seed: int = 0) -> Calibration:
    """Fit the profile's coefficients on the steps; `block_size` is the one the profile states transfers at."""
    if len(steps) < 4 * (len(COEFFICIENTS) + len(TRANSFER_COLUMNS)):
        raise UserError(f"calibration: only {len(steps)} steps recorded; allowed: at least "
                         f"{4 * (len(COEFFICIENTS) + len(TRANSFER_COLUMNS))} (more phases or --repeats)")
    x = design_matrix(steps)
    t = np.array([s.duration_s for s in steps])
    holdout = np.random.default_rng(seed).random(len(steps)) < HOLDOUT_FRACTION
    fit = fit_with_holdout(x, t, holdout)
    c = fit.coefficients
    n = len(COEFFICIENTS)
    cost = CalibratedCost(dict(zip(COEFFICIENTS, c[:n].tolist(), strict=True)),
                          swap_seconds_per_block=float(c[n] * block_size),
                          copy_seconds_per_block=float(c[n + 1] * block_size))
    predicted = x @ c
    kinds = [step_kind(s) for s in steps]
    cost.meta["fit"] = {**fit_quality(fit, predicted, t, holdout, kinds),
                        "method": "non-negative least squares on relative error, Huber-reweighted; 20% of steps "
                                  "held out"}
    return Calibration(cost, t, predicted, holdout, kinds)


def fit_quality(fit: Fit, predicted: np.ndarray, measured: np.ndarray, holdout: np.ndarray,
                kinds: list[str]) -> dict:
    """The profile's `fit` numbers: steps, R² on the fitted and the held-out steps, held-out |error| % and bias
    % (the mean signed error), and the model error `--cost calibrated` states (`sim.gpu.model_error`): per step
    kind of the held-out steps (and all of them) rows, median and p90 |error|, bias, and the step band (their
    signed error's 10th-90th percentile)."""
    errors = fit.relative_errors  # (predicted - measured) / measured on the held-out steps
    held = np.abs(errors) * 100
    held_kinds = np.asarray(kinds)[holdout]
    families = [family_error(kind, errors[held_kinds == kind]) for kind in STEP_KINDS[:-1]
                if np.any(held_kinds == kind)]
    return {"steps": len(measured), "heldout_steps": int(holdout.sum()), "r2": round(fit.r2, 5),
            "heldout_r2": round(r_squared(predicted[holdout], measured[holdout]), 5),
            "heldout_median_abs_error_pct": round(float(np.median(held)), 3),
            "heldout_p90_abs_error_pct": round(float(np.percentile(held, 90)), 3),
            "heldout_bias_pct": round(float(np.mean(errors)) * 100, 3),
            "heldout_families": [*families, family_error("all", errors)],
            "step_band_pct": step_band_pct(errors)}


def residual_plot(cal: Calibration, title: str) -> bytes:
    """PNG: predicted vs measured step time (log-log) and relative error vs measured, held-out steps marked."""
    from kvplan.caches import prepare_matplotlib

    prepare_matplotlib()  # a writable font cache, no stale lock (kvplan.caches)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    error = (cal.predicted - cal.measured) / cal.measured * 100
    for kind, color in (("prefill", "C0"), ("decode", "C1"), ("mixed", "C2"), ("transfers", "C3")):
        mask = np.array([k == kind for k in cal.kinds])
        if mask.any():
            left.scatter(cal.measured[mask] * 1e3, cal.predicted[mask] * 1e3, s=8, c=color, label=kind, alpha=0.6)
            right.scatter(cal.measured[mask] * 1e3, error[mask], s=8, c=color, alpha=0.6)
    right.scatter(cal.measured[cal.holdout] * 1e3, error[cal.holdout], s=30, facecolors="none", edgecolors="k",
                  label="held out")
    lo, hi = cal.measured.min() * 1e3, cal.measured.max() * 1e3
    left.plot([lo, hi], [lo, hi], "k--", lw=1)
    left.set(xscale="log", yscale="log", xlabel="measured step (ms)", ylabel="predicted step (ms)", title=title)
    right.axhline(0, color="k", lw=1)
    right.set(xscale="log", xlabel="measured step (ms)", ylabel="error (%)", title="residuals")
    left.legend()
    right.legend()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()
