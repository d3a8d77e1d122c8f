"""The paged KV tensors: per layer [num_blocks, block_size, num_kv_heads, head_dim] for K and for V, two host-side
pools of the same layout - swap space for preempted requests, and the CPU prefix tier (one slot per tier block) -
and the block copies the scheduler asks for.

Every copy is one mechanism (`_copy`: an indexed copy of blocks between two pools, in every layer); a copy to or
from host memory runs on a side CUDA stream where there is a GPU (pinned host tensors), ordered after the work
already queued and before anything queued later, so the forward pass never reads a promoted block early nor
overwrites a demoted one before it is copied out. On the CPU engine the pools are plain tensors and the copies
plain indexed copies.

A quantized cache (`float8_e4m3fn`, `int8`) stores 1-byte values plus one float32 scale per token per KV head
(kernels.quant: quantized on write, dequantized on read), so a block costs 2 · layers · block_size · kv_heads ·
(head_dim + 4) bytes: at head_dim 64, 53% of a 16-bit block, 1.88x the blocks for the same budget."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from kvplan.engine.core.tier_transfers import GPU, TierTransfer, copy_batches
from kvplan.engine.forward_context import LayerKV
from kvplan.errors import UserError

SCALE_BYTES = 4  # one float32 scale per token per KV head, for K and for V
# the quantized cache dtypes (kernels.checks.QUANT_DTYPES; named here so that the CPU engine never imports the
# kernels package, which loads triton)
QUANTIZED_DTYPES = (torch.float8_e4m3fn, torch.int8)


@dataclass(slots=True)
class KVLayout:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    @property
    def quantized(self) -> bool:
        return self.dtype in QUANTIZED_DTYPES

    @property
    def bytes_per_block(self) -> int:
        """K and V of one block across all layers (with their scales when quantized)."""
        element = torch.empty((), dtype=self.dtype).element_size()
        row = self.head_dim * element + (SCALE_BYTES if self.quantized else 0)
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * row

    def blocks_in(self, num_bytes: int) -> int:
        return num_bytes // self.bytes_per_block


class PagedKVCache:
    def __init__(self, layout: KVLayout, num_blocks: int, num_cpu_blocks: int, device: torch.device,
                 num_tier_blocks: int = 0) -> None:
        self.layout = layout
        self.num_blocks = num_blocks
        shape = (num_blocks, layout.block_size, layout.num_kv_heads, layout.head_dim)
        self.layers = [self._layer(layout, shape, device=device) for _ in range(layout.num_layers)]
        self.cpu_layers = self._host_pool(layout, num_cpu_blocks, device)
        self.tier_layers = self._host_pool(layout, num_tier_blocks, device)
        # the pools by the names the core's tier transfers use (engine.core.tier_transfers)
        self.pools = {GPU: self.layers, "cpu": self.tier_layers}
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    @classmethod
    def _host_pool(cls, layout: KVLayout, num_blocks: int, device: torch.device) -> list[LayerKV]:
        """Host-side blocks of the device layout; pinned only beside a GPU (pinned pages serve DMA copies, and
        pinning needs CUDA)."""
        shape = (num_blocks, layout.block_size, layout.num_kv_heads, layout.head_dim)
        pin = device.type == "cuda"
        return [cls._layer(layout, shape, pin_memory=pin) for _ in range(layout.num_layers if num_blocks else 0)]

    @staticmethod
    def _layer(layout: KVLayout, shape: tuple[int, ...], **where) -> LayerKV:
        def zeros(dims: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(dims, dtype=dtype, **where)

        if not layout.quantized:
            return LayerKV(zeros(shape, layout.dtype), zeros(shape, layout.dtype))
        return LayerKV(zeros(shape, layout.dtype), zeros(shape, layout.dtype), zeros(shape[:3], torch.float32),
                       zeros(shape[:3], torch.float32))

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: GPU block src -> GPU block dst in every layer."""
        if pairs:
            self._copy(self.layers, self.layers, pairs)

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            self._host_copy(self.layers, self.cpu_layers, pairs)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            self._host_copy(self.cpu_layers, self.layers, pairs)

    def tier_transfers(self, transfers: list[TierTransfer]) -> None:
        """A step's demotions (GPU block -> CPU tier slot) and promotions (slot -> GPU block), in the core's order
        (batched by `copy_batches`, which keeps what each copy reads)."""
        for src, dst, pairs in copy_batches(transfers):
            self._host_copy(self.pools[src], self.pools[dst], pairs)

    def _host_copy(self, source: list[LayerKV], target: list[LayerKV], pairs: list[tuple[int, int]]) -> None:
        """`_copy` between the device and host memory: on the side stream beside a GPU, after the work queued so
        far (the last forward's KV writes) and before the work queued next (this step's forward)."""
        if self.stream is None:
            self._copy(source, target, pairs)
            return
        current = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            self._copy(source, target, pairs)
        current.wait_stream(self.stream)

    @staticmethod
    def _copy(source: list[LayerKV], target: list[LayerKV], pairs: list[tuple[int, int]]) -> None:
        """Block src -> block dst of every (src, dst) pair in every layer; no dst repeats, no src is a dst."""
        src = torch.tensor([s for s, _ in pairs], dtype=torch.long)
        dst = torch.tensor([d for _, d in pairs], dtype=torch.long)
        for a, b in zip(source, target, strict=True):
            for from_tensor, to_tensor in zip(a.tensors(), b.tensors(), strict=True):
                if from_tensor.dtype in QUANTIZED_DTYPES:  # CPU indexing lacks float8: move the bytes
                    from_tensor, to_tensor = from_tensor.view(torch.uint8), to_tensor.view(torch.uint8)
                to_tensor[dst.to(to_tensor.device)] = from_tensor[src.to(from_tensor.device)].to(to_tensor.device)


def check_host_memory(layout: KVLayout, num_blocks: int, num_cpu_blocks: int, device: torch.device) -> None:
    """Host-memory KV (the CPU engine's cache, and swap space and the CPU prefix tier on any device: together
    `num_cpu_blocks`) is refused when it exceeds this machine's memory: allocating it would swap the machine to a
    standstill instead of failing."""
    host_blocks = num_cpu_blocks + (num_blocks if device.type == "cpu" else 0)
    need = layout.bytes_per_block * host_blocks
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > physical:
        raise UserError(f"KV cache of {host_blocks} blocks x {layout.bytes_per_block} bytes = {need} bytes; "
                         f"allowed: at most this machine's memory, {physical} bytes (fewer num_blocks)")
