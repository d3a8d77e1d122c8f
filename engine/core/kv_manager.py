"""Paged KV manager: per-request block tables over a `BlockPool`.

A block table maps a request's logical block i (tokens [i*b, (i+1)*b)) to a physical block. Sharing is by
reference count: a prefix-cache hit or a fork puts the same physical block into several tables. The rules:

* A prefix hit covers full blocks only, whose keys match the whole chain, and never the last token to compute
  (its logits are needed), so at most (num_tokens - 1) // b blocks hit.
* Copy-on-write: a request about to write into a partial block that another table also holds gets a private
  copy first; the (src, dst) pair is returned for the model runner. Nothing is ever written into a block whose
  ref count is above one.
* Freeing is tail-first, so the eviction policy sees a chain's deepest block first.
* Sink+window mode keeps the blocks of the first S tokens and of the last W tokens and releases whole blocks in
  between (holes are `None` in the table), so a request holds at most ceil(S/b) + ceil(W/b) + 1 blocks::

      logical:  [s0][s1][--][--][--][w0][w1][w2 partial]
                 sinks   released     recent window
* Swap moves every block of a request to a CPU-side pool and back, returning the (src, dst) copies.
"""

from __future__ import annotations

from engine.core.block_pool import BlockPool, KVBlock
from engine.core.config import CacheConfig
from engine.core.request import Request

NO_COPIES: tuple[tuple[int, int], ...] = ()
HOLE = -1  # block id placed in `block_ids` where sink+window released a block


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.block_size = config.block_size
        self.pool = BlockPool(config.num_blocks, config.block_size, config.eviction_policy,
                              config.enable_prefix_caching)
        self.cpu_pool = (BlockPool(config.num_cpu_blocks, config.block_size, "lru", enable_caching=False)
                         if config.num_cpu_blocks else None)
        self.tables: dict[str, list[KVBlock | None]] = {}
        self.block_ids: dict[str, list[int]] = {}  # the same tables as plain ids, for the model runner
        self.cpu_tables: dict[str, list[KVBlock | None]] = {}
        self.sink_blocks = cdiv(config.sink_tokens, config.block_size)
        self.prefix_queries = 0  # tokens looked up at admission
        self.prefix_hits = 0  # tokens found cached

    # -- capacity ------------------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def usage(self) -> float:
        return self.pool.usage()

    def admission_error(self, request: Request, first_chunk_tokens: int) -> str | None:
        """Why `request` could never run even alone in an empty cache, or None."""
        total = self.config.num_blocks
        need = self.config.blocks_per_request(min(request.final_len, self.config.max_model_len))
        if need > total:
            return (f"needs {need} KV blocks ({request.final_len} tokens at block size {self.block_size}) "
                    f"but the cache holds only {total}")
        first = cdiv(first_chunk_tokens, self.block_size)
        if first > total - self.config.watermark_blocks:
            return (f"its first chunk needs {first} KV blocks but only {total - self.config.watermark_blocks} "
                    f"can be admitted ({total} minus a watermark of {self.config.watermark_blocks})")
        return None

    # -- prefix cache --------------------------------------------------------------------------------------
    def find_cached_prefix(self, request: Request) -> list[KVBlock]:
        """Longest run of leading full blocks already cached; never covers the last token to compute."""
        keys = request.block_keys
        if keys is None or not self.pool.enable_caching:
            return []
        cached = self.pool.cached
        hits: list[KVBlock] = []
        for i in range((request.num_tokens - 1) // self.block_size):
            key = keys.key(i)
            block = cached.get(key) if key is not None else None
            if block is None:
                break
            hits.append(block)
        return hits

    def commit(self, request: Request) -> None:
        """Register the request's newly completed full blocks in the prefix cache."""
        full = request.num_computed_tokens // self.block_size
        first = request.num_hashed_blocks
        if full <= first or request.block_keys is None or not self.pool.enable_caching:
            return
        table, keys, register = self.tables[request.request_id], request.block_keys, self.pool.register
        for i in range(first, full):
            block = table[i]
            if block is not None and block.key is None:
                register(block, keys.key(i))
        request.num_hashed_blocks = full

    # -- allocation ----------------------------------------------------------------------------------------
    def allocate(self, request: Request, num_new_tokens: int, hits: list[KVBlock] | None = None,
                 reserve: int = 0) -> tuple[tuple[int, int], ...] | None:
        """Make room for `num_new_tokens` more tokens of `request` (after taking the prefix `hits`, at
        admission). Returns the copy-on-write copies to perform, or None - changing nothing - when fewer than
        `reserve` blocks would remain free."""
        rid, bs, pool = request.request_id, self.block_size, self.pool
        table = self.tables.get(rid)
        start = request.num_computed_tokens
        if table is not None and start + num_new_tokens <= len(table) * bs and table[start // bs].ref_cnt == 1:
            return NO_COPIES  # the common decode step: room left in a private last block
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
        taken_free = sum(1 for b in hits if b.ref_cnt == 0) if hits else 0
        if pool.num_free - taken_free - max(new_blocks, 0) - (shared_tail is not None) < reserve:
            return None
        if table is None:
            table = self.tables[rid] = []
            self.block_ids[rid] = []
        ids = self.block_ids[rid]
        if hits:
            self._take_hits(request, hits, table, ids)
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
            ids.extend([block.block_id for block in blocks])
        return copies

    def _take_hits(self, request: Request, hits: list[KVBlock], table: list, ids: list[int]) -> None:
        for block in hits:
            self.pool.acquire(block)
            table.append(block)
            ids.append(block.block_id)
        request.num_hashed_blocks = len(hits)  # hit blocks are already registered
        request.num_computed_tokens = len(hits) * self.block_size

    def record_admission(self, request: Request, num_hit_blocks: int) -> None:
        self.prefix_queries += request.num_tokens
        self.prefix_hits += num_hit_blocks * self.block_size

    def free(self, request: Request) -> None:
        """Release every block of the request, tail first (GPU and CPU side)."""
        rid = request.request_id
        table = self.tables.pop(rid, None)
        if table is not None:
            del self.block_ids[rid]
            self.pool.release_all(table)
        cpu_table = self.cpu_tables.pop(rid, None)
        if cpu_table is not None:
            self.cpu_pool.release_all(cpu_table)
        request.num_hashed_blocks = 0

    def fork(self, parent: Request, child: Request) -> bool:
        """The child shares every block of the parent (copy-on-write happens on the first divergent write)."""
        table = list(self.tables[parent.request_id])
        for block in table:
            if block is not None:
                self.pool.share(block)
        self.tables[child.request_id] = table
        self.block_ids[child.request_id] = list(self.block_ids[parent.request_id])
        return True

    # -- swap ----------------------------------------------------------------------------------------------
    def swap_out(self, request: Request) -> list[tuple[int, int]] | None:
        """Move the request's blocks to the CPU pool: (gpu, cpu) copies, or None if the CPU pool is full."""
        table = self.tables[request.request_id]
        live = sum(1 for b in table if b is not None)
        if self.cpu_pool is None or self.cpu_pool.num_free < live:
            return None
        cpu_table, copies = self._copy_table(table, self.cpu_pool)
        self.free(request)
        self.cpu_tables[request.request_id] = cpu_table
        return copies

    def swap_in_cost(self, request: Request, num_new_tokens: int) -> int:
        """GPU blocks needed to swap the request in and compute `num_new_tokens` more tokens."""
        cpu_table = self.cpu_tables[request.request_id]
        live = sum(1 for b in cpu_table if b is not None)
        extra = cdiv(request.num_computed_tokens + num_new_tokens, self.block_size) - len(cpu_table)
        return live + max(extra, 0)

    def swap_in(self, request: Request) -> list[tuple[int, int]]:
        """Move the request's blocks back from the CPU pool: (cpu, gpu) copies. The caller checked room."""
        cpu_table = self.cpu_tables.pop(request.request_id)
        table, copies = self._copy_table(cpu_table, self.pool)
        for block in reversed(cpu_table):
            if block is not None:
                self.cpu_pool.release(block)
        self.tables[request.request_id] = table
        self.block_ids[request.request_id] = [HOLE if b is None else b.block_id for b in table]
        request.num_hashed_blocks = 0  # the copies are new blocks: register them again
        return copies

    @staticmethod
    def _copy_table(table: list[KVBlock | None], target: BlockPool
                    ) -> tuple[list[KVBlock | None], list[tuple[int, int]]]:
        new_table: list[KVBlock | None] = []
        copies: list[tuple[int, int]] = []
        for block in table:
            if block is None:
                new_table.append(None)
                continue
            dst = target.allocate()
            copies.append((block.block_id, dst.block_id))
            new_table.append(dst)
        return new_table, copies

    # -- sink + window -------------------------------------------------------------------------------------
    def release_outside_window(self, request: Request) -> list[int]:
        """Release whole blocks that lie neither in the sinks nor in the last W computed tokens, deepest
        first. Returns the released block ids."""
        if not self.config.windowed:
            return []
        first_visible = max(0, request.num_computed_tokens - self.config.window_tokens) // self.block_size
        table = self.tables[request.request_id]
        ids = self.block_ids[request.request_id]
        released: list[int] = []
        i = first_visible - 1
        while i >= self.sink_blocks and table[i] is not None:
            block = table[i]
            table[i] = None
            ids[i] = HOLE
            released.append(block.block_id)
            self.pool.release(block)
            i -= 1
        return released

    def retained_positions(self, request: Request) -> list[tuple[int, int]]:
        """Token position ranges [start, end) whose KV the request still holds."""
        n = request.num_computed_tokens
        table = self.tables.get(request.request_id, [])
        ranges: list[tuple[int, int]] = []
        i = 0
        while i < len(table):
            if table[i] is None:
                i += 1
                continue
            j = i
            while j < len(table) and table[j] is not None:
                j += 1
            start, end = i * self.block_size, min(j * self.block_size, n)
            if start < end:
                ranges.append((start, end))
            i = j
        return ranges
