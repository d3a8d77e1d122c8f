"""Paged KV manager: per-request block tables over a `BlockPool`.

A block table maps a request's logical block i (tokens [i*b, (i+1)*b)) to a physical block. Sharing is by
reference count: a prefix-cache hit or a fork puts the same physical block into several tables. The rules:

* A prefix hit covers full blocks only, whose keys match the whole chain, and never the last token to compute
  (its logits are needed), so at most (num_tokens - 1) // b blocks hit. In sink+window mode at most the sink
  blocks plus one window's blocks hit: more would be held at once past the request's admitted peak.
* Copy-on-write: a request about to write into a partial block that another table also holds gets a private
  copy first; the (src, dst) pair is returned for the model runner. Nothing is ever written into a partial block
  whose ref count is above one. A full block is keyed when the step that computes it is scheduled, so a request
  admitted later in that step may already hold it as a prefix hit while it is written: its key fixes its contents,
  and the engine writes a step's KV before any attention of the step reads it.
* Freeing is tail-first, so the eviction policy sees a chain's deepest block first.
* Sink+window mode keeps the blocks of the first S tokens and of the last W tokens and releases whole blocks in
  between (holes are `None` in the table), so a request holds at most ceil(S/b) + ceil(W/b) + 1 blocks::

      logical:  [s0][s1][--][--][--][w0][w1][w2 partial]
                 sinks   released     recent window
* Swap moves a sequence group's blocks to a CPU-side pool and back, all or nothing, returning the (src, dst)
  copies; a block the group's members share is copied once and is shared again after swap-in (`swap_copies`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, cast

from kvplan.engine.core.block_keys import PUBLIC
from kvplan.engine.core.block_pool import BlockPool, KVBlock
from kvplan.engine.core.config import CacheConfig
from kvplan.engine.core.prefix_tiers import TierView
from kvplan.engine.core.request import Request
from kvplan.engine.core.swap_copies import copy_tables, distinct_blocks, swap_in_blocks
from kvplan.engine.core.tiered_prefix import TieredPrefix

NO_COPIES: Final[tuple[tuple[int, int], ...]] = ()
HOLE: Final = -1  # block id placed in `block_ids` where sink+window released a block


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager(TieredPrefix):
    """The block tables of one KV cache group. Alone it is the whole cache (every layer alike); under the hybrid
    allocator (`kv_groups`) one manager per group shares the coordinator's `pool`, its prefix-cache keys told
    apart from the other groups' by `key_salt` (vLLM keys a cached block by hash and group id)."""

    def __init__(self, config: CacheConfig, pool: BlockPool | None = None, key_salt: int = 0,
                 tables_on_requests: bool = True) -> None:
        self.config = config
        self.block_size = config.block_size
        self.key_salt = key_salt
        self.pool = pool if pool is not None else BlockPool(config.num_blocks, config.block_size,
                                                            config.eviction_policy, config.enable_prefix_caching)
        self.cpu_pool = (BlockPool(config.num_cpu_blocks, config.block_size, "lru", enable_caching=False)
                         if config.num_cpu_blocks else None)
        # Prefix tiers below the GPU (none: the pool drops what it evicts, exactly as vLLM without offloading).
        self._init_tiers(config, own_pool=pool is None)
        self.tables: dict[str, list[KVBlock | None]] = {}
        # Each table also as its request's `kv_table` (the whole cache; a hybrid cache's groups each hold one per
        # request, so none of them is the request's): set by `_hold`, dropped by `free`
        self.tables_on_requests = tables_on_requests
        self.block_ids: dict[str, list[int]] = {}  # the same tables as plain ids, for the model runner
        self.cpu_tables: dict[str, list[KVBlock | None]] = {}
        self.sink_blocks = cdiv(config.sink_tokens, config.block_size)
        # A request of n tokens holds ⌈n / b⌉ blocks here unless a window releases some: `request_blocks` answers
        # `CacheConfig.blocks_per_request` without calling the interpreted configuration in that common case (the
        # admission checks ask it several times per request)
        self._every_block = not config.windowed and config.hybrid_layout is None
        self.windowed = config.windowed  # (read at every prefix lookup: an attribute, not the configuration's property)
        # Whether requests' own runs may be private blocks (`block_pool`): where it is the whole cache (a group's or
        # a window's released blocks would leave a table unpublished), the eviction policy reads no key, and no
        # lower tier is told of keys or evictions (nor could hold another instance's keys: `share_tier` clears it)
        self._private_blocks = (self._every_block and tables_on_requests and not self.pool.policy.reads_keys
                                and not self.tiers)
        self.prefix_queries = 0  # tokens looked up at admission
        self.prefix_hits = 0  # tokens found cached

    # -- capacity ------------------------------------------------------------------------------------------
    @property
    def groups(self) -> tuple[KVCacheManager]:
        """The one group whose tables make up this cache: itself (`KVManager.groups`)."""
        return (self,)

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def usage(self) -> float:
        return self.pool.usage()

    def admission_error(self, request: Request, chunk: int) -> str | None:
        """Why `request` could never run even alone in an empty cache, writing at most `chunk` tokens a step,
        or None. The watermark plays no part: it never holds back the only request that could run."""
        total = self.config.num_blocks
        need = self.peak_blocks(request.final_len - 1, chunk)  # the last sampled token is never written
        if request.beam and need * request.n > total:  # every beam resident at once, nothing shared
            return (f"needs {need * request.n} KV blocks for {request.n} beams of {request.final_len} tokens with "
                    f"nothing shared (block size {self.block_size}) but the cache holds only {total}")
        if need <= total:
            return None
        if not self.windowed:
            return (f"needs {need} KV blocks ({request.final_len} tokens at block size {self.block_size}) "
                    f"but the cache holds only {total}")
        return (f"needs {need} KV blocks at its peak (sinks, a window of {self.config.window_tokens} tokens and a "
                f"step of up to {chunk} new tokens at block size {self.block_size}) but the cache holds only "
                f"{total}; allowed: a smaller max_num_batched_tokens, window or block size, or more blocks")

    # -- prefix cache --------------------------------------------------------------------------------------
    def find_cached_prefix(self, request: Request) -> list[KVBlock]:
        """Longest run of leading full blocks already cached; never covers the last token to compute. Blocks the
        GPU lacks but a lower tier holds are promoted into the GPU on the way."""
        hits, keys, limit = self._gpu_prefix(request)
        if self.tiers and keys is not None and len(hits) < limit:
            hits += self._promote(keys[len(hits):limit], hits)
        return hits

    def num_cached_tokens(self, request: Request) -> int:
        """Tokens of the request's prefix the GPU cache holds (vLLM's `get_num_cached_tokens`): a probe that takes,
        promotes and evicts nothing; lower tiers are not asked (vLLM's probe asks the GPU cache, not a connector)."""
        return len(self._gpu_prefix(request)[0]) * self.block_size

    def _gpu_prefix(self, request: Request) -> tuple[list[KVBlock], list[int] | None, int]:
        """(the GPU's cached leading blocks, the request's block keys, the most blocks a hit may cover)."""
        keys = request.block_keys
        if keys is None or not self.pool.enable_caching:
            return [], None, 0
        cached = self.pool.cached
        hits: list[KVBlock] = []
        limit = (request.num_tokens - 1) // self.block_size
        if self.windowed:  # only blocks the step keeps (sinks + one window): more would pass its peak
            limit = min(limit, self.sink_blocks + self.config.window_tokens // self.block_size)
        # Never admitted yet, its own run's keys (salted with its id) are in no pool (no lower tier): they would miss
        if request.num_preemptions == 0 and self._private_blocks:
            limit = min(limit, request.private_from)
        if limit <= 0:
            return hits, None, 0
        # Every key up to the limit in one call (a blocked queue head is looked up again every step), then plain
        # list reads; a token-keyed request stops at its first block that is not full (its key is None).
        keys.key(limit - 1)
        # (keys as objects, as `BlockPool.register_blocks` takes them: a compiled build looks each up as it is)
        keyed = cast("dict[int | None, KVBlock]", cached)
        # (the list itself, up to the limit: a slice would copy every key up to it, where most lookups stop early)
        for taken, key in enumerate(cast("list[int | None]", keys.keys)):
            if taken == limit:
                break
            block = keyed.get(key)
            if block is None:
                break
            hits.append(block)
        return hits, keys.keys, limit

    def commit(self, request: Request, num_tokens: int) -> None:
        """Register the request's full blocks within its first `num_tokens` tokens in the prefix cache.

        The scheduler calls it when it schedules a step, with the tokens computed once the step has run (as
        vLLM's `allocate_slots` caches blocks): a request admitted later in the same step may then hit blocks
        this step computes - the engine writes a step's KV before any attention of the step reads it."""
        full = num_tokens // self.block_size
        first = request.num_hashed_blocks
        if full <= first or request.block_keys is None or not self.pool.enable_caching:
            return
        table = self.table_of(request)
        assert table is not None  # (blocks are committed only once allocated)
        # Its own run of keys as private blocks (`block_pool`: their keys wait until published; `_private_blocks`)
        private = request.private_from if self._private_blocks else PUBLIC
        if min(full, private) > first:
            request.block_keys.key(min(full, private) - 1)  # computes every key up to it in one call
        keys = request.block_keys.keys
        self.pool.register_blocks(table, keys, first, full if private < full else min(full, len(keys)),
                                  self.key_salt, private)
        request.num_hashed_blocks = full

    def publish(self, request: Request) -> None:
        """The request may look its blocks up again (it is preempted): enter its private ones (`block_pool`)."""
        table = self.table_of(request) if self._private_blocks else None  # (None: no private blocks here)
        private = request.private_from
        if table is not None and private < len(table) and request.block_keys is not None:
            request.block_keys.key(len(table) - 1)  # (its keys up to its last block: it has filled them)
            self.pool.publish(table, request.block_keys.keys, private)

    def share_tier(self, view: TierView) -> None:
        super().share_tier(view)
        self._private_blocks = False  # a lower tier now holds keys (see `_private_blocks`); before any traffic

    def table_of(self, request: Request) -> list[KVBlock | None] | None:
        """The request's block table here, None while it holds none: its `kv_table` where this manager is the
        whole cache (no lookup by id on the per-step paths), else from `tables`."""
        return request.kv_table if self.tables_on_requests else self.tables.get(request.request_id)

    def _hold(self, request: Request, table: list[KVBlock | None], ids: list[int]) -> None:
        """Give `request` its block `table` (and `ids`, the same blocks as plain ids): in `tables` and `block_ids`,
        and as its `kv_table` where this manager is the whole cache. (`free` drops all three.)"""
        self.tables[request.request_id] = table
        self.block_ids[request.request_id] = ids
        if self.tables_on_requests:
            request.kv_table = table

    def unregister_since(self, request: Request, first_block: int) -> None:
        """Undo the registrations of the request's blocks from `first_block` on: the step that registered them
        will not run for it (it was preempted after being scheduled), so their contents are never computed."""
        table = self.tables[request.request_id]
        for i in range(first_block, min(request.num_hashed_blocks, len(table))):
            block = table[i]
            if block is not None:
                self.pool.unregister(block)
        request.num_hashed_blocks = min(request.num_hashed_blocks, first_block)

    # -- allocation ----------------------------------------------------------------------------------------
    def request_blocks(self, num_tokens: int) -> int:
        """`CacheConfig.blocks_per_request(num_tokens)`: the blocks a request of that many tokens holds once its
        window has slid (every block without one)."""
        return cdiv(num_tokens, self.block_size) if self._every_block else self.config.blocks_per_request(num_tokens)

    def peak_blocks(self, num_positions: int, chunk: int) -> int:
        """`CacheConfig.peak_blocks(num_positions, chunk)`: every position's block without a window (asked once per
        arriving request, so the common case stays out of the interpreted configuration class)."""
        return cdiv(max(num_positions, 0), self.block_size) if self._every_block else self.config.peak_blocks(
            num_positions, chunk)

    def fits_whole(self, request: Request, hits: list[KVBlock], reserve: int) -> bool:
        """The full-prompt admission gate (vLLM's `scheduler_reserve_full_isl`): whether the blocks for all of
        the waiting request's tokens (prompt, plus output to recompute) beyond its prefix `hits`, and the hits
        that are free cached blocks, fit in the free blocks with `reserve` to spare. With a sink+window the need
        is capped at the blocks one request holds once its window has slid."""
        need = max(self.request_blocks(request.num_tokens) - len(hits), 0)
        need += sum(1 for b in hits if b.ref_cnt == 0)
        return need + reserve <= self.pool.num_free

    def allocate(self, request: Request, num_new_tokens: int, hits: list[KVBlock] | None = None,
                 reserve: int = 0) -> tuple[tuple[int, int], ...] | None:
        """Make room for `num_new_tokens` more tokens of `request` (after taking the prefix `hits`, at
        admission). Returns the copy-on-write copies to perform, or None - changing nothing - when fewer than
        `reserve` blocks would remain free."""
        rid, bs, pool = request.request_id, self.block_size, self.pool
        table = self.table_of(request)
        start = request.num_computed_tokens
        # `has_room`, inlined: this is the common decode step (room left in a private last block)
        # (the block written next is never a hole: only blocks wholly before the window are released)
        if table is not None and start + num_new_tokens <= len(table) * bs and table[start // bs].ref_cnt == 1:  # type: ignore[union-attr]
            return NO_COPIES
        start, new_blocks, shared_tail, left = self.plan(request, table, num_new_tokens, hits)
        if left < reserve:
            return None
        if table is None:
            table = []
            self._hold(request, table, [])
        ids = self.block_ids[rid]
        if hits:
            # (`take_hits` reads a list, which the compiled build iterates natively, where a Sequence went through
            # Python's iterator protocol; these hits have no holes, and a list's element type is invariant)
            self.take_hits(request, cast("list[KVBlock | None]", hits), table, ids)
        copies = NO_COPIES
        if shared_tail is not None:
            copy = pool.allocate()
            pool.release(shared_tail)
            table[start // bs] = copy
            ids[start // bs] = copy.block_id
            copies = ((shared_tail.block_id, copy.block_id),)
        if new_blocks > 0:
            blocks = pool.allocate_many(new_blocks)
            table.extend(blocks)
            id_objects = pool.id_objects  # (the ids as the pool's int objects: `BlockPool.id_objects`)
            cast("list[object]", ids).extend([id_objects[block.block_id] for block in blocks])
        return copies

    def can_allocate(self, request: Request, num_new_tokens: int, hits: list[KVBlock] | None = None,
                     reserve: int = 0) -> bool:
        """Whether `allocate` with these arguments would succeed (it changes nothing here)."""
        table = self.tables.get(request.request_id)
        return self.has_room(request, table, num_new_tokens) or self.plan(
            request, table, num_new_tokens, hits)[3] >= reserve

    def has_room(self, request: Request, table: list[KVBlock | None] | None, num_new_tokens: int) -> bool:
        """Whether `table` already holds `num_new_tokens` more tokens of `request`, writing into no shared block:
        the step allocates nothing."""
        start = request.num_computed_tokens
        return (table is not None and start + num_new_tokens <= len(table) * self.block_size
                and table[start // self.block_size].ref_cnt == 1)  # type: ignore[union-attr]  # (as in `allocate`)

    def plan(self, request: Request, table: list[KVBlock | None] | None, num_new_tokens: int,
              hits: Sequence[KVBlock | None] | None) -> tuple[int, int, KVBlock | None, int]:
        """(first position written, new blocks, the shared partial tail to copy first or None, blocks left
        free afterwards) for an allocation that `has_room` does not cover."""
        bs = self.block_size
        start = request.num_computed_tokens
        held = 0 if table is None else len(table)
        if hits:
            start = len(hits) * bs
            held = len(hits)
        new_blocks = cdiv(start + num_new_tokens, bs) - held
        shared_tail = None
        if start % bs and table is not None:
            tail = table[start // bs]
            if tail is not None and tail.ref_cnt > 1:
                shared_tail = tail
        # a hit's hole (a sliding group's block outside the window, vLLM's null block) takes nothing
        taken_free = sum(1 for b in hits if b is not None and b.ref_cnt == 0) if hits else 0
        left = self.pool.num_free - taken_free - max(new_blocks, 0) - (shared_tail is not None)
        return start, new_blocks, shared_tail, left

    def take_hits(self, request: Request, hits: list[KVBlock | None], table: list[KVBlock | None],
                  ids: list[int]) -> None:
        """Put the prefix `hits` (holes as `HOLE`) at the head of the request's new `table` and `ids`, one
        reference each; the request's computed and registered counts start after them."""
        # a hole (outside a sliding group's window, as the window leaves it) takes nothing
        self.pool.acquire_many([block for block in hits if block is not None])
        table += hits
        id_objects = self.pool.id_objects  # (as in `allocate`)
        cast("list[object]", ids).extend([HOLE if block is None else id_objects[block.block_id] for block in hits])
        request.num_hashed_blocks = len(hits)  # hit blocks are already registered
        request.num_computed_tokens = len(hits) * self.block_size

    def record_admission(self, request: Request, num_hit_blocks: int) -> None:
        self.prefix_queries += request.num_tokens
        self.prefix_hits += num_hit_blocks * self.block_size

    def free(self, request: Request) -> None:
        """Release every block of the request, tail first (GPU and CPU side)."""
        rid = request.request_id
        # (get and del: the compiled build's `pop` with a default is a Python method call; an empty CPU side, the
        # common case, is not looked up)
        table = self.tables.get(rid)
        if table is not None:
            del self.tables[rid]
            del self.block_ids[rid]
            request.kv_table = None
            self.pool.release_all(table)
        cpu_table = self.cpu_tables.pop(rid, None) if self.cpu_tables else None
        if cpu_table is not None:
            assert self.cpu_pool is not None  # only `swap_out` fills cpu_tables, and only with a CPU pool
            self.cpu_pool.release_all(cpu_table)
        request.num_hashed_blocks = 0

    def fork(self, parent: Request, child: Request) -> bool:
        """The child shares every block of the parent (copy-on-write happens on the first divergent write)."""
        table = list(self.tables[parent.request_id])
        for block in table:
            if block is not None:
                self.pool.share(block)
        self._hold(child, table, list(self.block_ids[parent.request_id]))
        return True

    # -- swap ----------------------------------------------------------------------------------------------
    def swap_out(self, group: list[Request]) -> list[tuple[int, int]] | None:
        """Move a sequence group's blocks to the CPU pool, all or nothing: (gpu, cpu) copies, or None if the CPU
        pool cannot take them. A block shared inside the group is copied once and stays shared on the CPU."""
        tables = [self.tables[r.request_id] for r in group]
        if self.cpu_pool is None or self.cpu_pool.num_free < distinct_blocks(tables):
            return None
        cpu_tables, copies = copy_tables(tables, self.cpu_pool)
        for request, cpu_table in zip(group, cpu_tables, strict=True):
            self.free(request)
            self.cpu_tables[request.request_id] = cpu_table
        return copies

    def swap_in_cost(self, group: list[Request], num_new_tokens: list[int]) -> int:
        """GPU blocks needed to swap the group in and let member i compute `num_new_tokens[i]` more tokens,
        counting the copy-on-write copies that `allocate` will make of the partial blocks they share."""
        return swap_in_blocks([self.cpu_tables[r.request_id] for r in group],
                              [r.num_computed_tokens for r in group], num_new_tokens, self.block_size)

    def swap_in(self, group: list[Request]) -> list[tuple[int, int]]:
        """Move a group's blocks back from the CPU pool: (cpu, gpu) copies, shared blocks shared again. The caller
        checked room with `swap_in_cost`."""
        cpu_pool = self.cpu_pool
        assert cpu_pool is not None  # a group is swapped out only into a CPU pool
        cpu_tables = [self.cpu_tables.pop(r.request_id) for r in group]
        tables, copies = copy_tables(cpu_tables, self.pool)
        for request, table, cpu_table in zip(group, tables, cpu_tables, strict=True):
            cpu_pool.release_all(cpu_table)
            self._hold(request, table, [HOLE if b is None else b.block_id for b in table])
            request.num_hashed_blocks = 0  # the copies are new blocks: register them again
        return copies

    # -- sink + window -------------------------------------------------------------------------------------
    def release_outside_window(self, request: Request) -> list[int]:
        """Release whole blocks that lie neither in the sinks nor in the last W computed tokens, deepest
        first. Returns the released block ids."""
        if not self.windowed:
            return []
        first_visible = max(0, request.num_computed_tokens - self.config.window_tokens) // self.block_size
        table = self.tables[request.request_id]
        ids = self.block_ids[request.request_id]
        released: list[int] = []
        i = first_visible - 1
        while i >= self.sink_blocks:
            block = table[i]
            if block is None:
                break
            table[i] = None
            ids[i] = HOLE
            released.append(block.block_id)
            self.pool.release(block)
            i -= 1
        return released
