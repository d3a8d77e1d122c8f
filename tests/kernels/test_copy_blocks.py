"""copy_blocks against its torch reference."""

from __future__ import annotations

import pytest
import torch

from kvplan.kernels import copy_blocks, make_scales
from kvplan.kernels.reference import ref_copy_blocks
from tests.kernels.kernel_cases import DEVICE


def numbered(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Distinct values per element (modulo what the dtype holds), so a misplaced copy shows."""
    return (torch.arange(torch.Size(shape).numel(), device=DEVICE) % 97 - 48).reshape(shape).to(dtype)


def copy_both(src: torch.Tensor, dst: torch.Tensor | None, pairs: list[tuple[int, int]]) -> None:
    """Copy with the kernel and the reference (into clones) and compare; `dst` None means within `src`."""
    mapping = torch.tensor(pairs, dtype=torch.int64).reshape(-1, 2)
    expected_src, expected_dst = src.clone(), None if dst is None else dst.clone()
    ref_copy_blocks(expected_src, expected_src if dst is None else expected_dst, mapping)
    copy_blocks(src, src if dst is None else dst, mapping)
    assert torch.equal(src.view(torch.uint8), expected_src.view(torch.uint8))
    if dst is not None:
        assert torch.equal(dst.view(torch.uint8), expected_dst.view(torch.uint8))


@pytest.mark.parametrize(("block_size", "dtype"), [
    (1, torch.float32), (8, torch.float16), (16, torch.bfloat16), (32, torch.int8), (16, torch.float8_e4m3fn),
])
def test_copy_on_write_within_one_cache(block_size: int, dtype: torch.dtype) -> None:
    cache = numbered((8, block_size, 2, 32), dtype)
    copy_both(cache, None, [(0, 5), (3, 1), (3, 7)])  # one source may feed several destinations


def test_copy_between_caches_and_scales() -> None:
    src, dst = numbered((6, 16, 2, 64), torch.float16), torch.zeros((4, 16, 2, 64), dtype=torch.float16,
                                                                    device=DEVICE)
    copy_both(src, dst, [(5, 0), (2, 3)])
    scales = make_scales(numbered((6, 16, 2, 8), torch.int8))
    copy_both(scales * numbered(scales.shape, torch.float32), scales, [(1, 4), (0, 2)])


def test_large_block_spans_several_chunks() -> None:
    cache = numbered((3, 64, 4, 128), torch.float16)  # 32768 elements per block: 32 programs per pair
    copy_both(cache, None, [(2, 0)])


def test_empty_mapping() -> None:
    cache = numbered((2, 4, 1, 16), torch.float32)
    copy_both(cache, None, [])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="swap needs a second device")
def test_swap_between_devices() -> None:
    gpu = numbered((4, 16, 2, 32), torch.float16)
    cpu = torch.zeros((3, 16, 2, 32), dtype=torch.float16)
    copy_blocks(gpu, cpu, torch.tensor([[3, 0], [1, 2]]))
    assert torch.equal(cpu[0], gpu[3].cpu()) and torch.equal(cpu[2], gpu[1].cpu())
    copy_blocks(cpu, gpu, torch.tensor([[0, 0]]))
    assert torch.equal(gpu[0], gpu[3])


@pytest.mark.parametrize(("pairs", "message"), [
    ([(0, 9)], "out of range"), ([(-1, 2)], "out of range"), ([(0, 2), (1, 2)], "more than once"),
    ([(0, 1), (1, 2)], "both a source and a destination"),
])
def test_rejects_ambiguous_mappings(pairs: list[tuple[int, int]], message: str) -> None:
    cache = numbered((4, 4, 1, 16), torch.float32)
    with pytest.raises(ValueError, match=message):
        copy_blocks(cache, cache, torch.tensor(pairs))
