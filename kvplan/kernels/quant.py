"""Quantized KV cache: fp8 (e4m3) or int8 with one fp32 scale per token per KV head.

Scheme (symmetric, per token per head): for the row x = K[token, head, :],
    scale = max|x| / QMAX   (1.0 for an all-zero row),   q = round_nearest_even(x / scale) clamped to ±QMAX,
and x ≈ q * scale. QMAX is 448 for float8_e4m3fn and 127 for int8. Scales live beside the cache in a
contiguous float32 tensor `[num_blocks, block_size, num_kv_heads]`, addressed by the same slot as the row.

Why per token per head rather than per block: `store_kv` writes one token at a time into a block that may
already hold other tokens; a per-block scale would force re-quantizing those tokens whenever the block's
maximum grows. Per-row scales cost 4 bytes per head_dim (≤ 6% at head_dim 64 with fp8) and never rewrite.
"""

from __future__ import annotations

import torch

from kvplan.kernels.checks import QUANT_DTYPES

# Largest magnitude of each quantized dtype, in the order of QUANT_DTYPES (float8_e4m3fn, int8).
QMAX = dict(zip(QUANT_DTYPES, (448.0, 127.0), strict=True))


def is_quantized(dtype: torch.dtype) -> bool:
    return dtype in QMAX


def make_scales(cache: torch.Tensor) -> torch.Tensor:
    """Scale tensor for a quantized cache `[num_blocks, block_size, num_kv_heads, head_dim]`."""
    return torch.ones(cache.shape[:3], dtype=torch.float32, device=cache.device)


def quantize_rows(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize `x[..., head_dim]` row by row; returns (values in `dtype`, float32 scales `x.shape[:-1]`)."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / QMAX[dtype], torch.ones_like(amax))
    y = (xf / scale[..., None]).clamp(-QMAX[dtype], QMAX[dtype])
    q = y.round().to(dtype) if dtype == torch.int8 else y.to(dtype)  # both round to nearest even
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale[..., None]
