"""The wrappers reject bad arguments with a ValueError naming the argument and what is allowed."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kvplan.kernels import make_scales, paged_decode_attention, paged_prefill_attention, store_kv
from tests.kernels.kernel_cases import DEVICE

I32 = torch.int32


def cache(block_size: int = 8, heads: int = 2, head_dim: int = 32, dtype: torch.dtype = torch.float32,
          num_blocks: int = 4) -> torch.Tensor:
    return torch.zeros((num_blocks, block_size, heads, head_dim), dtype=dtype, device=DEVICE)


def ints(*values: int, dtype: torch.dtype = I32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=DEVICE)


def decode(q: torch.Tensor | None = None, k: torch.Tensor | None = None, tables: torch.Tensor | None = None,
           lens: torch.Tensor | None = None, **kwargs) -> Callable[[], object]:
    q = torch.zeros((2, 4, 32), device=DEVICE) if q is None else q
    k = cache() if k is None else k
    tables = torch.zeros((2, 3), dtype=I32, device=DEVICE) if tables is None else tables
    lens = ints(1, 2) if lens is None else lens
    return lambda: paged_decode_attention(q, k, k.clone(), tables, lens, **kwargs)


def prefill(q: torch.Tensor | None = None, cu: torch.Tensor | None = None, **kwargs) -> Callable[[], object]:
    q = torch.zeros((3, 4, 32), device=DEVICE) if q is None else q
    cu = ints(0, 1, 3) if cu is None else cu
    k = cache()
    return lambda: paged_prefill_attention(q, k, k.clone(), torch.zeros((2, 3), dtype=I32, device=DEVICE), cu,
                                           ints(0, 4), **kwargs)


def store(key: torch.Tensor | None = None, k: torch.Tensor | None = None, slots: torch.Tensor | None = None,
          **kwargs) -> Callable[[], object]:
    key = torch.zeros((2, 2, 32), device=DEVICE) if key is None else key
    k = cache() if k is None else k
    slots = ints(0, 5, dtype=torch.int64) if slots is None else slots
    return lambda: store_kv(key, key, k, k.clone(), slots, **kwargs)


BAD = [
    (decode(q=torch.zeros((2, 4, 32), dtype=torch.float16, device=DEVICE)), "q: dtype float16 not allowed"),
    (decode(q=torch.zeros((2, 4, 64), device=DEVICE)), r"q: expected shape \(\*, \*, 32\)"),
    (decode(q=torch.zeros((2, 3, 32), device=DEVICE)), "multiple of num_kv_heads"),
    (decode(q=torch.zeros((2, 32, 32), device=DEVICE)), "allowed 1 to 8"),
    (decode(q=torch.zeros((2, 4, 64), device=DEVICE)[..., ::2]), "q: the last dimension must have stride 1"),
    (decode(k=cache(block_size=3)), "block_size 3 not allowed"),
    (decode(k=cache(block_size=512)), "block_size 512 not allowed"),
    (decode(k=cache(head_dim=48), q=torch.zeros((2, 4, 48), device=DEVICE)), "head_dim 48 not supported"),
    (decode(k=cache().transpose(0, 1)), "k_cache: must be contiguous"),
    (decode(k=cache(dtype=torch.int8)), "k_scale: required"),
    (decode(tables=torch.zeros((2, 3), dtype=torch.int64, device=DEVICE)), "block_tables: dtype int64"),
    (decode(tables=torch.zeros((3, 3), dtype=I32, device=DEVICE)), r"block_tables: expected shape \(2, \*\)"),
    (decode(lens=ints(1)), r"context_lens: expected shape \(2,\)"),
    (decode(num_splits=0), "num_splits: 0 out of range"),
    (decode(window_tokens=-1), "window_tokens: -1 out of range"),
    (decode(max_context_len=25), "max_context_len: 25 out of range; allowed 0 to 24"),
    (decode(out=torch.zeros((2, 4, 16), device=DEVICE)), "out: expected shape"),
    (decode(k_scale=make_scales(cache()), v_scale=make_scales(cache())), "not quantized"),
    (prefill(cu=ints(0, 3)), r"cu_seqlens_q: expected shape \(3,\)"),
    (prefill(cu=torch.tensor([0, 1, 3], device=DEVICE)), "cu_seqlens_q: dtype int64 not allowed"),
    (prefill(max_query_len=-1), "max_query_len: -1 out of range"),
    (store(key=torch.zeros((2, 2, 32), dtype=torch.float16, device=DEVICE)), "key: dtype float16"),
    (store(slots=ints(0, 1, 2, dtype=torch.int64)), r"slot_mapping: expected shape \(2,\)"),
    (store(slots=torch.zeros(2, device=DEVICE)), "slot_mapping: dtype float32 not allowed"),
    (store(k=cache(dtype=torch.int8), k_scale=make_scales(cache(dtype=torch.int8)),
           v_scale=torch.ones((4, 8, 2), dtype=torch.float16, device=DEVICE)), "v_scale: dtype float16"),
    (store(key=torch.zeros((2, 2, 32), device=DEVICE), k=cache(dtype=torch.int8),
           k_scale=make_scales(cache(dtype=torch.int8)), v_scale=make_scales(cache(num_blocks=5))),
     r"v_scale: expected shape \(4, 8, 2\)"),
]


@pytest.mark.parametrize(("call", "message"), BAD, ids=[m for _, m in BAD])
def test_rejects(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_quantized_cache_accepts_any_float_queries() -> None:
    k = cache(dtype=torch.float8_e4m3fn)
    out = paged_decode_attention(torch.zeros((2, 4, 32), dtype=torch.bfloat16, device=DEVICE), k, k.clone(),
                                 torch.zeros((2, 3), dtype=I32, device=DEVICE), ints(0, 0),
                                 k_scale=make_scales(k), v_scale=make_scales(k))
    assert out.dtype == torch.bfloat16 and bool((out == 0).all())
