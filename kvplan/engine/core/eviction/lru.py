"""LRU over cached free blocks, with vLLM's semantics.

Candidates are ordered by the time they became free. A request frees its blocks tail-first, so within one
chain the deepest block enters the queue first and is evicted first; the shared root of a prefix survives
longest. The ordered dict is a doubly linked list with O(1) removal from the middle (a cache hit).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from kvplan.engine.core.eviction.base import EvictionPolicy

if TYPE_CHECKING:
    from kvplan.engine.core.block_pool import KVBlock


class LRUPolicy(EvictionPolicy):
    name = "lru"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._queue: OrderedDict[int, KVBlock] = OrderedDict()

    def insert(self, block: KVBlock) -> None:
        self._queue[block.block_id] = block

    def insert_many(self, blocks: list[KVBlock]) -> None:
        queue = self._queue
        for block in blocks:
            queue[block.block_id] = block

    def remove(self, block: KVBlock) -> None:
        del self._queue[block.block_id]

    def pop_victim(self) -> KVBlock:
        return self._queue.popitem(last=False)[1]

    def evict(self) -> KVBlock:
        self.num_evictions += 1
        return self._queue.popitem(last=False)[1]

    def evict_many(self, n: int) -> list[KVBlock]:
        self.num_evictions += n
        pop = self._queue.popitem
        return [pop(False)[1] for _ in range(n)]

    def __len__(self) -> int:
        return len(self._queue)
