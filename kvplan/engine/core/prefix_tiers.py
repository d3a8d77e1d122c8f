"""Prefix-cache tiers below the GPU: an ordered chain of key stores (CPU, then disk, then a cluster-shared store).

A lower tier holds no tensors here, only which block hashes (the same keys as the GPU prefix cache, from
`block_keys`) it has, in a `BlockPool` of its own whose slots are the tier's blocks; its eviction policy is one
of the existing ones. By default the chain is write-back (as LMCache's local CPU backend evicting to local disk)::

    GPU pool ──evicts key──► cpu ──evicts key──► disk ──evicts key──► shared ──evicts key──► dropped
        ▲                        │                                      ▲ (one store, every replica's chain
        └── promote: copy into a GPU block before the prefill           │  ends in it: `TierView`)
            (the tier keeps its copy)

Write-through (`kv_offloading_write_through`, LMCache's default): every block the GPU registers (computed, or
promoted from a tier) is stored in every tier at once, and each tier drops what it evicts (a lower tier already
has its own copy, unless it evicted it first); the GPU's evictions then move nothing.

The `shared` tier is one store for a whole simulated cluster (Mooncake Store, LMCache's remote backend): the
cluster builds it once and hands each replica's KV manager a `TierView` of it, so a prefix one replica published
is a hit for another; each view counts its own replica's hits, stores and the drops its stores cause.

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
from typing import Final

from kvplan.engine.core.block_pool import BlockPool, KVBlock
from kvplan.engine.core.config import ConfigError
from kvplan.engine.core.tier_transfers import GPU, TierTransfer
from kvplan.limits import MAX_BLOCKS

GIB: Final = 1 << 30  # vLLM's kv_offloading_size is in GiB


@dataclass(slots=True)
class TierStats:
    """Per-tier counters, in blocks (bytes are blocks times the block's KV bytes, which the core does not know)."""

    hits: int = 0  # blocks a lookup found here (and the GPU did not have)
    promotions: int = 0  # blocks copied from here into the GPU
    demotions: int = 0  # blocks stored here: by the tier above evicting them, or written through
    dropped: int = 0  # blocks this tier evicted with nowhere below to go (or stored while every slot was pinned)


class PrefixTier:
    """One tier: which keys it holds, bounded by `num_blocks`, ordered by its eviction policy. `stats` are the
    counters of whoever calls it (a shared tier's `TierView` points them at its own before each call)."""

    def __init__(self, name: str, num_blocks: int, block_size: int, eviction_policy: str = "lru",
                 log: list[TierTransfer] | None = None) -> None:
        self.name = name
        self.pool = BlockPool(num_blocks, block_size, eviction_policy, enable_caching=True)
        self.stats = TierStats()
        self._below: PrefixTier | TierView | None = None
        # the chain's copies, shared with the KV manager (None: not logged - the simulator's shared store)
        self.log = log

    @property
    def below(self) -> PrefixTier | TierView | None:
        """Write-back: where what this tier evicts goes (None: dropped)."""
        return self._below

    @below.setter
    def below(self, tier: PrefixTier | TierView | None) -> None:
        self._below = tier
        # Nothing below: the pool spills nowhere, and `store_many` counts the drops from its policy's evictions
        # (a full last tier evicts once per store: no call and no list for each).
        self.pool.spill = None if tier is None else self._evicted

    def __len__(self) -> int:
        return len(self.pool.cached)

    def __contains__(self, key: int) -> bool:
        return key in self.pool.cached

    def store(self, key: int, src: int, src_tier: str = GPU) -> None:
        """Keep `key` (block `src` of the pool `src_tier` above, which evicted it, or wrote it through)."""
        self.store_many([(key, src)], src_tier)

    def store_many(self, keys: list[tuple[int, int]], src_tier: str = GPU) -> None:
        """Keep each (key, block) of `keys` in order, as `store` would one at a time (the pool above's `spill`:
        an admission's evictions in one call). A key already here is refreshed, not copied again. A new key takes
        a slot from free to keyed and cached free in one pool call (`BlockPool.insert_free`); the copy into it is
        logged after the demotion its own eviction caused."""
        pool, stats, log = self.pool, self.stats, self.log  # (a store below this tier never swaps this `stats`)
        cached, policy = pool.cached, pool.policy
        evicted = policy.num_evictions
        for key, src in keys:
            held = cached.get(key)
            if held is not None:
                pool.refresh(held)
                continue
            # An empty slot, or this tier's victim, demoted further (or dropped) below by the pool's `spill` first
            # (one slot per key: the victim's contents are gone from here).
            slot = pool.insert_free(key)
            if slot is None:  # every slot is pinned by a promotion in flight: nowhere to put it
                stats.dropped += 1
                continue
            stats.demotions += 1
            if log is not None:
                log.append(TierTransfer(src_tier, src, self.name, slot.block_id))
        if self._below is None:  # every key this tier evicted is dropped (a tier's pool holds no duplicates)
            stats.dropped += policy.num_evictions - evicted

    def pin(self, key: int) -> KVBlock | None:
        """Hold `key`'s slot while its contents are copied up, so that no store evicts it meanwhile."""
        slot = self.pool.lookup(key)
        if slot is not None:
            self.pool.acquire(slot)
        return slot

    def unpin(self, slot: KVBlock) -> None:
        self.pool.release(slot)

    def _evicted(self, keys: list[tuple[int, int]]) -> None:
        assert self._below is not None  # the pool's `spill` only while a tier is below (`below`)
        self._below.store_many(keys, self.name)


class TierView:
    """One replica's handle on a tier that several replicas share (the cluster's `shared` store): the same keys
    and slots, counters of its own. Each store first points the tier's `stats` at this view's, so a store and the
    drops it causes are counted for the replica whose eviction (or write-through) caused them; a promotion counts
    its hit on the view (`KVCacheManager._promote`). The views' counters add up to the store's traffic."""

    __slots__ = ("below", "name", "stats", "tier")

    def __init__(self, tier: PrefixTier) -> None:
        self.tier = tier
        self.name = tier.name
        self.stats = TierStats()
        self.below: PrefixTier | None = None  # the shared store is the last tier: what it evicts is dropped

    def __len__(self) -> int:
        return len(self.tier)

    def __contains__(self, key: int) -> bool:
        return key in self.tier.pool.cached

    @property
    def pool(self) -> BlockPool:
        return self.tier.pool

    def store(self, key: int, src: int = -1, src_tier: str = GPU) -> None:
        self.store_many([(key, src)], src_tier)

    def store_many(self, keys: list[tuple[int, int]], src_tier: str = GPU) -> None:
        self.tier.stats = self.stats
        self.tier.store_many(keys, src_tier)

    def pin(self, key: int) -> KVBlock | None:
        return self.tier.pin(key)

    def unpin(self, slot: KVBlock) -> None:
        self.tier.unpin(slot)


@dataclass(slots=True)
class TierSpec:
    """One tier's shape, from the settings: its name, capacity in blocks and eviction policy."""

    name: str
    num_blocks: int
    eviction_policy: str = "lru"


def build_tiers(specs: list[TierSpec], block_size: int, write_through: bool = False,
                log: list[TierTransfer] | None = None) -> list[PrefixTier]:
    """The chain, top first, each tier spilling into the next (write-back; write-through: none spills, every tier
    is written at once) and logging its copies into `log`; tiers of 0 blocks are absent."""
    tiers = [PrefixTier(s.name, s.num_blocks, block_size, s.eviction_policy, log) for s in specs
             if s.num_blocks > 0]
    check_names([t.name for t in tiers])
    if not write_through:
        for upper, lower in pairwise(tiers):
            upper.below = lower
    return tiers


def check_names(names: list[str]) -> None:
    if len(set(names)) != len(names):
        raise ConfigError(f"cache tiers: {names} repeats a tier; allowed: each of cpu, disk, shared at most once")


def attach_shared(tiers: list[PrefixTier | TierView], view: TierView, write_through: bool) -> None:
    """Put `view` of the cluster's shared store at the bottom of one replica's chain `tiers` (in place, in place
    of a private shared tier the replica's own config built), below its local tiers."""
    tiers[:] = [t for t in tiers if t.name != view.name]
    if tiers and not write_through:
        tiers[-1].below = view
    tiers.append(view)
    check_names([t.name for t in tiers])


def connect(pool: BlockPool, tiers: list[PrefixTier | TierView], write_through: bool) -> None:
    """Hook the GPU `pool` to its chain: write-back, its evictions go to the top tier; write-through, every key
    it registers is stored in every tier at once (and its evictions move nothing)."""
    if write_through:

        def write(key: int, block_id: int) -> None:
            for tier in tiers:  # the list itself: a shared store attached later is written too
                tier.store(key, block_id)

        pool.spill = None
        pool.on_register = write
    else:
        pool.on_register = None
        pool.spill = tiers[0].store_many


def offloading_blocks(size_gib: float | None, bytes_per_block: float, blocks: int) -> int:
    """The CPU prefix tier's blocks: `kv_offloading_blocks` (`blocks`), or the whole blocks `kv_offloading_size`
    GiB hold at `bytes_per_block` (the model's KV bytes per block, every rank's share: vLLM's size is the sum over
    its TP ranks); both given must name the same number. The engine sizes its host pool with it, the simulator
    its tier, from the same two settings."""
    if size_gib is None:
        return blocks
    held = int(size_gib * GIB // bytes_per_block)
    where = f"kv_offloading_size: {size_gib:g} GiB"
    if held == 0:
        raise ConfigError(f"{where} holds no KV block of {bytes_per_block:.0f} bytes; allowed: at least "
                          f"{bytes_per_block / GIB:.3g}")
    if held > MAX_BLOCKS:
        raise ConfigError(f"{where} is {held} blocks of {bytes_per_block:.0f} bytes; allowed: at most {MAX_BLOCKS} "
                          f"blocks ({MAX_BLOCKS * bytes_per_block / GIB:.3g} GiB)")
    if blocks and blocks != held:
        raise ConfigError(f"{where} holds {held} blocks of {bytes_per_block:.0f} bytes but kv_offloading_blocks is "
                          f"{blocks}; allowed: one of the two, or both naming the same number of blocks")
    return held
