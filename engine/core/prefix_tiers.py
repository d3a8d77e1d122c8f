"""Prefix-cache tiers below the GPU: an ordered chain of key stores (CPU, then disk, then a shared store).

A lower tier holds no tensors here, only which block hashes (the same keys as the GPU prefix cache, from
`block_keys`) it has, in a `BlockPool` of its own whose slots are the tier's blocks; its eviction policy is one
of the existing ones. The chain is write-back (as LMCache's local CPU backend evicting to local disk)::

    GPU pool ──evicts key──► tier 0 ──evicts key──► tier 1 ──evicts key──► dropped
        ▲                        │
        └── promote: copy into a GPU block before the prefill (the tier keeps its copy)

Invariants (checked by the property tests in tests/core/test_prefix_tiers.py):

* a key is in at most one slot of a tier (a store of a key the tier has only refreshes its recency);
* a tier never holds more keys than its capacity (its pool's size);
* a slot is pinned (ref_cnt 1) only while a promotion copies out of it, so nothing leaks: outside a promotion
  every slot is empty or cached free;
* every store that takes a slot appends its copy (source block or slot -> this tier's slot) to the chain's
  transfer log, after the copies its own eviction caused (`tier_transfers`): the live runner replays the log.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from kvplan.engine.core.block_pool import BlockPool, KVBlock
from kvplan.engine.core.config import ConfigError
from kvplan.engine.core.tier_transfers import GPU, TierTransfer


@dataclass(slots=True)
class TierStats:
    """Per-tier counters, in blocks (bytes are blocks times the block's KV bytes, which the core does not know)."""

    hits: int = 0  # blocks a lookup found here (and the GPU did not have)
    promotions: int = 0  # blocks copied from here into the GPU
    demotions: int = 0  # blocks stored here by the tier above evicting them
    dropped: int = 0  # blocks this tier evicted with nowhere below to go (or stored while every slot was pinned)


class PrefixTier:
    """One tier: which keys it holds, bounded by `num_blocks`, ordered by its eviction policy."""

    def __init__(self, name: str, num_blocks: int, block_size: int, eviction_policy: str = "lru",
                 log: list[TierTransfer] | None = None) -> None:
        self.name = name
        self.pool = BlockPool(num_blocks, block_size, eviction_policy, enable_caching=True)
        self.stats = TierStats()
        self.below: PrefixTier | None = None
        self.log: list[TierTransfer] = [] if log is None else log  # the chain's copies, shared with the manager
        self.pool.spill = self._evicted

    def __len__(self) -> int:
        return len(self.pool.cached)

    def __contains__(self, key: int) -> bool:
        return key in self.pool.cached

    def store(self, key: int, src: int, src_tier: str = GPU) -> None:
        """Keep `key` (block `src` of the pool above, which evicted it): a key already here is refreshed, not
        copied again."""
        pool = self.pool
        held = pool.lookup(key)
        if held is not None:
            pool.acquire(held)
            pool.release(held)
            return
        if pool.num_free == 0:  # every slot is pinned by a promotion in flight: nowhere to put it
            self.stats.dropped += 1
            return
        self.stats.demotions += 1
        slot = pool.allocate()  # may evict (and so demote further, logged first) this tier's victim
        pool.register(slot, key)
        pool.release(slot)
        self.log.append(TierTransfer(src_tier, src, self.name, slot.block_id))

    def pin(self, key: int) -> KVBlock | None:
        """Hold `key`'s slot while its contents are copied up, so that no store evicts it meanwhile."""
        slot = self.pool.lookup(key)
        if slot is not None:
            self.pool.acquire(slot)
        return slot

    def unpin(self, slot: KVBlock) -> None:
        self.pool.release(slot)

    def _evicted(self, key: int, slot: int) -> None:
        if self.below is not None:
            self.below.store(key, slot, self.name)
        else:
            self.stats.dropped += 1


@dataclass(slots=True)
class TierSpec:
    """One tier's shape, from the settings: its name, capacity in blocks and eviction policy."""

    name: str
    num_blocks: int
    eviction_policy: str = "lru"


def build_tiers(specs: list[TierSpec], block_size: int, log: list[TierTransfer] | None = None
                ) -> list[PrefixTier]:
    """The chain, top first, each tier spilling into the next and logging its copies into `log`; tiers of 0
    blocks are absent."""
    log = [] if log is None else log
    tiers = [PrefixTier(s.name, s.num_blocks, block_size, s.eviction_policy, log) for s in specs
             if s.num_blocks > 0]
    for upper, lower in pairwise(tiers):
        upper.below = lower
    names = [t.name for t in tiers]
    if len(set(names)) != len(names):
        raise ConfigError(f"cache tiers: {names} repeats a tier; allowed: each of cpu, disk, shared at most once")
    return tiers
