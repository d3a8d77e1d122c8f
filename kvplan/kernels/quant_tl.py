"""Triton device functions for the quantized KV cache (scheme in `kernels.quant`)."""

from __future__ import annotations

import triton
import triton.language as tl

# Adding then subtracting 1.5 * 2**23 leaves a float32 rounded to the nearest integer, ties to even, for
# |y| < 2**22: the addition itself performs the rounding. Used because a rint intrinsic is not available
# identically on the GPU and in the CPU interpreter.
_RNE_MAGIC = tl.constexpr(12582912.0)


@triton.jit
def round_nearest_even(y):
    return (y + _RNE_MAGIC) - _RNE_MAGIC


@triton.jit
def round_to_e4m3_grid(y):
    """Round |y| <= 448 to the nearest float8 e4m3 value, ties to even, staying in float32.

    Converting such a value to float8 is then exact. The explicit rounding exists because the Triton CPU
    interpreter's float32 -> float8 conversion loses the carry into the exponent (31.6 becomes 16).
    """
    bits = y.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 127
    # e4m3 keeps 3 mantissa bits; below the smallest normal (2**-6) the spacing stays 2**-9.
    ulp_exponent = tl.maximum(exponent, -6) - 3
    ulp = ((ulp_exponent + 127) << 23).to(tl.float32, bitcast=True)
    return round_nearest_even(y / ulp) * ulp


@triton.jit
def quantize_rows(x, QMAX: tl.constexpr, IS_INT8: tl.constexpr):
    """Quantize each row of the float32 tile `x[rows, head_dim]`; returns (float32 values on the target
    grid, float32 scale per row)."""
    amax = tl.max(tl.abs(x), axis=1)
    scale = tl.where(amax > 0, amax / QMAX, 1.0)
    y = tl.minimum(tl.maximum(x / scale[:, None], -QMAX), QMAX)
    y = round_nearest_even(y) if IS_INT8 else round_to_e4m3_grid(y)
    return y, scale


@triton.jit
def load_rows(cache_ptr, scale_ptr, row_offsets, scale_offsets, dims, mask, QUANT: tl.constexpr):
    """Load cache rows `[n, head_dim]` at element offsets `row_offsets[n]` as float32, dequantizing with the
    scales at `scale_offsets[n]` when the cache is quantized. Masked rows read as zero."""
    rows = tl.load(cache_ptr + row_offsets[:, None] + dims[None, :], mask=mask[:, None], other=0.0)
    rows = rows.to(tl.float32)
    if QUANT:
        scale = tl.load(scale_ptr + scale_offsets, mask=mask, other=0.0)
        rows = rows * scale[:, None]
    return rows
