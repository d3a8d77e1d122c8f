"""paged_prefill_attention against its torch reference."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.kernels import paged_prefill_attention
from kvplan.kernels.reference import ref_paged_prefill_attention
from tests.kernels.kernel_cases import DEVICE, assert_close, paged_kv, randn, release_invisible_blocks

HEAD_DIM = 32


def chunks_for(block_size: int) -> list[tuple[int, int]]:
    """(cached prefix, new chunk) per request: an empty chunk, a one-token chunk with no prefix, a chunk of
    exactly one block, a prefix hit ending on a block boundary, a ragged prefix, a one-token chunk after a
    prefix (a decode step through the prefill path), and a long chunk with no prefix."""
    return [(0, 0), (0, 1), (0, block_size), (block_size, 5), (13, 20), (40, 1), (0, 45)]


MATRIX = [
    pytest.param(bs, group, dtype, id=f"bs{bs}-g{group}-{str(dtype)[6:]}")
    for bs, group, dtype in itertools.product((1, 8, 16, 32), (1, 2, 4), (torch.float32, torch.float16))
]


def run_both(kv, q, chunks: list[tuple[int, int]], dtype: torch.dtype, **kwargs) -> torch.Tensor:
    cu = torch.tensor([0, *itertools.accumulate(c for _, c in chunks)], dtype=torch.int32, device=DEVICE)
    prefix_lens = torch.tensor([p for p, _ in chunks], dtype=torch.int32, device=DEVICE)
    out = paged_prefill_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, cu, prefix_lens, **kv.scales,
                                  **kwargs)
    kwargs.pop("max_query_len", None)
    expected = ref_paged_prefill_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, cu, prefix_lens,
                                           **kv.scales, **kwargs)
    assert_close(out, expected, dtype)
    return out


def make_case(chunks: list[tuple[int, int]], block_size: int, num_kv_heads: int, group: int,
              head_dim: int, cache_dtype: torch.dtype, q_dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    kv = paged_kv([p + c for p, c in chunks], block_size, num_kv_heads, head_dim, cache_dtype, gen,
                  value_dtype=q_dtype)
    q = randn((sum(c for _, c in chunks), num_kv_heads * group, head_dim), q_dtype, gen)
    return kv, q


@pytest.mark.parametrize(("block_size", "group", "dtype"), MATRIX)
def test_matches_reference(block_size: int, group: int, dtype: torch.dtype) -> None:
    chunks = chunks_for(block_size)
    kv, q = make_case(chunks, block_size, 2, group, HEAD_DIM, dtype, dtype, block_size + group)
    run_both(kv, q, chunks, dtype)


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.int8])
def test_quantized_cache(cache_dtype: torch.dtype) -> None:
    chunks = chunks_for(16)
    kv, q = make_case(chunks, 16, 1, 2, HEAD_DIM, cache_dtype, torch.float16, 5)
    run_both(kv, q, chunks, torch.float16)


@pytest.mark.parametrize(("head_dim", "dtype", "group"), [
    (64, torch.float16, 8), (128, torch.float32, 1), (32, torch.bfloat16, 3),
])
def test_head_dims_groups_and_bf16(head_dim: int, dtype: torch.dtype, group: int) -> None:
    chunks = [(0, 9), (16, 17), (5, 2)]
    kv, q = make_case(chunks, 16, 1, group, head_dim, dtype, dtype, head_dim)
    run_both(kv, q, chunks, dtype, scale=0.2, max_query_len=17)


def test_empty_chunks_between_others() -> None:
    """Requests with nothing to compute sit between others in cu_seqlens_q without shifting their rows."""
    chunks = [(4, 0), (0, 3), (0, 0), (9, 2), (5, 0)]
    kv, q = make_case(chunks, 8, 1, 1, HEAD_DIM, torch.float32, torch.float32, 0)
    run_both(kv, q, chunks, torch.float32)


def test_no_requests() -> None:
    kv, q = make_case([], 8, 1, 2, HEAD_DIM, torch.float32, torch.float32, 0)
    empty = torch.empty(0, dtype=torch.int32, device=DEVICE)
    out = paged_prefill_attention(q, kv.k_cache, kv.v_cache, kv.block_tables.reshape(0, 1),
                                  torch.zeros(1, dtype=torch.int32, device=DEVICE), empty)
    assert out.shape == (0, 2, HEAD_DIM)


@pytest.mark.parametrize("block_size", [64, 128, 256])
def test_large_blocks(block_size: int) -> None:
    chunks = [(0, 64), (63, 2), (1, 0)]
    kv, q = make_case(chunks, block_size, 1, 2, HEAD_DIM, torch.float16, torch.float16, block_size)
    run_both(kv, q, chunks, torch.float16)


def windowed_case(chunks: list[tuple[int, int]], block_size: int, group: int, sink: int, window: int,
                  seed: int):
    """A case whose blocks that no chunk query can see are released (poisoned) in the block table."""
    kv, q = make_case(chunks, block_size, 1, group, HEAD_DIM, torch.float32, torch.float32, seed)
    release_invisible_blocks(kv, [p + c for p, c in chunks], sink, window,
                             first_queries=[p for p, _ in chunks])
    return kv, q


@pytest.mark.parametrize(("sink", "window", "block_size"), [(4, 16, 8), (0, 8, 4), (16, 32, 16), (1, 1, 1)])
def test_sink_and_window(sink: int, window: int, block_size: int) -> None:
    chunks = [(0, 0), (0, 1), (0, 40), (48, 3), (30, 20), (60, 1)]
    kv, q = windowed_case(chunks, block_size, 2, sink, window, sink + window)
    run_both(kv, q, chunks, torch.float32, sink_tokens=sink, window_tokens=window)


def test_window_excludes_what_full_attention_sees() -> None:
    """Guards the window tests: with a window the result must differ from full causal attention."""
    chunks = [(30, 20)]
    kv, q = windowed_case(chunks, 8, 1, 0, 0, 3)
    full = run_both(kv, q, chunks, torch.float32)
    windowed = run_both(kv, q, chunks, torch.float32, sink_tokens=2, window_tokens=10)
    assert (full - windowed).abs().max() > 1e-3


@settings(max_examples=12, deadline=None, derandomize=True)
@given(chunks=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 30)), min_size=1, max_size=3),
       block_size=st.sampled_from([1, 2, 4, 16]), group=st.integers(1, 5), sink=st.integers(0, 6),
       window=st.sampled_from([0, 0, 1, 7, 16, 40]))
def test_random_cases(chunks: list[tuple[int, int]], block_size: int, group: int, sink: int,
                      window: int) -> None:
    kv, q = windowed_case(chunks, block_size, group, sink, window, len(chunks))
    run_both(kv, q, chunks, torch.float32, sink_tokens=sink, window_tokens=window)
