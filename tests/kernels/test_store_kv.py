"""store_kv against its torch reference, and the quantization scheme itself."""

from __future__ import annotations

import pytest
import torch

from kvplan.kernels import QMAX, store_kv
from kvplan.kernels.quant import dequantize, quantize_rows
from kvplan.kernels.reference import ref_store_kv
from tests.kernels.kernel_cases import DEVICE, empty_cache, randn

NUM_BLOCKS = 6


def store_both(block_size: int, num_kv_heads: int, head_dim: int, cache_dtype: torch.dtype,
               src_dtype: torch.dtype, slots: list[int], seed: int):
    """Run the kernel and the reference on identical NaN-filled caches; return both (cache, scale) pairs."""
    gen = torch.Generator().manual_seed(seed)
    key, value = (randn((len(slots), num_kv_heads, head_dim), src_dtype, gen) for _ in range(2))
    slot_mapping = torch.tensor(slots, dtype=torch.int64, device=DEVICE)
    results = []
    for fn in (store_kv, ref_store_kv):
        (k_cache, k_scale), (v_cache, v_scale) = (
            empty_cache(NUM_BLOCKS, block_size, num_kv_heads, head_dim, cache_dtype) for _ in range(2))
        fn(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
        results.append((k_cache, v_cache, k_scale, v_scale))
    return results


def spread_slots(block_size: int, count: int) -> list[int]:
    """`count` distinct slots scattered over the cache, with padding (-1) mixed in."""
    total = NUM_BLOCKS * block_size
    slots = [(7 * i + 3) % total for i in range(min(count, total))]
    return [s if i % 4 != 2 else -1 for i, s in enumerate(slots)]


@pytest.mark.parametrize("block_size", [1, 8, 16, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_float_cache_is_exact(block_size: int, dtype: torch.dtype) -> None:
    got, expected = store_both(block_size, 3, 32, dtype, dtype, spread_slots(block_size, 11), block_size)
    for g, e in zip(got[:2], expected[:2], strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=0, equal_nan=True)  # untouched slots stay NaN


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.int8])
@pytest.mark.parametrize(("block_size", "src_dtype"), [(8, torch.float16), (16, torch.float32),
                                                       (1, torch.bfloat16)])
def test_quantized_cache_within_one_step(cache_dtype: torch.dtype, block_size: int,
                                         src_dtype: torch.dtype) -> None:
    """Scales agree to float32 rounding; values agree exactly in the interpreter and within one quantization
    step on a GPU, whose float32 division is not correctly rounded."""
    got, expected = store_both(block_size, 2, 64, cache_dtype, src_dtype, spread_slots(block_size, 13), 1)
    for cache, scale in ((0, 2), (1, 3)):
        torch.testing.assert_close(got[scale], expected[scale], rtol=1e-6, atol=0, equal_nan=True)
        step = expected[scale][..., None] * (1.0 if cache_dtype == torch.int8 else
                                            expected[cache].float().abs() / 8 + 2**-9)
        diff = (dequantize(got[cache], got[scale]) - dequantize(expected[cache], expected[scale])).abs()
        assert bool((diff.nan_to_num(0.0) <= step.nan_to_num(0.0) * 1.0001).all())
        assert torch.equal(got[scale].isnan(), expected[scale].isnan())


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.int8])
def test_quantization_error_is_bounded(dtype: torch.dtype) -> None:
    """Per-row symmetric quantization: error at most half a step (int8) or 2^-4 relative (fp8 e4m3)."""
    x = torch.randn(64, 4, 128, generator=torch.Generator().manual_seed(0))
    x[0, 0] = 0.0  # an all-zero row must survive (scale 1, not 0/0)
    q, scale = quantize_rows(x, dtype)
    err = (dequantize(q, scale) - x).abs()
    assert q.dtype == dtype and scale.shape == x.shape[:2]
    assert (q.float().abs().amax(-1)[1:] == QMAX[dtype]).all()
    bound = scale[..., None] * 0.5 if dtype == torch.int8 else x.abs() / 16 + scale[..., None] * 2**-10
    assert bool((err <= bound * 1.0001).all())
    assert float(dequantize(q, scale)[0, 0].abs().max()) == 0.0


def test_no_tokens_is_a_no_op() -> None:
    k_cache, _ = empty_cache(2, 4, 1, 32, torch.float32)
    v_cache = k_cache.clone()
    empty = torch.empty((0, 1, 32), device=DEVICE)
    store_kv(empty, empty, k_cache, v_cache, torch.empty(0, dtype=torch.int64, device=DEVICE))
    assert k_cache.isnan().all()
