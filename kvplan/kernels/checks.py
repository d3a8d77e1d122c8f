"""Argument validation for the kernel wrappers.

A Triton kernel given a tensor of the wrong shape, dtype, device or layout reads garbage or faults far
from the cause; every wrapper therefore checks its arguments here first and raises a `ValueError` that
names the argument, what it got and what is allowed. These checks look at metadata only: none of them
reads tensor values, so none forces a device synchronisation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
QUANT_DTYPES = (torch.float8_e4m3fn, torch.int8)  # scheme in kernels.quant
INDEX_DTYPES = (torch.int32, torch.int64)
HEAD_DIMS = (16, 32, 64, 128, 256)
MAX_BLOCK_SIZE = 256


def _names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(name: str, t: object, ndim: int, dtypes: Sequence[torch.dtype]) -> torch.Tensor:
    """`t` is a tensor with `ndim` dimensions, one of `dtypes`, and a unit-stride last dimension."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name}: dtype {_names([t.dtype])} not allowed; allowed: {_names(dtypes)}")
    if t.numel() and t.stride(-1) != 1:
        raise ValueError(f"{name}: the last dimension must have stride 1, got strides {t.stride()}")
    return t


def check_contiguous(name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous, got shape {tuple(t.shape)} strides {t.stride()}")


def check_shape(name: str, t: torch.Tensor, expected: Sequence[int | None]) -> None:
    """Compare `t.shape` with `expected`, where None accepts any size in that dimension."""
    same_rank = len(expected) == t.dim()
    if not same_rank or any(e is not None and e != s for e, s in zip(expected, t.shape, strict=True)):
        want = ", ".join("*" if e is None else str(e) for e in expected)
        raise ValueError(f"{name}: expected shape ({want}{',' if len(expected) == 1 else ''}), "
                         f"got {tuple(t.shape)} (* = any size)")


def check_same_device(**tensors: torch.Tensor | None) -> None:
    present = {name: t for name, t in tensors.items() if t is not None}
    devices = {t.device for t in present.values()}
    if len(devices) > 1:
        listing = ", ".join(f"{name} on {t.device}" for name, t in present.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")


def check_kv_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, allowed: Sequence[torch.dtype]) -> None:
    """Paged caches are `[num_blocks, block_size, num_kv_heads, head_dim]`, contiguous, K and V alike."""
    check_tensor("k_cache", k_cache, 4, allowed)
    check_tensor("v_cache", v_cache, 4, allowed)
    check_shape("v_cache", v_cache, tuple(k_cache.shape))
    if v_cache.dtype != k_cache.dtype:
        raise ValueError(f"v_cache: dtype {_names([v_cache.dtype])} differs from k_cache's "
                         f"{_names([k_cache.dtype])}")
    check_contiguous("k_cache", k_cache)
    check_contiguous("v_cache", v_cache)
    block_size, head_dim = k_cache.shape[1], k_cache.shape[3]
    if block_size < 1 or block_size > MAX_BLOCK_SIZE or block_size & (block_size - 1):
        raise ValueError(f"k_cache: block_size {block_size} not allowed; allowed: powers of two from 1 to "
                         f"{MAX_BLOCK_SIZE}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"k_cache: head_dim {head_dim} not supported; allowed: {HEAD_DIMS}")


def check_group(num_heads: int, num_kv_heads: int, max_group: int = 8) -> int:
    """Return query heads per KV head (GQA ratio), 1 to `max_group`."""
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads}")
    group = num_heads // num_kv_heads
    if group > max_group:
        raise ValueError(f"query heads per KV head is {group}; allowed 1 to {max_group}")
    return group


def check_int(name: str, value: int, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected an int, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bound = f"{low} to {high}" if high is not None else f">= {low}"
        raise ValueError(f"{name}: {value} out of range; allowed {bound}")
    return value


def check_out(out: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """Return `out` after checking it matches `like` in shape, dtype and device, or a new tensor."""
    if out is None:
        return torch.empty_like(like)
    check_tensor("out", out, like.dim(), (like.dtype,))
    check_shape("out", out, tuple(like.shape))
    check_same_device(out=out, q=like)
    return out


def check_scales(cache: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None) -> bool:
    """Validate the scales that go with `cache`; returns whether the cache is quantized."""
    if cache.dtype not in QUANT_DTYPES:
        if k_scale is not None or v_scale is not None:
            raise ValueError(f"k_scale/v_scale given but the cache dtype {cache.dtype} is not quantized "
                             f"(quantized dtypes: float8_e4m3fn, int8)")
        return False
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if s is None:
            raise ValueError(f"{name}: required for a {cache.dtype} cache (see kernels.quant.make_scales)")
        check_tensor(name, s, 3, (torch.float32,))
        check_shape(name, s, tuple(cache.shape[:3]))
        check_contiguous(name, s)
        check_same_device(**{name: s, "k_cache": cache})
    return True


def check_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    num_seqs: int, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None) -> bool:
    """Checks shared by the attention kernels; returns whether the cache is quantized."""
    check_kv_cache(k_cache, v_cache, FLOAT_DTYPES + QUANT_DTYPES)
    quantized = check_scales(k_cache, k_scale, v_scale)
    check_tensor("q", q, 3, FLOAT_DTYPES if quantized else (k_cache.dtype,))
    check_shape("q", q, (None, None, k_cache.shape[3]))
    check_group(q.shape[1], k_cache.shape[2])
    check_tensor("block_tables", block_tables, 2, (torch.int32,))
    check_shape("block_tables", block_tables, (num_seqs, None))
    return quantized
