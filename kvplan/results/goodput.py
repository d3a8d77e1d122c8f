"""Per-request latency bounds (goodput, SLO attainment): which sequences meet them, and how many requests meet
them in every sequence (DistServe's goodput)."""

from __future__ import annotations

import numpy as np
import pandas as pd

# Per-request latency bounds -> the per-request table's column.
REQUEST_BOUNDS = {"ttft_ms": "ttft_ms", "tpot_ms": "tpot_ms", "itl_ms": "itl_max_ms", "e2el_ms": "e2el_ms"}
# The bounds on the gaps between tokens: a one-token sequence has none, and meets them (vLLM's goodput: "if
# output_len <= 1, we regard tpot as 0", vllm/benchmarks/serve.py calculate_metrics)
GAP_BOUNDS = ("tpot_ms", "itl_ms")


def within_bounds(table: pd.DataFrame, bounds: dict[str, float | None]) -> np.ndarray:
    """Per sequence: every per-request bound (`REQUEST_BOUNDS` keys, None: unbounded) holds. A missing value
    fails (a sequence with no first token meets no bound), except a gap bound's for a sequence of one token that
    has it (`GAP_BOUNDS`: it has no gap, as vLLM counts it)."""
    ok = np.ones(len(table), dtype=bool)
    one_token = np.zeros(len(table), dtype=bool)  # ... that has its token
    if "output_tokens" in table:
        one_token = (table["output_tokens"].to_numpy() <= 1) & ~np.isnan(table["ttft_ms"].to_numpy(dtype=float))
    for key, column in REQUEST_BOUNDS.items():
        if bounds.get(key) is not None:
            values = table[column].to_numpy(dtype=float)
            if key in GAP_BOUNDS:
                values = np.where(one_token & np.isnan(values), 0.0, values)
            ok &= np.nan_to_num(values, nan=np.inf) <= bounds[key]
    return ok


def goodput_count(table: pd.DataFrame, bounds: dict[str, float | None]) -> int:
    """Requests whose every sequence meets every bound (DistServe's goodput counts these)."""
    if not len(table):
        return 0
    return int(pd.Series(within_bounds(table, bounds)).groupby(table["request"].to_numpy()).all().sum())
