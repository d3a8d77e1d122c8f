"""S3-FIFO (Yang et al., SOSP'23) over cached free blocks.

Three queues: a small FIFO S that new contents enter, a main FIFO M for contents that proved useful, and a ghost
G of recently evicted *keys* (no blocks). Each block has a hit counter capped at 3.

* A block cached under a key found in G goes to M (it was evicted too early once); otherwise to S.
* Eviction takes from S while S holds at least 10% of the candidates (or M is empty): the head of S moves to M
  if it was hit since it was cached, else it is evicted and its key remembered in G. Otherwise the head of M is
  reinserted at M's tail with its counter decremented if it was hit, else evicted.

Blocks in use are not candidates; a block taken back by a hit leaves its queue and, when freed again, returns to
the queue (S or M) it belonged to. One-hit wonders - blocks of prompts nobody shares - leave quickly through S
while a popular system prompt's blocks settle in M.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Final

from kvplan.engine.core.eviction.base import EvictionPolicy

if TYPE_CHECKING:
    from kvplan.engine.core.block_pool import KVBlock

SMALL_FRACTION: Final = 0.1
MAX_FREQ: Final = 3


class S3FIFOPolicy(EvictionPolicy):
    name = "s3fifo"
    reads_keys = True

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._small: OrderedDict[int, KVBlock] = OrderedDict()
        self._main: OrderedDict[int, KVBlock] = OrderedDict()
        self._ghost: OrderedDict[int | None, None] = OrderedDict()  # keys of evicted blocks (KVBlock.key's type)
        self._freq: dict[int, int] = {}
        self._in_main: set[int] = set()

    def on_cached(self, block: KVBlock) -> None:
        self._freq[block.block_id] = 0
        if block.key in self._ghost:
            del self._ghost[block.key]
            self._in_main.add(block.block_id)

    def forget(self, block: KVBlock) -> None:
        self._forget(block)

    def touch(self, block: KVBlock) -> None:
        freq = self._freq
        freq[block.block_id] = min(freq[block.block_id] + 1, MAX_FREQ)

    def insert(self, block: KVBlock) -> None:
        queue = self._main if block.block_id in self._in_main else self._small
        queue[block.block_id] = block

    def remove(self, block: KVBlock) -> None:
        bid = block.block_id
        if bid in self._in_main:
            del self._main[bid]
        else:
            del self._small[bid]

    def pop_victim(self) -> KVBlock:
        freq = self._freq
        while True:
            if self._small and (len(self._small) >= SMALL_FRACTION * len(self) or not self._main):
                bid, block = self._small.popitem(last=False)
                if freq[bid] > 0:
                    freq[bid] = 0
                    self._in_main.add(bid)
                    self._main[bid] = block
                    continue
                self._remember(block.key)
                return self._forget(block)
            bid, block = self._main.popitem(last=False)
            if freq[bid] > 0:
                freq[bid] -= 1
                self._main[bid] = block
                continue
            return self._forget(block)

    def _remember(self, key: int | None) -> None:
        self._ghost[key] = None
        if len(self._ghost) > self.capacity:
            self._ghost.popitem(last=False)

    def _forget(self, block: KVBlock) -> KVBlock:
        del self._freq[block.block_id]
        self._in_main.discard(block.block_id)
        return block

    def __len__(self) -> int:
        return len(self._small) + len(self._main)
