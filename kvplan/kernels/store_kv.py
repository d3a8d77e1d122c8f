"""`store_kv`: write new K/V rows into their paged-cache slots, optionally quantizing them.

One program per token writes that token's rows for every KV head. A contiguous cache
`[num_blocks, block_size, num_kv_heads, head_dim]` stores slot s = block * block_size + offset at element
s * num_kv_heads * head_dim, so the slot alone addresses the row and the kernel needs no block size.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvplan.kernels.checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    QUANT_DTYPES,
    check_kv_cache,
    check_same_device,
    check_scales,
    check_shape,
    check_tensor,
)
from kvplan.kernels.quant import QMAX
from kvplan.kernels.quant_tl import quantize_rows


@triton.jit
def _store_rows(src_ptr, stride_t, stride_h, token, cache_ptr, scale_ptr, slot, heads, dims, mask,
                NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                QUANT: tl.constexpr, QMAX: tl.constexpr, IS_INT8: tl.constexpr):
    x = tl.load(src_ptr + token * stride_t + heads[:, None] * stride_h + dims[None, :],
                mask=mask[:, None], other=0.0).to(tl.float32)
    scale_row = slot * NUM_KV_HEADS + heads
    if QUANT:
        x, scale = quantize_rows(x, QMAX, IS_INT8)
        tl.store(scale_ptr + scale_row, scale, mask=mask)
    tl.store(cache_ptr + scale_row[:, None] * HEAD_DIM + dims[None, :], x.to(cache_ptr.dtype.element_ty),
             mask=mask[:, None])


@triton.jit
def _store_kv_kernel(key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, slot_ptr,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                     QUANT: tl.constexpr, QMAX: tl.constexpr, IS_INT8: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, HEAD_DIM)
    mask = (heads < NUM_KV_HEADS) & (slot >= 0)  # a negative slot marks a padding token: write nothing
    _store_rows(key_ptr, stride_kt, stride_kh, token, k_cache_ptr, k_scale_ptr, slot, heads, dims, mask,
                NUM_KV_HEADS, HEAD_DIM, QUANT, QMAX, IS_INT8)
    _store_rows(value_ptr, stride_vt, stride_vh, token, v_cache_ptr, v_scale_ptr, slot, heads, dims, mask,
                NUM_KV_HEADS, HEAD_DIM, QUANT, QMAX, IS_INT8)


def _check(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
           slot_mapping: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None) -> bool:
    check_kv_cache(k_cache, v_cache, FLOAT_DTYPES + QUANT_DTYPES)
    quantized = check_scales(k_cache, k_scale, v_scale)
    _, _, num_kv_heads, head_dim = k_cache.shape
    check_tensor("key", key, 3, FLOAT_DTYPES if quantized else (k_cache.dtype,))
    check_shape("key", key, (None, num_kv_heads, head_dim))
    check_tensor("value", value, 3, (key.dtype,))
    check_shape("value", value, tuple(key.shape))
    check_tensor("slot_mapping", slot_mapping, 1, INDEX_DTYPES)
    check_shape("slot_mapping", slot_mapping, (key.shape[0],))
    check_same_device(key=key, value=value, k_cache=k_cache, slot_mapping=slot_mapping)
    return quantized


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, k_scale: torch.Tensor | None = None,
             v_scale: torch.Tensor | None = None) -> None:
    """Write `key`/`value` `[num_tokens, num_kv_heads, head_dim]` into the caches at `slot_mapping`.

    Slots below zero are padding and are skipped. For a float8_e4m3fn or int8 cache the rows are quantized
    per token per head and their scales written to `k_scale`/`v_scale` (see `kernels.quant`); otherwise the
    inputs must already have the cache's dtype. Slots must be distinct: two tokens writing one slot race.
    """
    quantized = _check(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, k_scale, v_scale, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_H=triton.next_power_of_2(num_kv_heads),
        QUANT=quantized, QMAX=QMAX.get(k_cache.dtype, 1.0), IS_INT8=k_cache.dtype == torch.int8,
        num_warps=4 if num_kv_heads * head_dim >= 1024 else 1,
    )
