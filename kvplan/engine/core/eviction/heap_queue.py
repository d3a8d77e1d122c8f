"""A min-heap of free cached blocks keyed by a policy-chosen priority, with lazy deletion.

A block's live entry is the one whose priority equals `self._live[block_id]`; older entries for the same block
(left behind by remove/re-insert) are skipped when they surface. When stale entries outnumber live ones the
heap is rebuilt from the live ones, so its size stays O(live entries) whatever the hit pattern (a popular prefix
hit and released thousands of times leaves no trail). Amortized O(log n) per operation.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvplan.engine.core.block_pool import KVBlock


class LazyHeap:
    __slots__ = ("_blocks", "_heap", "_live")

    def __init__(self) -> None:
        self._heap: list[tuple[tuple[int, ...], int]] = []
        self._live: dict[int, tuple[int, ...]] = {}
        self._blocks: dict[int, KVBlock] = {}

    def push(self, block: KVBlock, priority: tuple[int, ...]) -> None:
        self._live[block.block_id] = priority
        self._blocks[block.block_id] = block
        heapq.heappush(self._heap, (priority, block.block_id))
        if len(self._heap) > 2 * len(self._live) + 16:
            self._compact()

    def _compact(self) -> None:
        """Drop the stale entries: O(live) work, paid for by the more than `live` pushes that made them."""
        self._heap = [(priority, block_id) for block_id, priority in self._live.items()]
        heapq.heapify(self._heap)

    @property
    def num_entries(self) -> int:
        """Heap entries, stale ones included (what the policy's memory grows with)."""
        return len(self._heap)

    def discard(self, block: KVBlock) -> None:
        del self._live[block.block_id]
        del self._blocks[block.block_id]

    def pop(self) -> KVBlock:
        heap, live = self._heap, self._live
        while True:
            priority, block_id = heapq.heappop(heap)
            if live.get(block_id) == priority:
                del live[block_id]
                return self._blocks.pop(block_id)

    def __len__(self) -> int:
        return len(self._live)
