"""Paged-cache fixtures for the kernel tests.

Every cache slot that no request owns, every slot past a request's length, and one whole "poison" block
hold NaN (for quantized caches: a NaN scale). Block table padding and released blocks point at the poison
block. A kernel that reads anything the contract says it must not read therefore turns its output NaN, and
the comparison with the reference fails; the Triton interpreter does not catch such reads itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvplan.kernels.quant import is_quantized
from kvplan.kernels.reference import ref_store_kv, visible_positions

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# Tolerances for comparing a kernel's output with the float32 reference computed from the same inputs.
# The kernels compute in float32, so the error is the output's rounding to its dtype (plus, on a GPU, TF32
# rounding of the probabilities for 16-bit caches); bfloat16 also absorbs the interpreter's truncating
# float32 -> bfloat16 store.
TOLERANCE = {
    torch.float32: {"atol": 2e-5, "rtol": 2e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 1.6e-2, "rtol": 1.6e-2},
}


@dataclass(slots=True)
class PagedKV:
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    block_tables: torch.Tensor
    poison_block: int

    @property
    def scales(self) -> dict[str, torch.Tensor | None]:
        return {"k_scale": self.k_scale, "v_scale": self.v_scale}


def empty_cache(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A cache whose every slot reads as NaN: NaN values, or zero values with NaN scales when quantized."""
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    if is_quantized(dtype):
        nan_scales = torch.full(shape[:3], float("nan"), device=DEVICE)
        return torch.zeros(shape, device=DEVICE).to(dtype), nan_scales
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE), None


def slots_of(block_table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    return block_table[positions // block_size].long() * block_size + positions % block_size


def paged_kv(lengths: list[int], block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
             gen: torch.Generator, value_dtype: torch.dtype | None = None) -> PagedKV:
    """Caches holding `lengths[r]` random tokens for request r in randomly placed blocks.

    `value_dtype` is the dtype of the K/V written (the cache's own unless it is quantized)."""
    needed = [-(-n // block_size) for n in lengths]
    num_blocks = sum(needed) + 2
    order = torch.randperm(num_blocks, generator=gen).tolist()
    poison = order.pop()
    width = max(needed, default=0) + 1  # one padding column at least
    tables = torch.full((len(lengths), width), poison, dtype=torch.int32)
    for r, count in enumerate(needed):
        tables[r, :count] = torch.tensor([order.pop() for _ in range(count)], dtype=torch.int32)
    tables = tables.to(DEVICE)
    k_cache, k_scale = empty_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype)
    v_cache, v_scale = empty_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype)
    value_dtype = value_dtype or dtype
    for r, n in enumerate(lengths):
        slots = slots_of(tables[r], torch.arange(n, device=DEVICE), block_size)
        key, value = (torch.randn((n, num_kv_heads, head_dim), generator=gen).to(value_dtype).to(DEVICE)
                      for _ in range(2))
        ref_store_kv(key, value, k_cache, v_cache, slots, k_scale, v_scale)
    return PagedKV(k_cache, v_cache, k_scale, v_scale, tables, poison)


def release_invisible_blocks(kv: PagedKV, lengths: list[int], sink_tokens: int, window_tokens: int,
                             marker: int | None = None, first_queries: list[int] | None = None) -> None:
    """Overwrite the table entries of blocks holding no visible position with `marker` (default: the poison
    block), as the engine releases (and marks -1) blocks that fell out of the sink + window. Visible means
    seen by a query at first_queries[r] … lengths[r]-1 (default: the last position only, as in decode)."""
    block_size = kv.k_cache.shape[1]
    for r, n in enumerate(lengths):
        first = None if first_queries is None else first_queries[r]
        keep = set((visible_positions(n, sink_tokens, window_tokens, first) // block_size).tolist())
        for b in range(-(-n // block_size)):
            if b not in keep:
                kv.block_tables[r, b] = kv.poison_block if marker is None else marker


def randn(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(dtype).to(DEVICE)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(actual.float(), expected.float(), **TOLERANCE[dtype])
