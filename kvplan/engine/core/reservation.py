"""Contiguous-reservation allocators: the baselines PagedAttention is measured against.

Each request reserves one contiguous extent of token slots in a single address space, placed first-fit:

* `max`    - the model's maximum length (Orca "Max"),
* `pow2`   - the next power of two of the request's real need (prompt + output budget),
* `oracle` - exactly the real need.

Slots reserved but not yet written are *reserved_unused*, slots beyond the real need are *internal
fragmentation*, and free slots outside the largest free extent are *external fragmentation*: all three are real
here because the address space really is contiguous. The interface mirrors `KVCacheManager`; there is no
prefix caching, swap or sliding window.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from kvplan.engine.core.config import CacheConfig, ConfigError
from kvplan.engine.core.kv_manager import NO_COPIES
from kvplan.engine.core.request import Request

if TYPE_CHECKING:
    from kvplan.engine.core.prefix_tiers import TierView
    from kvplan.engine.core.tier_transfers import TierTransfer


def next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


class ReservationAllocator:
    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.block_size = config.block_size
        self.total_slots = config.num_blocks * config.block_size
        self._free_starts: list[int] = [0]  # free extents, sorted by start
        self._free_lengths: dict[int, int] = {0: self.total_slots}
        self.extents: dict[str, tuple[int, int]] = {}  # request id -> (start, length)
        self.tables: dict[str, list] = {}
        self.block_ids: dict[str, list[int]] = {}
        self.reserved_slots = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        # No blocks, no prefix cache and no tiers (`KVManager`): the config refuses tiers with this allocator.
        self.pool: None = None
        self.tiers: tuple[()] = ()
        self.groups: tuple[()] = ()

    def reservation(self, request: Request) -> int:
        mode, need = self.config.allocator, min(request.final_len, self.config.max_model_len)
        if mode == "max":
            return self.config.max_model_len
        if mode == "pow2":
            return min(next_pow2(need), self.config.max_model_len)
        return need

    # -- capacity ------------------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return (self.total_slots - self.reserved_slots) // self.block_size

    def usage(self) -> float:
        return self.reserved_slots / self.total_slots

    def largest_free_extent(self) -> int:
        return max(self._free_lengths.values(), default=0)

    def admission_error(self, request: Request, chunk: int) -> str | None:
        size = self.reservation(request)
        if size > self.total_slots:
            return (f"reserves {size} contiguous slots ({self.config.allocator}) but the cache holds only "
                    f"{self.total_slots}")
        return None

    # -- the KVCacheManager interface ----------------------------------------------------------------------
    def find_cached_prefix(self, request: Request) -> list:
        return []

    def cached_prefix_blocks(self, request: Request) -> int:
        return 0

    def num_cached_tokens(self, request: Request) -> int:
        return 0  # no prefix cache

    def commit(self, request: Request, num_tokens: int) -> None:
        return None

    def unregister_since(self, request: Request, first_block: int) -> None:
        return None

    def publish(self, request: Request) -> None:
        return None  # (no prefix cache)

    def fits_whole(self, request: Request, hits: list, reserve: int) -> bool:
        return True  # an admission reserves the whole request anyway (`allocate`)

    def record_admission(self, request: Request, num_hit_blocks: int) -> None:
        self.prefix_queries += request.num_tokens

    def allocate(self, request: Request, num_new_tokens: int, hits: list | None = None,
                 reserve: int = 0) -> tuple[tuple[int, int], ...] | None:
        rid = request.request_id
        if rid in self.extents:
            return NO_COPIES
        if not self.can_allocate(request, num_new_tokens, hits, reserve):
            return None
        size = self.reservation(request)
        start = self._first_fit(size)
        assert start is not None  # `can_allocate` saw a free extent at least this large
        self.extents[rid] = (start, size)
        self.tables[rid] = []
        self.block_ids[rid] = []
        self.reserved_slots += size
        return NO_COPIES

    def can_allocate(self, request: Request, num_new_tokens: int, hits: list | None = None,
                     reserve: int = 0) -> bool:
        """Whether `allocate` with these arguments would succeed (it changes nothing here)."""
        if request.request_id in self.extents:
            return True
        size = self.reservation(request)
        return (self.total_slots - self.reserved_slots - size >= reserve * self.block_size
                and self.largest_free_extent() >= size)

    def _first_fit(self, size: int) -> int | None:
        for start in self._free_starts:
            length = self._free_lengths[start]
            if length >= size:
                self._free_starts.remove(start)
                del self._free_lengths[start]
                if length > size:
                    self._insert_free(start + size, length - size)
                return start
        return None

    def _insert_free(self, start: int, length: int) -> None:
        bisect.insort(self._free_starts, start)
        self._free_lengths[start] = length

    def free(self, request: Request) -> None:
        extent = self.extents.pop(request.request_id, None)
        if extent is None:
            return
        del self.tables[request.request_id], self.block_ids[request.request_id]
        start, length = extent
        self.reserved_slots -= length
        starts, lengths = self._free_starts, self._free_lengths
        i = bisect.bisect_left(starts, start)
        if i < len(starts) and starts[i] == start + length:  # merge with the extent after
            length += lengths.pop(starts.pop(i))
        if i > 0 and starts[i - 1] + lengths[starts[i - 1]] == start:  # merge with the extent before
            lengths[starts[i - 1]] += length
        else:
            self._insert_free(start, length)

    def fork(self, parent: Request, child: Request) -> bool:
        """A child needs its own reservation (contents copied by the runner); False when none fits."""
        return self.allocate(child, 0) is not None

    def swap_out(self, group: list[Request]) -> None:
        return None  # not supported: the scheduler falls back to recompute

    def swap_in_cost(self, group: list[Request], num_new_tokens: list[int]) -> int:
        raise RuntimeError("a reservation allocator swaps nothing out (`swap_out` is None), so nothing swaps in")

    def swap_in(self, group: list[Request]) -> list[tuple[int, int]]:
        raise RuntimeError("a reservation allocator swaps nothing out (`swap_out` is None), so nothing swaps in")

    def take_transfers(self) -> list[TierTransfer]:
        """No tiers, so no tier copies."""
        return []

    def share_tier(self, view: TierView) -> None:
        raise ConfigError(f"a shared prefix store needs the paged allocator, not {self.config.allocator!r}")

    def release_outside_window(self, request: Request) -> list[int]:
        return []
