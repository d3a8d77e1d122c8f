"""The paged KV tensors: per layer [num_blocks, block_size, num_kv_heads, head_dim] for K and for V, a CPU-side
pool of the same layout for swapping, and the block copies the scheduler asks for."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.forward_context import LayerKV


@dataclass(slots=True)
class KVLayout:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    @property
    def bytes_per_block(self) -> int:
        """K and V of one block across all layers."""
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * element

    def blocks_in(self, num_bytes: int) -> int:
        return num_bytes // self.bytes_per_block


class PagedKVCache:
    def __init__(self, layout: KVLayout, num_blocks: int, num_cpu_blocks: int, device: torch.device) -> None:
        self.layout = layout
        self.num_blocks = num_blocks
        shape = (num_blocks, layout.block_size, layout.num_kv_heads, layout.head_dim)
        self.layers = [LayerKV(torch.zeros(shape, dtype=layout.dtype, device=device),
                               torch.zeros(shape, dtype=layout.dtype, device=device)) for _ in range(layout.num_layers)]
        cpu_shape = (num_cpu_blocks, *shape[1:])
        pin = device.type == "cuda"
        self.cpu_layers = [LayerKV(torch.zeros(cpu_shape, dtype=layout.dtype, pin_memory=pin),
                                   torch.zeros(cpu_shape, dtype=layout.dtype, pin_memory=pin))
                           for _ in range(layout.num_layers if num_cpu_blocks else 0)]

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: GPU block src -> GPU block dst in every layer."""
        if pairs:
            self._copy(self.layers, self.layers, pairs)

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            self._copy(self.layers, self.cpu_layers, pairs)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            self._copy(self.cpu_layers, self.layers, pairs)

    @staticmethod
    def _copy(source: list[LayerKV], target: list[LayerKV], pairs: list[tuple[int, int]]) -> None:
        src = torch.tensor([s for s, _ in pairs], dtype=torch.long)
        dst = torch.tensor([d for _, d in pairs], dtype=torch.long)
        for a, b in zip(source, target, strict=True):
            for from_tensor, to_tensor in ((a.key, b.key), (a.value, b.value)):
                to_tensor[dst.to(to_tensor.device)] = from_tensor[src.to(from_tensor.device)].to(to_tensor.device)
