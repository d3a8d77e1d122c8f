"""`kvplan bench fidelity`: the shipped per-op model against any Vidur-format profile directory, without fitting
on it.

Every row of DIR that the model prices is predicted with the shipped constants (`sim/profiles/gpu_laws.json`)
on the datasheet of `--hardware`, and the error (predicted / measured − 1) is summarised per op family over all
rows: rows, median and p90 |error|, mean (bias) and median signed error. Attention rows (an `attention.csv`) are
priced by `sim.gpu.attention.AttentionCost` on a one-layer model of the row's shape. When DIR holds profiles of
several GPUs, only those whose folder name the hardware's name starts with are used (`compute/a100` for
a100-80gb); all-reduces are priced inside one node (as tensor parallelism runs them).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kvplan.errors import UserError
from kvplan.sim.cost.features import StepFeatures
from kvplan.sim.gpu.attention import AttentionCost
from kvplan.sim.gpu.fit import predict
from kvplan.sim.gpu.laws import shipped_laws
from kvplan.sim.gpu.profiles import read_profiles, rows_for_hardware
from kvplan.sim.gpu.validation import family_stats
from kvplan.sim.specs.arch import ModelSpec
from kvplan.sim.specs.hardware import HARDWARE, HardwareSpec, get_hardware


def run(profiles: Path | str, hardware: str) -> dict:
    """The per-family error table of the shipped model on `profiles` for `hardware`."""
    if hardware not in HARDWARE:
        from kvplan.engine.core.names import did_you_mean

        raise UserError(f"--hardware: unknown GPU {hardware!r}; {did_you_mean(hardware, sorted(HARDWARE))}allowed: "
                        f"{', '.join(sorted(HARDWARE))}")
    hw = get_hardware(hardware)
    rows = rows_for_hardware(read_profiles(profiles), hardware, f"--profiles: {profiles}")
    predicted = predict(rows, shipped_laws(), hw)
    attention = (rows["family"] == "attention").to_numpy()
    if attention.any():
        predicted[attention] = attention_ms(rows[attention], hw)
    families = family_stats(rows, predicted)
    for family in families:
        family.pop("measured_ms")
    return {"profiles": str(profiles), "hardware": hardware, "rows": int(np.isfinite(predicted).sum()),
            "families": families}


def attention_ms(rows: pd.DataFrame, hw: HardwareSpec) -> np.ndarray:
    """ms of attention rows: attn_prefill / attn_decode by `AttentionCost`; the other attention ops (reshapes,
    the KV-cache save) are not priced by it (NaN)."""
    out = np.full(len(rows), np.nan)
    for i, row in enumerate(rows.itertuples(index=False)):
        if row.op not in ("attn_prefill", "attn_decode"):
            continue
        head_dim = row.hidden // row.heads
        model = ModelSpec("profile-row", 1, row.hidden, row.heads, row.kv_heads, head_dim, 1, 1)
        block = max(int(row.block_size), 1)
        cost = AttentionCost(model, hw, block, None, int(row.tp), 1)
        batch, ctx = int(row.batch), int(row.context)
        if row.op == "attn_prefill":
            chunk = int(row.tokens)
            f = StepFeatures(batch, batch * chunk, batch * chunk * (2 * ctx + chunk), 0, 0, 0,
                             batch * -(-(ctx + chunk) // block), batch, 1)
        else:
            f = StepFeatures(batch, 0, 0, batch, batch * (ctx + 1), ctx + 1, batch * -(-(ctx + 1) // block),
                             batch, 1)
        out[i] = float(cost.time(f)) * 1e3
    return out
