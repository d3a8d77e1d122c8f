"""Per-request latency bounds (goodput, SLO attainment): which sequences meet them, and how many requests meet
them in every sequence (DistServe's goodput)."""

from __future__ import annotations

import numpy as np
import pandas as pd

# Per-request latency bounds -> the per-request table's column.
REQUEST_BOUNDS = {"ttft_ms": "ttft_ms", "tpot_ms": "tpot_ms", "itl_ms": "itl_max_ms", "e2el_ms": "e2el_ms"}


def within_bounds(table: pd.DataFrame, bounds: dict[str, float | None]) -> np.ndarray:
    """Per sequence: every per-request bound (`REQUEST_BOUNDS` keys, None: unbounded) holds; NaN fails."""
    ok = np.ones(len(table), dtype=bool)
    for key, column in REQUEST_BOUNDS.items():
        if bounds.get(key) is not None:
            ok &= np.nan_to_num(table[column].to_numpy(dtype=float), nan=np.inf) <= bounds[key]
    return ok


def goodput_count(table: pd.DataFrame, bounds: dict[str, float | None]) -> int:
    """Requests whose every sequence meets every bound (DistServe's goodput counts these)."""
    if not len(table):
        return 0
    return int(pd.Series(within_bounds(table, bounds)).groupby(table["request"].to_numpy()).all().sum())
