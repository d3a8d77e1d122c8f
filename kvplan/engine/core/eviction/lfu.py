"""LFU: evict the free cached block with the fewest uses since it was cached.

A block's use count starts at 1 when it is cached and grows by one per prefix hit. Ties go to the block that
became free earliest (LRU order), which keeps vLLM's deepest-first order inside one chain.
"""

from __future__ import annotations

from itertools import count
from typing import TYPE_CHECKING

from kvplan.engine.core.eviction.base import EvictionPolicy
from kvplan.engine.core.eviction.heap_queue import LazyHeap

if TYPE_CHECKING:
    from kvplan.engine.core.block_pool import KVBlock


class LFUPolicy(EvictionPolicy):
    name = "lfu"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._clock = count()
        self._uses: dict[int, int] = {}
        self._heap = LazyHeap()

    def on_cached(self, block: KVBlock) -> None:
        self._uses[block.block_id] = 1

    def forget(self, block: KVBlock) -> None:
        del self._uses[block.block_id]

    def touch(self, block: KVBlock) -> None:
        self._uses[block.block_id] += 1

    def insert(self, block: KVBlock) -> None:
        self._heap.push(block, (self._uses[block.block_id], next(self._clock)))

    def remove(self, block: KVBlock) -> None:
        self._heap.discard(block)

    def pop_victim(self) -> KVBlock:
        block = self._heap.pop()
        del self._uses[block.block_id]
        return block

    def __len__(self) -> int:
        return len(self._heap)
