"""How far a per-op predictor is off, per op family, over every row it prices (never a log-spaced subset: the
old comparison's subset under-weighted the many mid-size rows and hid a +17% GEMM bias).

Signed error = predicted / measured − 1 (positive: predicted too slow). Per family: rows, median and p90 of
|error|, bias (mean signed error), median signed error, and the signed p10 / p90. `step_band` combines the
families' signed p10 and p90 into the band a step time may be off: each family weighted by its share of the
measured time of the rows (one layer's ops, summed over the validation rows), the edges clipped to
lo <= 0 <= hi.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvplan.sim.gpu.profiles import FAMILIES


def family_stats(rows: pd.DataFrame, predicted_ms: np.ndarray) -> list[dict]:
    """One dict per family with rows (in `FAMILIES` order; families without a priced row are left out)."""
    frame = rows.assign(pred=predicted_ms)
    frame = frame[np.isfinite(frame["pred"])]
    out = []
    for family in FAMILIES:
        part = frame[frame["family"] == family]
        if part.empty:
            continue
        err = part["pred"].to_numpy() / part["measured_ms"].to_numpy() - 1.0
        out.append({"family": family, "rows": len(err),
                    "median_abs_err_pct": _pct(np.median(np.abs(err))),
                    "p90_abs_err_pct": _pct(np.quantile(np.abs(err), 0.9)),
                    "bias_pct": _pct(np.mean(err)), "median_signed_err_pct": _pct(np.median(err)),
                    "p10_signed_err_pct": _pct(np.quantile(err, 0.1)),
                    "p90_signed_err_pct": _pct(np.quantile(err, 0.9)),
                    "measured_ms": float(part["measured_ms"].sum())})
    return out


def _pct(x: float) -> float:
    return round(float(x) * 100.0, 2)


def step_band(stats: list[dict]) -> list[float]:
    """[lo, hi]: the families' signed p10 / p90 weighted by their share of the measured time, lo <= 0 <= hi."""
    total = sum(s["measured_ms"] for s in stats)
    if total <= 0:
        return [0.0, 0.0]
    lo = sum(s["p10_signed_err_pct"] * s["measured_ms"] for s in stats) / total
    hi = sum(s["p90_signed_err_pct"] * s["measured_ms"] for s in stats) / total
    return [round(min(lo, 0.0), 2), round(max(hi, 0.0), 2)]


def markdown(stats: list[dict]) -> str:
    """The table the docs and `bench fidelity` print."""
    lines = ["| family | rows | median abs error | p90 abs error | bias (mean signed) | median signed |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {s['family']} | {s['rows']} | {s['median_abs_err_pct']:.1f}% | {s['p90_abs_err_pct']:.1f}% | "
              f"{s['bias_pct']:+.1f}% | {s['median_signed_err_pct']:+.1f}% |" for s in stats]
    return "\n".join(lines)
