"""paged_decode_attention against its torch reference."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.kernels import choose_num_splits, paged_decode_attention
from kvplan.kernels.reference import ref_paged_decode_attention
from tests.kernels.kernel_cases import DEVICE, TOLERANCE, assert_close, paged_kv, randn, release_invisible_blocks

HEAD_DIM = 32


def lengths_for(block_size: int) -> list[int]:
    """Ragged contexts: empty, one token, exact block boundaries (1 and 2 blocks), and ragged ones ≤ 70."""
    return [0, 1, block_size, 2 * block_size, 37, 70]


# Block size × GQA ratio × dtype in full; the split count alternates so both paths meet every block size.
MATRIX = [
    pytest.param(bs, group, dtype, 1 + 2 * (i % 2), id=f"bs{bs}-g{group}-{str(dtype)[6:]}-s{1 + 2 * (i % 2)}")
    for i, (bs, group, dtype) in enumerate(itertools.product((1, 8, 16, 32), (1, 2, 4),
                                                             (torch.float32, torch.float16)))
]


def run_both(kv, q, lengths: list[int], dtype: torch.dtype, **kwargs) -> None:
    context_lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    out = paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, context_lens, **kv.scales,
                                 **kwargs)
    kwargs.pop("num_splits", None)
    expected = ref_paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, context_lens,
                                          **kv.scales, **kwargs)
    assert_close(out, expected, dtype)


@pytest.mark.parametrize(("block_size", "group", "dtype", "num_splits"), MATRIX)
def test_matches_reference(block_size: int, group: int, dtype: torch.dtype, num_splits: int) -> None:
    gen = torch.Generator().manual_seed(block_size * 10 + group)
    lengths = lengths_for(block_size)
    kv = paged_kv(lengths, block_size, 2, HEAD_DIM, dtype, gen)
    q = randn((len(lengths), 2 * group, HEAD_DIM), dtype, gen)
    run_both(kv, q, lengths, dtype, num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [2, 5, 16])
def test_split_counts_agree(num_splits: int) -> None:
    """More splits than tiles leaves some splits empty; the merge must ignore them."""
    gen = torch.Generator().manual_seed(num_splits)
    lengths = [0, 3, 64, 70]
    kv = paged_kv(lengths, 8, 1, HEAD_DIM, torch.float32, gen)
    q = randn((len(lengths), 3, HEAD_DIM), torch.float32, gen)  # GQA 3: a group that is no power of two
    run_both(kv, q, lengths, torch.float32, num_splits=num_splits)


@pytest.mark.parametrize(("sink", "window", "block_size", "num_splits"), [
    (4, 16, 8, 1), (4, 16, 8, 3), (0, 8, 16, 2), (16, 32, 16, 1), (1, 1, 1, 2), (8, 100, 8, 1),
])
def test_sink_and_window(sink: int, window: int, block_size: int, num_splits: int) -> None:
    """Only sink + window positions count, and blocks holding neither are released (poisoned) in the table."""
    gen = torch.Generator().manual_seed(sink + window)
    lengths = [0, 1, 5, sink + window, 2 * block_size, 70]
    kv = paged_kv(lengths, block_size, 2, HEAD_DIM, torch.float32, gen)
    release_invisible_blocks(kv, lengths, sink, window)
    q = randn((len(lengths), 4, HEAD_DIM), torch.float32, gen)
    run_both(kv, q, lengths, torch.float32, num_splits=num_splits, sink_tokens=sink, window_tokens=window)


def test_window_excludes_what_full_attention_sees() -> None:
    """Guards the window test itself: with a window the result must differ from full attention."""
    gen = torch.Generator().manual_seed(7)
    lengths = [70]
    kv = paged_kv(lengths, 8, 1, HEAD_DIM, torch.float32, gen)
    q = randn((1, 1, HEAD_DIM), torch.float32, gen)
    context_lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    full = paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, context_lens)
    windowed = paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, context_lens,
                                      sink_tokens=4, window_tokens=16)
    assert (full - windowed).abs().max() > 1e-3


@pytest.mark.parametrize(("cache_dtype", "block_size", "num_splits"), [
    (torch.float8_e4m3fn, 16, 1), (torch.int8, 8, 3), (torch.int8, 1, 1), (torch.float8_e4m3fn, 32, 2),
])
def test_quantized_cache(cache_dtype: torch.dtype, block_size: int, num_splits: int) -> None:
    gen = torch.Generator().manual_seed(block_size)
    lengths = lengths_for(block_size)
    kv = paged_kv(lengths, block_size, 2, HEAD_DIM, cache_dtype, gen, value_dtype=torch.float16)
    q = randn((len(lengths), 4, HEAD_DIM), torch.float16, gen)
    run_both(kv, q, lengths, torch.float16, num_splits=num_splits)


@pytest.mark.parametrize(("head_dim", "dtype", "group"), [
    (64, torch.float16, 2), (128, torch.float32, 1), (32, torch.bfloat16, 2), (32, torch.float32, 8),
])
def test_head_dims_and_bf16(head_dim: int, dtype: torch.dtype, group: int) -> None:
    gen = torch.Generator().manual_seed(head_dim)
    lengths = [1, 16, 33]
    kv = paged_kv(lengths, 16, 1, head_dim, dtype, gen)
    q = randn((len(lengths), group, head_dim), dtype, gen)
    run_both(kv, q, lengths, dtype, num_splits=2, scale=0.3)


def test_writes_into_given_out_and_strided_q() -> None:
    gen = torch.Generator().manual_seed(3)
    lengths = [9, 20]
    kv = paged_kv(lengths, 8, 2, HEAD_DIM, torch.float32, gen)
    q = randn((2, 8, HEAD_DIM), torch.float32, gen)[:, ::2]  # heads strided: only the last dim is contiguous
    out = torch.full((2, 4, HEAD_DIM), float("nan"), device=DEVICE)
    result = paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables,
                                    torch.tensor(lengths, dtype=torch.int32, device=DEVICE), out=out)
    assert result is out
    expected = ref_paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables,
                                          torch.tensor(lengths, dtype=torch.int32, device=DEVICE))
    torch.testing.assert_close(out, expected, **TOLERANCE[torch.float32])


@pytest.mark.parametrize("block_size", [64, 128, 256])
def test_large_blocks(block_size: int) -> None:
    gen = torch.Generator().manual_seed(block_size)
    lengths = [0, 1, 63, 64, 65]
    kv = paged_kv(lengths, block_size, 1, HEAD_DIM, torch.float16, gen)
    q = randn((len(lengths), 2, HEAD_DIM), torch.float16, gen)
    run_both(kv, q, lengths, torch.float16, num_splits=2)


def test_minus_one_table_entries() -> None:
    """The engine's own markers: -1 for padding and for blocks released outside sink + window."""
    gen = torch.Generator().manual_seed(11)
    lengths = [0, 30, 70]
    kv = paged_kv(lengths, 8, 2, HEAD_DIM, torch.float32, gen)
    kv.block_tables[kv.block_tables == kv.poison_block] = -1
    release_invisible_blocks(kv, lengths, 4, 20, marker=-1)
    q = randn((len(lengths), 2, HEAD_DIM), torch.float32, gen)
    run_both(kv, q, lengths, torch.float32, num_splits=2, sink_tokens=4, window_tokens=20)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(lengths=st.lists(st.integers(0, 70), min_size=1, max_size=4),
       block_size=st.sampled_from([1, 2, 4, 8, 32]), group=st.integers(1, 4), num_splits=st.integers(1, 4),
       sink=st.integers(0, 8), window=st.integers(0, 40))
def test_random_cases(lengths: list[int], block_size: int, group: int, num_splits: int, sink: int,
                      window: int) -> None:
    gen = torch.Generator().manual_seed(len(lengths) * 100 + block_size)
    kv = paged_kv(lengths, block_size, 1, HEAD_DIM, torch.float32, gen)
    release_invisible_blocks(kv, lengths, sink, window)
    q = randn((len(lengths), group, HEAD_DIM), torch.float32, gen)
    run_both(kv, q, lengths, torch.float32, num_splits=num_splits, sink_tokens=sink, window_tokens=window)


@pytest.mark.parametrize(("seqs", "kv_heads", "context", "sms", "expected"), [
    (64, 8, 4096, 132, 1),  # 512 programs already cover the GPU
    (1, 8, 4096, 132, 16),  # capped by 256 tokens per split
    (1, 8, 32768, 132, 33),  # two waves of 132 SMs
    (2, 8, 100, 132, 1),  # too short to split
    (1, 1, 10**6, 10**4, 64),  # capped by MAX_SPLITS
])
def test_choose_num_splits(seqs: int, kv_heads: int, context: int, sms: int, expected: int) -> None:
    assert choose_num_splits(seqs, kv_heads, context, sms) == expected
