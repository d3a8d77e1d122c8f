"""The analytic per-op times next to Vidur's measured A100 profiles (github.com/microsoft/vidur, MIT).

Vidur times each per-layer operation of a model at a number of tokens and a tensor-parallel degree
(`mlp.csv`: the QKV and output projections, the MLP up (gate + up fused) and down projections, the norms, RoPE, the
activation and the residual add), and the collectives by message size (`all_reduce.csv`, `send_recv.csv`; sizes
in bytes: read as fp16 elements, the 8-GPU all-reduce would beat the NVLink's 300 GB/s, which no ring can), in
milliseconds. The analytic model prices each op the way `AnalyticCost` prices the step it is part of:
- a projection of K × N weights (N split over the TP ranks) over M tokens: max(2 M' K N / (peak × compute
  efficiency), K N × 2 bytes / (HBM × memory efficiency)), M' = M in whole GEMM tiles;
- an element-wise op: the bytes `elementwise_bytes_per_token` counts for it, at memory efficiency;
- collectives: `sim.cost.parallel` at the A100 node's link bandwidth, link efficiency and latency.
`error_table` gives the median and p90 |error| per op family and TP degree (or GPU count), the table of
docs/parallel_validation.md; the tests recompute it from the project's copy of the rows (tests/sim/data).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvplan.sim.cost.analytic import AnalyticCost
from kvplan.sim.cost.parallel import allreduce_time, send_recv_time
from kvplan.sim.specs.hardware import get_hardware
from kvplan.sim.specs.models import get_model

HARDWARE = "a100-80gb"  # Vidur's A100 profiles: the 80 GB SXM part
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS = ("input_layernorm", "attn_rope", "mlp_act", "add")
FAMILY = {"attn_pre_proj": "qkv projection", "attn_post_proj": "output projection", "mlp_up_proj": "MLP up+gate",
          "mlp_down_proj": "MLP down", "input_layernorm": "element-wise", "attn_rope": "element-wise",
          "mlp_act": "element-wise", "add": "element-wise"}


def _gemm_shape(op: str, row: pd.Series) -> tuple[int, int]:
    """(K, N) of one rank's weight for `op` in a Vidur mlp.csv row."""
    h, heads, kv, inter, tp = (int(row[k]) for k in ("n_embd", "n_head", "n_kv_head", "n_expanded_embd",
                                                     "num_tensor_parallel_workers"))
    hd = h // heads
    return {"attn_pre_proj": (h, (heads + 2 * kv) * hd // tp), "attn_post_proj": (heads * hd // tp, h),
            "mlp_up_proj": (h, 2 * inter // tp), "mlp_down_proj": (inter // tp, h)}[op]


def _elementwise_bytes(op: str, row: pd.Series) -> float:
    """Bytes (fp16) the element-wise op reads and writes per token, as `elementwise_bytes_per_token` counts."""
    h, heads, kv, inter, tp = (int(row[k]) for k in ("n_embd", "n_head", "n_kv_head", "n_expanded_embd",
                                                     "num_tensor_parallel_workers"))
    hd = h // heads
    elements = {"input_layernorm": 2 * h, "add": 3 * h, "attn_rope": 2 * (heads // tp + max(kv // tp, 1)) * hd,
                "mlp_act": 3 * inter // tp}[op]
    return 2.0 * elements


def compute_predictions(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (profile row, op): measured and analytic milliseconds."""
    cost = AnalyticCost(get_model("llama-3-8b"), get_hardware(HARDWARE), 16)  # the defaults' rates
    flop_rate = cost.hardware.peak_flops * cost.compute_efficiency
    byte_rate = cost.hardware.hbm_bandwidth * cost.memory_efficiency
    out = []
    for _, row in rows.iterrows():
        tokens, tile = int(row["num_tokens"]), cost.gemm_tile_rows
        for op in (*GEMM_OPS, *ELEMENTWISE_OPS):
            if op in GEMM_OPS:
                k, n = _gemm_shape(op, row)
                padded = -(-tokens // tile) * tile
                seconds = max(2.0 * padded * k * n / flop_rate, 2.0 * k * n / byte_rate)
            else:
                seconds = tokens * _elementwise_bytes(op, row) / byte_rate
            out.append({"model": row["model"], "op": op, "family": FAMILY[op], "tokens": tokens,
                        "degree": int(row["num_tensor_parallel_workers"]),
                        "measured_ms": float(row[f"time_stats.{op}.median"]), "analytic_ms": seconds * 1e3})
    return pd.DataFrame(out)


def collective_predictions(rows: pd.DataFrame) -> pd.DataFrame:
    """Measured and analytic milliseconds of each all-reduce (one node) and send/recv row."""
    cost = AnalyticCost(get_model("llama-3-8b"), get_hardware(HARDWARE), 16)
    hw, eff = cost.hardware, cost.link_efficiency
    out = []
    for _, row in rows.iterrows():
        size, n = float(row["size"]), int(row["num_workers"])
        if row["collective"] == "all_reduce":
            family, seconds = "all-reduce", allreduce_time(size, n, hw, eff)
        else:
            across = int(row["devices_per_node"]) == 1  # two nodes, one GPU each
            family = "send/recv across nodes" if across else "send/recv in a node"
            seconds = send_recv_time(size, hw, cost.p2p_efficiency, across)
        out.append({"op": row["collective"], "family": family, "bytes": size, "degree": n,
                    "measured_ms": float(row[f"time_stats.{row['collective']}.median"]),
                    "analytic_ms": seconds * 1e3})
    return pd.DataFrame(out)


def error_table(predictions: pd.DataFrame) -> pd.DataFrame:
    """Median and p90 |analytic − measured| / measured per op family and degree, with the row count."""
    err = (predictions["analytic_ms"] - predictions["measured_ms"]).abs() / predictions["measured_ms"]
    frame = predictions.assign(abs_error=err)
    table = frame.groupby(["family", "degree"], sort=False)["abs_error"].agg(
        rows="size", median=lambda e: float(np.median(e)), p90=lambda e: float(np.quantile(e, 0.9)))
    return table.reset_index()


def markdown(table: pd.DataFrame, degree_name: str) -> str:
    lines = [f"| op family | {degree_name} | rows | median abs error | p90 abs error |", "|---|---|---|---|---|"]
    lines += [f"| {r.family} | {r.degree} | {r.rows} | {r.median:.1%} | {r.p90:.1%} |" for r in table.itertuples()]
    return "\n".join(lines)
