"""The prefix tiers below the GPU as one KV manager sees them: lookups that promote, a side-effect-free probe, the
shared store's attachment and the log of tier copies (`prefix_tiers`, `tier_transfers`).

A mixin of `KVCacheManager` (kept apart so that the manager's own module stays the paged block tables): it uses
the manager's `config`, `pool`, `block_size` and `find_cached_prefix`. Invariant: `transfers` holds every copy
between the GPU and the tiers since the last `take_transfers`, in the order the core made them - a demotion caused
by an allocation is logged before the copy into the block it freed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.engine.core.prefix_tiers import PrefixTier, TierSpec, TierView, attach_shared, build_tiers, connect
from kvplan.engine.core.tier_transfers import GPU, TierTransfer, promotions_of

if TYPE_CHECKING:
    from kvplan.engine.core.block_pool import BlockPool, KVBlock
    from kvplan.engine.core.config import CacheConfig
    from kvplan.engine.core.request import Request


class TieredPrefix:
    """The tier half of a KV manager (see the module)."""

    config: CacheConfig
    pool: BlockPool
    block_size: int
    windowed: bool
    tiers: list[PrefixTier | TierView]
    transfers: list[TierTransfer]

    def find_cached_prefix(self, request: Request) -> list[KVBlock]:
        """The manager's own (it overrides this). Declared by a method rather than under `if TYPE_CHECKING:`,
        because mypyc compiles no statement but a definition in a class body."""
        raise NotImplementedError("KVCacheManager.find_cached_prefix overrides this declaration")

    def _init_tiers(self, config: CacheConfig, own_pool: bool) -> None:
        """Build the chain from the settings; hook it to the pool only when this manager owns the pool (a hybrid
        model's groups share the coordinator's, which has no tiers)."""
        self.transfers = []
        # a list of its own type: `share_tier` may put a view of the shared store at its bottom
        self.tiers = list(build_tiers([TierSpec("cpu", config.kv_offloading_blocks, config.kv_offloading_eviction),
                                       TierSpec("disk", config.kv_disk_blocks),
                                       TierSpec("shared", config.kv_shared_blocks, config.kv_shared_eviction)],
                                      config.block_size, config.kv_offloading_write_through, self.transfers))
        if self.tiers and own_pool:
            connect(self.pool, self.tiers, config.kv_offloading_write_through)

    def cached_prefix_blocks(self, request: Request) -> int:
        """How many leading blocks the GPU and the lower tiers hold for `request` - what `find_cached_prefix`
        returns when the GPU has room for every promotion - without promoting anything (a router's probe of every
        replica must not move blocks on the ones it passes over)."""
        keys = request.block_keys
        if not self.tiers or keys is None or not self.pool.enable_caching or self.windowed:
            return len(self.find_cached_prefix(request))
        limit = (request.num_tokens - 1) // self.block_size
        if limit <= 0:
            return 0
        keys.key(limit - 1)
        cached, count = self.pool.cached, 0
        for key in keys.keys[:limit]:
            if key not in cached and not any(key in tier for tier in self.tiers):
                break
            count += 1
        return count

    def _promote(self, keys: list[int], hits: list[KVBlock]) -> list[KVBlock]:
        """Copy the leading run of `keys` that lower tiers (or, for a later block, the GPU) hold into GPU
        blocks, registered and cached free (so the admission takes them as ordinary hits; `plan` counts them as
        free blocks it takes). Stops at the first key nobody has, or when no GPU block is free. The GPU `hits`
        are pinned meanwhile: a promotion's allocation must not evict the prefix it extends."""
        pool, tiers, promoted = self.pool, self.tiers, []
        cached = pool.cached
        pool.acquire_many(hits)
        for key in keys:
            block = cached.get(key)
            if block is not None:  # past the first tier hit the GPU may hold a later block: a plain hit
                pool.acquire(block)
                promoted.append(block)
                continue
            for tier in tiers:  # the first tier that holds it
                if key in tier:
                    break
            else:
                break  # nobody holds it
            if pool.num_free == 0:
                break
            slot = tier.pin(key)  # a demotion this allocation causes must not evict the slot being copied
            assert slot is not None  # the tier holds `key`
            block = pool.allocate()  # its eviction's demotion is logged before this copy into the block
            pool.register(block, key)
            tier.unpin(slot)
            tier.stats.hits += 1
            tier.stats.promotions += 1
            self.transfers.append(TierTransfer(tier.name, slot.block_id, GPU, block.block_id))
            promoted.append(block)
        pinned: list[KVBlock | None] = [*hits, *promoted]
        pool.release_all(pinned)
        return promoted

    def share_tier(self, view: TierView) -> None:
        """Use a view of the cluster's one shared store as the bottom tier (instead of a private one); before any
        traffic."""
        attach_shared(self.tiers, view, self.config.kv_offloading_write_through)
        connect(self.pool, self.tiers, self.config.kv_offloading_write_through)

    def take_transfers(self) -> list[TierTransfer]:
        """The tier copies made since the last call, in order (performed before this step's forward); clears
        the log (emptied in place: the tiers share it)."""
        out = list(self.transfers)
        self.transfers.clear()
        return out

    def take_promotions(self) -> list[tuple[str, int]]:
        """The (tier, GPU block id) promotions among `take_transfers`."""
        return promotions_of(self.take_transfers())
