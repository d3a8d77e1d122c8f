"""`copy_blocks`: whole-block copies between paged caches, for copy-on-write and for swap.

Works on any contiguous tensor whose first dimension is the block index: K or V caches
`[num_blocks, block_size, num_kv_heads, head_dim]` and quantization scales `[num_blocks, block_size,
num_kv_heads]` alike, so a caller copies each of a layer's tensors with the same mapping. Copies within one
device run the Triton kernel (one program per pair and chunk of the block); copies between devices (swap
out to CPU memory and back in) are plain torch index copies, since a kernel cannot reach across devices.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvplan.kernels.checks import INDEX_DTYPES, check_contiguous, check_shape, check_tensor

CHUNK = 1024


@triton.jit
def _copy_blocks_kernel(src_ptr, dst_ptr, mapping_ptr, BLOCK_NUMEL: tl.constexpr, CHUNK: tl.constexpr):
    pair = tl.program_id(0)
    chunk = tl.program_id(1)
    src = tl.load(mapping_ptr + 2 * pair).to(tl.int64)
    dst = tl.load(mapping_ptr + 2 * pair + 1).to(tl.int64)
    offsets = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offsets < BLOCK_NUMEL
    values = tl.load(src_ptr + src * BLOCK_NUMEL + offsets, mask=mask)
    tl.store(dst_ptr + dst * BLOCK_NUMEL + offsets, values, mask=mask)


def _check_mapping_values(pairs: torch.Tensor, num_src: int, num_dst: int, same_tensor: bool) -> None:
    """Indices in range, each destination written once, and (within one tensor) no destination that is also
    read: programs run in no fixed order, so such a mapping would have no defined result."""
    src, dst = pairs[:, 0].tolist(), pairs[:, 1].tolist()
    if any(not 0 <= s < num_src for s in src) or any(not 0 <= d < num_dst for d in dst):
        raise ValueError(f"block_mapping: block index out of range (source blocks {num_src}, "
                         f"destination blocks {num_dst})")
    if len(set(dst)) != len(dst):
        raise ValueError("block_mapping: a destination block appears more than once")
    if same_tensor and set(src) & set(dst):
        raise ValueError("block_mapping: a block is both a source and a destination within one cache")


def copy_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """Copy block `block_mapping[i, 0]` of `src` to block `block_mapping[i, 1]` of `dst` for every row i.

    `src` and `dst` may be the same tensor (copy-on-write) or tensors on different devices (swap). The
    mapping's values are checked when it is on the CPU, where the engine builds it; a mapping already on
    the device is trusted, because checking it would synchronize.
    """
    check_tensor("src", src, src.dim(), (src.dtype,))
    check_contiguous("src", src)
    check_contiguous("dst", dst)
    if dst.dtype != src.dtype:
        raise ValueError(f"dst: dtype {dst.dtype} differs from src's {src.dtype}")
    check_shape("dst", dst, (None, *src.shape[1:]))
    check_tensor("block_mapping", block_mapping, 2, INDEX_DTYPES)
    check_shape("block_mapping", block_mapping, (None, 2))
    check_contiguous("block_mapping", block_mapping)
    if block_mapping.device.type == "cpu":
        _check_mapping_values(block_mapping, src.shape[0], dst.shape[0], src.data_ptr() == dst.data_ptr())
    if block_mapping.shape[0] == 0:
        return
    if src.device != dst.device:
        pairs = block_mapping.long()
        dst[pairs[:, 1].to(dst.device)] = src[pairs[:, 0].to(src.device)].to(dst.device)
        return
    block_numel = src[0].numel()
    _copy_blocks_kernel[(block_mapping.shape[0], triton.cdiv(block_numel, CHUNK))](
        src, dst, block_mapping.to(src.device), BLOCK_NUMEL=block_numel, CHUNK=CHUNK,
    )
