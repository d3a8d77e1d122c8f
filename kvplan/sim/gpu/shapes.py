"""What one per-layer op computes or moves, from its shape: a projection's per-rank weight (K × N) and an
element-wise op's bytes per token. The profile rows (`sim.gpu.profiles`) and the step cost (`AnalyticCost`) both
ask here, so an op is priced from the same arithmetic whether it is validated or simulated.

Per-rank shapes with h hidden, d = h / heads head_dim, i intermediate, TP degree t, KV heads per rank
max(kv // t, 1) (a KV head is replicated when there are fewer than ranks):
- attn_pre_proj (q, k, v): K = h, N = (heads / t + 2 × kv per rank) × d;
- attn_post_proj (o): K = heads × d / t, N = h;
- mlp_up_proj (gate and up fused, or up alone): K = h, N = (2 or 1) × i / t;  mlp_down_proj: K = i / t, N = h.
Element-wise bytes per token (read + written, 2-byte elements): a norm reads and writes h (2h), the residual
add reads two and writes one (3h), RoPE reads and writes q and k of the rank's heads, SiLU-and-multiply reads
2i / t and writes i / t (a plain activation: 2i / t in all), the embedding gather reads and writes one row (2h).
"""

from __future__ import annotations

import numpy as np


def gemm_dims(op: str, hidden, heads, kv_heads, intermediate, gated, tp):
    """(K, N) of one rank's weight for projection `op` (numbers or arrays)."""
    d = hidden // heads
    kv = np.maximum(kv_heads // tp, 1)
    if op == "attn_pre_proj":
        return hidden, (heads // tp + 2 * kv) * d
    if op == "attn_post_proj":
        return heads // tp * d, hidden
    if op == "mlp_up_proj":
        return hidden, np.where(gated, 2, 1) * intermediate // tp
    if op == "mlp_down_proj":
        return intermediate // tp, hidden
    raise KeyError(op)


def elementwise_elements(op: str, hidden, heads, kv_heads, intermediate, gated, tp):
    """Elements one token's `op` reads and writes on one rank (numbers or arrays)."""
    if op in ("input_layernorm", "post_attention_layernorm", "emb"):
        return 2 * hidden
    if op == "add":
        return 3 * hidden
    if op == "attn_rope":
        return 2 * (heads // tp + np.maximum(kv_heads // tp, 1)) * (hidden // heads)
    if op == "mlp_act":
        return np.where(gated, 3, 2) * intermediate // tp
    raise KeyError(op)
