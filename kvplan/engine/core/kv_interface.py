"""The KV manager interface: what the scheduler, the metrics and the simulator's routers, links and replicas ask of
a KV cache, whichever allocator implements it.

Three managers implement it: `KVCacheManager` (paged block tables of one group, with optional prefix tiers below
the GPU), `HybridKVCacheManager` (vLLM's hybrid allocator: one pool under several groups) and
`ReservationAllocator` (contiguous reservations, the baselines). Nobody probes a manager for optional members:
each declares all of them, with the value that says "not here" (`pool` None, `tiers` empty, `groups` empty).

Contract, for every manager:

* `allocate` changes nothing when it returns None; `can_allocate` answers what `allocate` would, changing nothing;
* a prefix hit is the manager's own value (`find_cached_prefix`), handed back unchanged to `fits_whole` and
  `allocate`; `len()` of it is its length in blocks, the only thing the scheduler reads;
* `free` releases everything a request holds (its GPU and CPU blocks), tail first; `publish` before it where the
  request may look its blocks up again (a preemption: `block_pool`'s private blocks);
* `swap_out` returns None when it swapped nothing (the scheduler then recomputes), so `swap_in_cost` and `swap_in`
  are only ever called for a group it swapped out;
* `cached_prefix_blocks` counts a request's cached prefix, lower tiers included, without moving any block (a
  router probes every replica); `num_cached_tokens` counts the GPU's part only, in tokens, moving nothing
  (vLLM's `get_num_cached_tokens`: cache-aware admission's probe);
* `take_transfers` empties the log of tier copies made since the last call (always empty without `tiers`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from kvplan.engine.core.block_pool import BlockPool
    from kvplan.engine.core.config import CacheConfig
    from kvplan.engine.core.kv_manager import KVCacheManager
    from kvplan.engine.core.prefix_tiers import PrefixTier, TierView
    from kvplan.engine.core.request import Request
    from kvplan.engine.core.tier_transfers import TierTransfer

# A manager's prefix hit: its `find_cached_prefix` result, passed back to its `fits_whole` and `allocate` as is;
# `len()` is its length in blocks (a list of blocks, a hybrid `GroupHits`, an empty list without caching).
PrefixHits = Any
Copies = tuple[tuple[int, int], ...]  # (src, dst) copy-on-write pairs


@runtime_checkable
class KVManager(Protocol):
    """See the module. Data members are read-only properties here, so an implementation may narrow their types
    (a paged manager's `pool` is never None)."""

    @property
    def config(self) -> CacheConfig: ...

    @property
    def block_size(self) -> int: ...

    @property
    def pool(self) -> BlockPool | None:
        """The GPU block pool (None: a reservation cache has no blocks)."""

    @property
    def tiers(self) -> Sequence[PrefixTier | TierView]:
        """The prefix tiers below the GPU, top first (empty: evicted blocks are dropped)."""

    @property
    def groups(self) -> Sequence[KVCacheManager]:
        """The single-group managers whose block tables make up the cache: itself for a paged cache, one per
        KV cache group for the hybrid one, none for a reservation cache."""

    @property
    def block_ids(self) -> Mapping[str, Any]:
        """request id -> its block ids (a hybrid cache: one list per group), as the model runner reads them."""

    @property
    def num_free_blocks(self) -> int: ...

    @property
    def prefix_queries(self) -> int: ...

    @property
    def prefix_hits(self) -> int: ...

    def usage(self) -> float: ...

    def admission_error(self, request: Request, chunk: int) -> str | None: ...

    def find_cached_prefix(self, request: Request) -> PrefixHits: ...

    def cached_prefix_blocks(self, request: Request) -> int: ...

    def num_cached_tokens(self, request: Request) -> int: ...

    def commit(self, request: Request, num_tokens: int) -> None: ...

    def unregister_since(self, request: Request, first_block: int) -> None: ...

    def fits_whole(self, request: Request, hits: PrefixHits, reserve: int) -> bool: ...

    def allocate(self, request: Request, num_new_tokens: int, hits: PrefixHits = None,
                 reserve: int = 0) -> Copies | None: ...

    def can_allocate(self, request: Request, num_new_tokens: int, hits: PrefixHits = None,
                     reserve: int = 0) -> bool: ...

    def record_admission(self, request: Request, num_hit_blocks: int) -> None: ...

    def publish(self, request: Request) -> None: ...

    def free(self, request: Request) -> None: ...

    def fork(self, parent: Request, child: Request) -> bool: ...

    def swap_out(self, group: list[Request]) -> list[tuple[int, int]] | None: ...

    def swap_in_cost(self, group: list[Request], num_new_tokens: list[int]) -> int: ...

    def swap_in(self, group: list[Request]) -> list[tuple[int, int]]: ...

    def release_outside_window(self, request: Request) -> list[int]: ...

    def take_transfers(self) -> list[TierTransfer]: ...

    def share_tier(self, view: TierView) -> None: ...
