"""FIFO by cache insertion: evict the free cached block whose contents entered the cache earliest.

Unlike LRU, a block's place is fixed when it receives its key; hits and releases do not refresh it. Blocks of a
chain are keyed root-first, so FIFO evicts roots before their descendants - the classic weakness that makes it
a useful baseline.
"""

from __future__ import annotations

from itertools import count
from typing import TYPE_CHECKING

from kvplan.engine.core.eviction.base import EvictionPolicy
from kvplan.engine.core.eviction.heap_queue import LazyHeap

if TYPE_CHECKING:
    from kvplan.engine.core.block_pool import KVBlock


class FIFOPolicy(EvictionPolicy):
    name = "fifo"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._clock = count()
        self._cached_at: dict[int, int] = {}
        self._heap = LazyHeap()

    def on_cached(self, block: KVBlock) -> None:
        self._cached_at[block.block_id] = next(self._clock)

    def forget(self, block: KVBlock) -> None:
        del self._cached_at[block.block_id]

    def insert(self, block: KVBlock) -> None:
        self._heap.push(block, (self._cached_at[block.block_id],))

    def remove(self, block: KVBlock) -> None:
        self._heap.discard(block)

    def pop_victim(self) -> KVBlock:
        block = self._heap.pop()
        del self._cached_at[block.block_id]
        return block

    def __len__(self) -> int:
        return len(self._heap)
