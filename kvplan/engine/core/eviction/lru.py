"""LRU over cached free blocks, with vLLM's semantics.

Candidates are ordered by the time they became free. A request frees its blocks tail-first, so within one
chain the deepest block enters the queue first and is evicted first; the shared root of a prefix survives
longest.

Kept as a queue with lazy removal (vLLM keeps a doubly linked list for its O(1) removal from the middle, a cache
hit): every insertion appends the block; a hit only counts the block's queued entry as stale
(`KVBlock.stale_entries`). A block's entries lie in the queue in the order they were made, and all but maybe the
last are stale, so the entry of a block reached at the front is stale exactly when the block still counts one - it
is then skipped and uncounted. The queue is compacted, in order, once stale entries outnumber live ones by more than
a slack (an eighth of the capacity, at most `COMPACT_SLACK`), and its consumed front is dropped once longer than the
rest: it holds at most about four entries per block of the cache. Invariant: the live entries, front to back, are
the candidates in the order they became free - the order a linked list would hold them in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from kvplan.engine.core.eviction.base import EvictionPolicy

if TYPE_CHECKING:
    from mypy_extensions import i64  # native 64-bit locals in the compiled build; int when interpreted

    from kvplan.engine.core.block_pool import KVBlock

COMPACT_SLACK: Final = 1024  # the most stale entries always tolerated (a compaction copies the queue)


class LRUPolicy(EvictionPolicy):
    name = "lru"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._queue: list[KVBlock] = []  # its front at `_head`
        self._head = 0
        self._size = 0
        self._slack = min(COMPACT_SLACK, capacity // 8)

    def insert(self, block: KVBlock) -> None:
        self._queue.append(block)
        self._size += 1

    def insert_many(self, blocks: list[KVBlock]) -> None:
        self._queue += blocks
        self._size += len(blocks)

    def remove(self, block: KVBlock) -> None:
        block.stale_entries += 1
        self._size -= 1
        if len(self._queue) - self._head > 2 * self._size + self._slack:
            self._compact()

    def pop_victim(self) -> KVBlock:
        return self._pop(1)[0]

    def evict_many(self, n: int) -> list[KVBlock]:
        """`EvictionPolicy.evict_many` in one loop: the pool evicts a batch per allocation, and a call per victim
        cost more than taking it."""
        self.num_evictions += n
        return self._pop(n)

    def _pop(self, n: int) -> list[KVBlock]:
        """The n live entries at the front, in order, skipping (and uncounting) stale ones. The consumed front is
        dropped once, after all n are taken: when that happens changes nothing the queue yields, since `remove`
        reads only `len(_queue) - _head`, the same either way."""
        queue = self._queue
        head: i64 = self._head  # (native ints: the compiled build's list index and loop are then direct)
        count: i64 = n
        victims: list[KVBlock] = []
        for _victim in range(count):  # (n live entries: a caller asks only for as many as len() counts; not `_`,
            # which the compiled build types as an object, boxing the index every iteration)
            while True:
                block = queue[head]
                head += 1
                if not block.stale_entries:
                    break
                block.stale_entries -= 1
            victims.append(block)
        self._size -= n
        if head > self._slack and 2 * head > len(queue):
            del queue[:head]
            head = 0
        self._head = head
        return victims

    def __len__(self) -> int:
        return self._size

    def _compact(self) -> None:
        """Drop the stale entries, keeping the live ones in order."""
        live = []
        for block in self._queue[self._head:]:
            if block.stale_entries:
                block.stale_entries -= 1
            else:
                live.append(block)
        self._queue, self._head = live, 0
