"""The hybrid KV allocator: one block pool shared by the KV cache groups of a model that mixes sliding-window and
full-attention layers (vLLM's `HybridKVCacheCoordinator` over one `SingleTypeKVCacheManager` per group).

Every group is a `KVCacheManager` - the same block tables, copy-on-write and holes as the single-group cache -
over the one `BlockPool`, with the group's window as its parameter (`KVGroup.kept_tokens`: sliding_window - 1,
or 0 for full attention) and its own prefix-cache keys (`key_salt`). The coordinator asks every group and answers
for the request as a whole, as vLLM's does:

* allocation: before a request's step allocates, each sliding group frees the blocks wholly before its window
  (num_computed - sliding_window + 1 tokens are skipped: vLLM's `remove_skipped_blocks`, in `allocate_slots`);
  then the blocks every group needs are summed and compared with the free blocks once, and only then allocated,
  group by group - so a request gets blocks in all groups or in none;
* prefix hits: the longest prefix valid for every group. The full groups' hit is the leading run of blocks cached
  in every full group; the sliding groups' is searched right to left within it for cdiv(sliding_window - 1, b)
  consecutive blocks cached in every sliding group (or a shorter run from block 0), the blocks before that run
  are holes; the full groups' hit is then cut to that length (vLLM's simple-hybrid case: full first, one pass);
* the full-prompt gate (`scheduler_reserve_full_isl`) counts a sliding group's need capped at
  cdiv(min(sliding_window - 1 + budget, max_model_len), b) + 1 blocks (vLLM's `max_admission_blocks_per_request`);
* registration, freeing (group by group, each tail first) and forks go to every group.

A sliding group therefore never holds more than cdiv(sliding_window - 1 + chunk, b) + 1 blocks of one request in a
step of `chunk` new tokens, so cdiv(sliding_window, b) + 1 while decoding (see `tests/core/test_kv_groups.py`).
The per-group blocks in use are kept exactly (each group operation's change of the pool's used count), so the
simulator reports each kind's usage beside the pool's.

Not modelled: vLLM 0.33's sparse sliding-window prefix-cache retention (`prefix_cache_retention_interval`, default
0, caches only replay boundaries of sliding groups); this is its dense retention (`None`), every full block cached.
No swap (vLLM V1 has none) and no beam search with sliding groups.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import fields
from typing import TYPE_CHECKING

from kvplan.engine.core.block_keys import stable_id_hash
from kvplan.engine.core.block_pool import BlockPool, KVBlock
from kvplan.engine.core.config import CacheConfig, ConfigError, HybridCacheConfig
from kvplan.engine.core.kv_layout import cdiv
from kvplan.engine.core.kv_manager import NO_COPIES, KVCacheManager
from kvplan.engine.core.request import Request

if TYPE_CHECKING:
    from kvplan.engine.core.prefix_tiers import TierView
    from kvplan.engine.core.tier_transfers import TierTransfer


class GroupHits:
    """A prefix hit across groups: `blocks[g]` is group g's list (None where a sliding group's window left a
    hole); every list has the hit's length in blocks, which is `len()` of this object (what the scheduler reads)."""

    __slots__ = ("blocks",)

    def __init__(self, blocks: list[list[KVBlock | None]]) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks[0])


class GroupBlockIds(Mapping):
    """request id -> its block ids per group (vLLM's `KVCacheBlocks.get_block_ids()`: one list per group)."""

    def __init__(self, managers: list[KVCacheManager]) -> None:
        self._managers = managers

    def __getitem__(self, request_id: str) -> tuple[list[int], ...]:
        return tuple(m.block_ids[request_id] for m in self._managers)

    def __iter__(self) -> Iterator[str]:
        return iter(self._managers[0].block_ids)

    def __len__(self) -> int:
        return len(self._managers[0].block_ids)


class HybridKVCacheManager:
    def __init__(self, config: HybridCacheConfig, max_in_flight_tokens: int) -> None:
        self.config = config
        layout = config.kv_layout
        assert layout is not None  # built for a hybrid layout only (`make_kv_manager`)
        self.layout = layout
        self.block_size = bs = config.block_size
        self.pool = BlockPool(config.num_blocks, bs, config.eviction_policy, config.enable_prefix_caching)
        self.cpu_pool = None
        self.tiers: tuple[()] = ()  # no prefix tiers below the GPU (the config refuses them with a hybrid layout)
        self.managers = [
            KVCacheManager(CacheConfig(**{**{f.name: getattr(config, f.name) for f in fields(CacheConfig)},
                                          "window_tokens": g.kept_tokens, "sink_tokens": 0}), self.pool,
                           stable_id_hash(f"kv-group-{i}") if i else 0, tables_on_requests=False)
            for i, g in enumerate(layout.groups)]
        self.sliding = [m for m, g in zip(self.managers, layout.groups, strict=True) if g.sliding]
        self.full = [m for m, g in zip(self.managers, layout.groups, strict=True) if not g.sliding]
        self._sliding_index = [i for i, g in enumerate(layout.groups) if g.sliding]
        self.window = max((g.sliding_window for g in layout.groups), default=0)
        # vLLM's admission cap of a sliding group: the window, plus what a step may add before it slides
        self.sliding_cap = cdiv(min(self.window - 1 + max_in_flight_tokens, config.max_model_len), bs) + 1
        self.block_ids = GroupBlockIds(self.managers)
        self.group_used = [0] * len(self.managers)  # blocks in use per group (ref_cnt > 0, in its tables)
        self.prefix_queries = 0
        self.prefix_hits = 0

    # -- capacity ------------------------------------------------------------------------------------------
    @property
    def groups(self) -> list[KVCacheManager]:
        """One manager per KV cache group, in the layout's order (`KVManager.groups`)."""
        return self.managers

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def usage(self) -> float:
        return self.pool.usage()

    def _tracked(self, g: int, op, *args):
        """Run a group manager's operation, crediting the change in blocks in use to group g: a block changes
        hands between 0 and 1 references only inside its own group's operation (hits are keyed per group)."""
        pool = self.pool
        before = pool.num_free
        result = op(*args)
        self.group_used[g] += before - pool.num_free
        return result

    def admission_error(self, request: Request, chunk: int) -> str | None:
        total = self.config.num_blocks
        need = self.config.peak_blocks(request.final_len - 1, chunk)  # the last sampled token is never written
        if need <= total:
            return None
        return (f"needs {need} KV blocks at its peak over {len(self.managers)} KV cache groups "
                f"({self.layout.describe()}; sliding window {self.window}, steps of up to {chunk} new tokens at "
                f"block size {self.block_size}) but the cache holds only {total}")

    # -- prefix cache --------------------------------------------------------------------------------------
    def find_cached_prefix(self, request: Request) -> GroupHits:
        """The longest prefix hit valid for every group; never covers the last token to compute."""
        block_keys = request.block_keys
        limit = (request.num_tokens - 1) // self.block_size
        if block_keys is None or not self.pool.enable_caching or limit <= 0:
            return GroupHits([[] for _ in self.managers])
        block_keys.key(limit - 1)
        keys = block_keys.keys[:limit]  # a token-keyed request stops at its first block that is not full
        cached = self.pool.cached
        full_salts = [m.key_salt for m in self.full]
        n = 0
        for key in keys:
            if any((key ^ s) not in cached for s in full_salts):
                break
            n += 1
        # sliding groups: right to left, the first run of `need` blocks cached in every sliding group
        need = cdiv(self.window - 1, self.block_size)
        sliding_salts = [m.key_salt for m in self.sliding]
        run, end = 0, None
        for i in range(n - 1, -1, -1):
            key = keys[i]
            if all((key ^ s) in cached for s in sliding_salts):
                run += 1
                if run >= need:
                    end = i + run
                    break
            else:
                run = 0
        if end is None:
            end = run  # no full run: the leading blocks that are cached still hit
        blocks: list[list[KVBlock | None]] = []
        for m in self.managers:
            salt = m.key_salt
            if m in self.sliding:
                blocks.append([None] * (end - run) + [cached[key ^ salt] for key in keys[end - run:end]])
            else:
                blocks.append([cached[key ^ salt] for key in keys[:end]])
        return GroupHits(blocks)

    def cached_prefix_blocks(self, request: Request) -> int:
        """The prefix hit's length in blocks (the lookup moves nothing: there are no tiers to promote from)."""
        return len(self.find_cached_prefix(request))

    def num_cached_tokens(self, request: Request) -> int:
        """Tokens of the prefix hit valid for every group (vLLM's `get_num_cached_tokens`); moves nothing."""
        return self.cached_prefix_blocks(request) * self.block_size

    def commit(self, request: Request, num_tokens: int) -> None:
        """Register the full blocks within `num_tokens` in every group. `request.num_hashed_blocks` is the same
        for every group (they take hits of one length and register in the same steps), so each starts from it."""
        first = request.num_hashed_blocks
        for m in self.managers:
            request.num_hashed_blocks = first
            m.commit(request, num_tokens)

    def unregister_since(self, request: Request, first_block: int) -> None:
        hashed = request.num_hashed_blocks
        for m in self.managers:
            request.num_hashed_blocks = hashed
            m.unregister_since(request, first_block)

    def record_admission(self, request: Request, num_hit_blocks: int) -> None:
        self.prefix_queries += request.num_tokens
        self.prefix_hits += num_hit_blocks * self.block_size

    # -- allocation ----------------------------------------------------------------------------------------
    def _hits(self, hits: GroupHits | None, g: int) -> list[KVBlock | None] | None:
        return hits.blocks[g] if hits else None

    def fits_whole(self, request: Request, hits: GroupHits, reserve: int) -> bool:
        """The full-prompt gate: every group's blocks for all of the request's tokens beyond its hits (a sliding
        group's capped at `sliding_cap`), plus the hits that are free cached blocks, fit with `reserve` to spare."""
        tokens = min(request.num_tokens, self.config.max_model_len)
        need = 0
        for g, m in enumerate(self.managers):
            required = cdiv(tokens, self.block_size)
            if m.config.windowed:
                required = min(required, self.sliding_cap)
            group_hits = self._hits(hits, g) or []
            need += max(required - len(group_hits), 0)
            need += sum(1 for b in group_hits if b is not None and b.ref_cnt == 0)
        return need + reserve <= self.pool.num_free

    def _trim(self, request: Request) -> None:
        """Free every sliding group's blocks that fell out of the window (vLLM does it first in `allocate_slots`).
        Most steps free nothing (a block leaves a window every b tokens): only a block still held just before the
        window calls for the release."""
        rid, bs, computed = request.request_id, self.block_size, request.num_computed_tokens
        for g in self._sliding_index:
            m = self.managers[g]
            table = m.tables[rid]
            last_gone = (computed - m.config.window_tokens) // bs - 1  # the block that left last, if any
            if last_gone >= 0 and table[last_gone] is not None:
                self._tracked(g, m.release_outside_window, request)

    def _need(self, request: Request, num_new_tokens: int, hits: GroupHits | None) -> int:
        need = 0
        for g, m in enumerate(self.managers):
            table = m.tables.get(request.request_id)
            if not m.has_room(request, table, num_new_tokens):
                need += self.pool.num_free - m.plan(request, table, num_new_tokens, self._hits(hits, g))[3]
        return need

    def allocate(self, request: Request, num_new_tokens: int, hits: GroupHits | None = None,
                 reserve: int = 0) -> tuple[tuple[int, int], ...] | None:
        """Room for `num_new_tokens` more tokens in every group, or None (changing nothing but the window's
        release) when fewer than `reserve` blocks would remain free."""
        tables = self.managers[0].tables.get(request.request_id)
        if tables is not None:
            self._trim(request)
            if all(m.has_room(request, m.tables[request.request_id], num_new_tokens) for m in self.managers):
                return NO_COPIES  # the common decode step: room left in every group's private last block
        if self.pool.num_free - self._need(request, num_new_tokens, hits) < reserve:
            return None
        if hits:
            # Every group takes its hits before any group allocates: a new block may evict a cached free block,
            # and must never take one another group is about to hit (vLLM's `allocate_new_computed_blocks` first)
            for g, m in enumerate(self.managers):
                table = m.tables[request.request_id] = []
                ids = m.block_ids[request.request_id] = []
                self._tracked(g, m.take_hits, request, hits.blocks[g], table, ids)
        copies = NO_COPIES
        for g, m in enumerate(self.managers):
            done = self._tracked(g, m.allocate, request, num_new_tokens, None, 0)
            if done:
                copies = copies + done
        return copies

    def can_allocate(self, request: Request, num_new_tokens: int, hits: GroupHits | None = None,
                     reserve: int = 0) -> bool:
        """Whether `allocate` would succeed (nothing changes here): the window's release counted as free."""
        released = 0
        if request.request_id in self.managers[0].tables:
            if all(m.has_room(request, m.tables[request.request_id], num_new_tokens) for m in self.managers):
                return True  # `allocate`'s decode step: nothing to allocate, whatever the reserve
            for m in self.sliding:
                first_visible = max(0, request.num_computed_tokens - m.config.window_tokens) // self.block_size
                table = m.tables[request.request_id]
                i = first_visible - 1
                while i >= 0:
                    block = table[i]
                    if block is None:
                        break
                    released += block.ref_cnt == 1
                    i -= 1
        return self.pool.num_free + released - self._need(request, num_new_tokens, hits) >= reserve

    def publish(self, request: Request) -> None:
        for m in self.managers:
            m.publish(request)

    def free(self, request: Request) -> None:
        """Every group's blocks, group by group (vLLM's coordinator order), each tail first."""
        for g, m in enumerate(self.managers):
            self._tracked(g, m.free, request)

    def fork(self, parent: Request, child: Request) -> bool:
        for m in self.managers:
            m.fork(parent, child)
        return True

    def release_outside_window(self, request: Request) -> list[int]:
        """Nothing after a step: the sliding groups release when the request next allocates (as vLLM)."""
        return []

    def swap_out(self, group: list[Request]) -> None:
        """No CPU pool (vLLM V1 has no swap): the caller recomputes."""
        return None

    def swap_in_cost(self, group: list[Request], num_new_tokens: list[int]) -> int:
        raise RuntimeError("the hybrid allocator swaps nothing out (`swap_out` is None), so nothing swaps in")

    def swap_in(self, group: list[Request]) -> list[tuple[int, int]]:
        raise RuntimeError("the hybrid allocator swaps nothing out (`swap_out` is None), so nothing swaps in")

    def take_transfers(self) -> list[TierTransfer]:
        """No tiers, so no tier copies."""
        return []

    def share_tier(self, view: TierView) -> None:
        raise ConfigError("a shared prefix store needs the single-group paged cache; the hybrid allocator has no "
                          "prefix tiers")
