"""What an eviction policy decides, and the hooks the block pool calls.

The pool keeps two kinds of free blocks: *empty* ones (no key; reused first, no loss) and *cached* ones (full,
keyed, ref count 0; still hit-able by a later request with the same prefix). A policy orders only the cached free
blocks and picks which one loses its contents when an empty block is needed and none is left::

    in use (ref > 0) ──release, keyed──► policy.insert ──► [cached free] ──policy.evict──► empty, key dropped
          ▲                                                   │
          └────────────── prefix hit: policy.remove ◄─────────┘

Hooks: `on_cached` when a block gets its key, `forget` when an in-use block loses it unevicted (registered in a
step that never ran: its request was preempted in that step), `touch` on every prefix hit (block in use or free),
`insert` when a keyed block's ref count drops to 0, `remove` when a hit takes a free cached block back,
`evict` to choose a victim. All O(1) or O(log n) amortized.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from kvplan.engine.core.block_pool import KVBlock


class EvictionPolicy(ABC):
    name: ClassVar[str]
    # whether it reads the blocks' keys (S3-FIFO's ghost queue): a pool then keys no block as private, whose key
    # is a placeholder until it is published (`block_pool`)
    reads_keys: ClassVar[bool] = False

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.num_evictions = 0

    def on_cached(self, block: KVBlock) -> None:  # noqa: B027 - optional hook, most policies ignore it
        """`block` (in use) just received its key."""

    def forget(self, block: KVBlock) -> None:  # noqa: B027 - optional hook
        """`block` (in use, never a candidate since `on_cached`) lost its key: drop what `on_cached` noted."""

    def touch(self, block: KVBlock) -> None:  # noqa: B027 - optional hook
        """A prefix-cache hit on `block`."""

    @abstractmethod
    def insert(self, block: KVBlock) -> None:
        """`block` (keyed) became free: it is now an eviction candidate."""

    @abstractmethod
    def remove(self, block: KVBlock) -> None:
        """A hit took the free cached `block` back into use: it is no longer a candidate."""

    @abstractmethod
    def pop_victim(self) -> KVBlock:
        """Remove and return the candidate to evict (there is at least one)."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of candidates (cached free blocks)."""

    def insert_many(self, blocks: list[KVBlock]) -> None:
        """`insert` of each of `blocks`, in order (a finishing request frees its blocks together)."""
        for block in blocks:
            self.insert(block)

    def evict(self) -> KVBlock:
        self.num_evictions += 1
        return self.pop_victim()

    def evict_many(self, n: int) -> list[KVBlock]:
        """n victims, exactly those (and in the order) that n calls of `evict` would return."""
        self.num_evictions += n
        return [self.pop_victim() for _ in range(n)]
