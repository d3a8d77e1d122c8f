"""A fixed pool of KV blocks with reference counts and a prefix cache.

Invariants (checked by the property tests):

* every block is exactly one of: in use (ref_cnt > 0), empty free (ref_cnt 0, no key), cached free
  (ref_cnt 0, keyed, an eviction candidate);
* every keyed block is findable under its key: `cached[key]` is the earliest registered block still holding
  `key`, and any later copies of the same contents are in `duplicates[key]`, in registration order. As in vLLM
  (`BlockHashToBlockMap`), every copy is keyed - two requests that computed the same block each register theirs,
  so the contents stay hit-able while any copy survives, and each copy is a cached (not empty) block once free;
* a lookup returns `cached[key]`; when it is evicted the earliest duplicate takes its place;
* a freed full block keeps its key and can be hit until an allocation evicts it;
* except a *private* block (`KVBlock.private`): one keyed by a request's own run of keys (`block_keys`: the blocks
  past a trace's hashes, salted with the request's id), which no other request can ask for, entered under its key
  only when its request may look it up again (`publish`: it is preempted). Until then nobody can ask for the key,
  so leaving it out of `cached` changes no lookup - and a finished request's blocks, nearly all of a simulated
  run's registrations, are never entered, nor taken out again when evicted. It is keyed all the same (a cached
  block once free, evicted in the policy's order), but by a placeholder (`PRIVATE_KEY`): its key, the one at its
  place in its request's keys, is computed only if it is published (most never are). `publish` enters a table's
  private blocks under their keys after any earlier copy of them (entered at an earlier preemption of the same
  request; a table's keys are distinct): the copies a lookup finds, and their order, are those that entering each
  when registered would have made. (Not under a policy that reads keys: `EvictionPolicy.reads_keys`.)

Allocation takes empty blocks first and evicts a cached one (chosen by the eviction policy) only when none is
left, so cached contents are never thrown away while empty memory remains::

    allocate ─► empty stack ─(empty?)─► policy.evict() ─► drop key ─► ref_cnt = 1
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from kvplan.engine.core.block_keys import PRIVATE_KEY, PUBLIC
from kvplan.engine.core.config import ConfigError, check_int
from kvplan.engine.core.eviction import EvictionPolicy, make_eviction_policy

if TYPE_CHECKING:
    from mypy_extensions import i64  # native 64-bit fields in the compiled build (no tag checks); int when interpreted


@dataclass(slots=True, eq=False)
class KVBlock:
    block_id: i64
    ref_cnt: i64 = 0
    key: int | None = None  # set once the block is full and registered in the prefix cache
    # the LRU queue's entries of this block a hit has made stale, still queued (`eviction.lru`; vLLM's blocks
    # likewise carry their free queue's links)
    stale_entries: i64 = 0
    private: bool = False  # keyed by PRIVATE_KEY, not in `cached` (see the module): its request has not looked it
    # up since


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, eviction_policy: str = "lru",
                 enable_caching: bool = True) -> None:
        check_int("cache.num_blocks", num_blocks, 1)
        check_int("cache.block_size", block_size, 1, 256)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        # Empty blocks are a stack: the last one freed is handed out first. Below the blocks freed so far lie those
        # never handed out, block `_fresh` on top, created on first use (`_take_fresh`): a pool of 10k+ blocks is
        # built for every probe of a search, and a light one touches a fraction of them.
        self._empty: list[KVBlock] = []
        self._fresh: i64 = 0
        self._made: list[KVBlock] = []  # the blocks created so far, by id
        # Their ids as int objects, by id: the block tables' id lists take these (`id_objects[block.block_id]`),
        # where the compiled build would box the native id into a new int object for each entry
        self.id_objects: list[object] = []
        self.policy: EvictionPolicy = make_eviction_policy(eviction_policy, num_blocks)
        # The policy's optional hooks, None where it keeps the base's no-op (LRU, the default, keeps both): a
        # prefix hit touches, a registration notes, once per block - calls that would change nothing.
        policy_class = type(self.policy)
        self._on_cached: Callable[[KVBlock], None] | None = (
            None if policy_class.on_cached is EvictionPolicy.on_cached else self.policy.on_cached)
        self._touch: Callable[[KVBlock], None] | None = (
            None if policy_class.touch is EvictionPolicy.touch else self.policy.touch)
        self.cached: dict[int, KVBlock] = {}
        self.duplicates: dict[int, list[KVBlock]] = {}  # key -> later copies, oldest first (rare)
        # Told the keys whose last copy an allocation evicts, each with the evicted block's id, in eviction order,
        # once per allocation call (a lower prefix tier copies them out before the blocks are reused; one call for
        # an admission's many evictions); None: dropped.
        self.spill: Callable[[list[tuple[int, int]]], None] | None = None
        # Told each key registered here, with its block's id (write-through prefix tiers store it at once);
        # None: nobody is told.
        self.on_register: Callable[[int, int], None] | None = None

    # -- queries -------------------------------------------------------------------------------------------
    @property
    def blocks(self) -> list[KVBlock]:
        """Every block, by id (creates those never handed out, under the freed ones: the stack's order holds)."""
        if self._fresh < self.num_blocks:
            self._empty[:0] = self._take_fresh(self.num_blocks - self._fresh)[::-1]
        return self._made

    @property
    def num_free(self) -> int:
        """Blocks an allocation can obtain: empty plus cached-but-free."""
        return len(self._empty) + self.num_blocks - self._fresh + len(self.policy)

    @property
    def num_empty(self) -> int:
        return len(self._empty) + self.num_blocks - self._fresh

    def empty_order(self) -> list[int]:
        """The empty blocks' ids in the order allocations will take them."""
        return [b.block_id for b in reversed(self._empty)] + list(range(self._fresh, self.num_blocks))

    @property
    def num_cached_free(self) -> int:
        return len(self.policy)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_evictions(self) -> int:
        return self.policy.num_evictions

    def usage(self) -> float:
        """Fraction of blocks in use; cached-but-free blocks count as free (as vLLM)."""
        return self.num_used / self.num_blocks

    @property
    def registrations_watched(self) -> bool:
        """Whether anything notes when a block is keyed (a lower tier told of it, or the eviction policy's
        `on_cached`, FIFO's clock): registrations then happen in the order the steps make them."""
        return self.on_register is not None or self._on_cached is not None

    def lookup(self, key: int) -> KVBlock | None:
        return self.cached.get(key)

    # -- mutation ------------------------------------------------------------------------------------------
    def allocate(self) -> KVBlock:
        """One block with ref_cnt 1. The caller checks `num_free` first."""
        block = self._pop_empty()
        if block is None:
            block = self.policy.evict()
            # (never None: the policy holds keyed, cached free blocks only; an object, as in `allocate_many`)
            key = block.key
            self._drop_key(block)
            if self.spill is not None and key not in self.cached:
                self.spill([(cast(int, key), block.block_id)])
        block.ref_cnt = 1
        return block

    def allocate_many(self, n: int) -> list[KVBlock]:
        """`n` blocks, exactly those (and in the order) that n calls of `allocate` would return."""
        empty = self._empty
        take = min(n, len(empty))
        blocks = empty[len(empty) - take:][::-1]  # the stack's top first, as pop() would
        del empty[len(empty) - take:]
        if n > take and self._fresh < self.num_blocks:  # then those never handed out, lowest id first
            fresh = self._take_fresh(min(n - take, self.num_blocks - self._fresh))
            take += len(fresh)
            blocks += fresh
        for block in blocks:
            block.ref_cnt = 1
        if n > take:  # the rest evicts, as `allocate` does once the empty stack is gone
            # (keys as objects, as in `register_blocks`: no unboxing and boxing again per block)
            cached = cast("dict[int | None, KVBlock]", self.cached)
            duplicates = cast("dict[int | None, list[KVBlock]]", self.duplicates)
            spill = self.spill
            spilled: list[tuple[int, int]] = []  # (no spill reads this pool: its keys can wait for the loop's end)
            victims = self.policy.evict_many(n - take)
            for block in victims:
                key = block.key  # (never None: the policy holds keyed, cached free blocks only)
                if block.private:  # never entered: nothing to take out
                    block.private = False
                    block.key = None
                elif duplicates and key in duplicates:  # (an empty dict first: duplicates are rare, a lookup is not)
                    self._drop_key(block)
                else:  # `_drop_key`, inlined for the common case: the only copy, so `cached[key]` is this block
                    del cached[key]
                    block.key = None
                block.ref_cnt = 1
                if spill is not None and key not in cached:
                    spilled.append((cast(int, key), block.block_id))
            if spill is not None and spilled:
                spill(spilled)
            blocks += victims
        return blocks

    def insert_free(self, key: int) -> KVBlock | None:
        """Key a free block under `key` (which no block holds) as a cached free block - what `allocate`,
        `register` and `release` would do to it, in one call (a lower prefix tier's store, one per block the GPU
        evicts: the tiers' hottest path). An empty block first, else the policy's victim, whose key goes to
        `spill` first; None when every block is in use (nothing changes)."""
        policy, cached = self.policy, self.cached
        block = self._pop_empty()
        if block is None:
            if not len(policy):
                return None
            block = policy.evict()
            victim: int = block.key  # type: ignore[assignment]  # the policy holds keyed (cached free) blocks only
            if self.duplicates and victim in self.duplicates:
                self._drop_key(block)
            else:  # `_drop_key`'s common case inlined, as in `allocate_many` (a tier's pool never has duplicates)
                del cached[victim]
                block.key = None
            if self.spill is not None and victim not in cached:
                self.spill([(victim, block.block_id)])
        block.key = key
        cached[key] = block
        if self._on_cached is not None:
            self._on_cached(block)
        policy.insert(block)
        return block

    def _pop_empty(self) -> KVBlock | None:
        """The empty block an allocation takes next - the freed stack's top, else the lowest never handed out - or
        None when none is left."""
        if self._empty:
            return self._empty.pop()
        if self._fresh < self.num_blocks:
            return self._take_fresh(1)[0]
        return None

    def _take_fresh(self, n: int) -> list[KVBlock]:
        """Create the next `n` blocks never handed out (the caller checks that so many are left)."""
        first = self._fresh
        blocks = [KVBlock(i) for i in range(first, first + n)]
        self._made += blocks
        # (made from the blocks: a range would be concatenated through the compiled build's generic sequence
        # protocol, a cost per call that a prefix tier's one-block insertions pay tens of thousands of times)
        self.id_objects += [block.block_id for block in blocks]
        self._fresh = first + n
        return blocks

    def refresh(self, block: KVBlock) -> None:
        """`acquire` then `release` of a cached block in one call (a lower prefix tier storing a key it already
        has): the policy sees the same calls, and the block ends as it was, free or held."""
        if block.ref_cnt == 0:
            self.policy.remove(block)
            if self._touch is not None:
                self._touch(block)
            self.policy.insert(block)
        elif self._touch is not None:
            self._touch(block)

    def _drop_key(self, block: KVBlock) -> None:
        """Forget `block`'s key (it is being evicted or unregistered); its earliest duplicate, if any, becomes
        the copy a lookup finds."""
        # (never None: every caller passes a keyed block, evicted or checked; an object, as in `register_blocks`)
        key = block.key
        block.key = None
        if block.private:  # never entered (see the module)
            block.private = False
            return
        cached = cast("dict[int | None, KVBlock]", self.cached)
        duplicates = cast("dict[int | None, list[KVBlock]]", self.duplicates)
        # (never an empty list: a key's entry goes with its last duplicate; an empty dict is not looked up)
        copies = duplicates.get(key) if duplicates else None
        if copies is None:  # the only copy of its contents, so `cached[key]` is this block
            del cached[key]
            return
        if cached[key] is block:
            cached[key] = copies.pop(0)
        else:
            copies.remove(block)
        if not copies:
            del duplicates[key]

    def release_all(self, blocks: list[KVBlock | None]) -> None:
        """Drop one reference to each of `blocks`, last to first (a request's table: tail first), skipping
        holes. A block whose last reference goes becomes cached free when keyed, else empty."""
        empty, cached_free = self._empty, []
        # (inlined, not a loop over `release`: a finishing request frees ~100; by index, as a compiled build runs
        # `reversed()` as a Python iterator)
        last: i64 = len(blocks) - 1  # (a native index: see `DecodeSteps.schedule_leading`)
        for i in range(last, -1, -1):
            block = blocks[i]
            if block is not None:
                block.ref_cnt -= 1
                if block.ref_cnt == 0:
                    if block.key is not None:
                        cached_free.append(block)
                    else:
                        empty.append(block)
        if cached_free:  # the policy's candidates in the same order, in one call
            self.policy.insert_many(cached_free)

    def acquire(self, block: KVBlock) -> None:
        """Take one more reference to a cached block (a prefix hit)."""
        if block.ref_cnt == 0:
            self.policy.remove(block)
        block.ref_cnt += 1
        if self._touch is not None:
            self._touch(block)

    def acquire_many(self, blocks: list[KVBlock]) -> None:
        """`acquire` of each of `blocks`, in order (an admission's prefix hits)."""
        policy, touch = self.policy, self._touch  # (the policy's method called as one: a bound method is a Python call)
        for block in blocks:
            if block.ref_cnt == 0:
                policy.remove(block)
            block.ref_cnt += 1
            if touch is not None:
                touch(block)

    def share(self, block: KVBlock) -> None:
        """One more reference to a block already in use (a fork)."""
        block.ref_cnt += 1

    def release(self, block: KVBlock) -> None:
        self.release_all([block])

    def register(self, block: KVBlock, key: int) -> bool:
        """Enter a full, in-use, unkeyed block under `key`. False when caching is off. A key another block
        already holds (two requests computed the same contents) keeps that block as the one a lookup finds and
        enters this one as its duplicate, as vLLM keys every copy."""
        if not self.enable_caching:
            return False
        block.key = key
        held = self.cached.setdefault(key, block)
        if held is not block:
            self.duplicates.setdefault(key, []).append(block)
        if self._on_cached is not None:
            self._on_cached(block)
        if self.on_register is not None:
            self.on_register(key, block.block_id)
        return True

    def register_blocks(self, table: list[KVBlock | None], keys: list[int], first: i64, end: i64,
                        salt: int = 0, private: i64 = PUBLIC) -> None:
        """`register(table[i], keys[i] ^ salt)` for i in first .. end-1, skipping holes and blocks already keyed
        (`salt`: a hybrid layout's group, whose copy of the same tokens is another block); those from `private`
        on as private blocks, by PRIVATE_KEY, not entered (see the module: the table's request alone can ask for
        their keys, which `keys` need not hold; the manager says so only where no lower tier is told of a key)."""
        if not self.enable_caching:
            return
        cached, on_cached, told = self.cached, self._on_cached, self.on_register
        # Keys as objects where no salt applies: a compiled build then stores each key as it is, instead of
        # unboxing it and boxing it again for the block and the dict (an allocation per block for each key that
        # fits its unboxed 63-bit ints)
        boxed = cast("list[int | None]", keys)
        keyed = cast("dict[int | None, KVBlock]", cached)
        for i in range(first, end):
            block = table[i]
            if block is not None and block.key is None:
                if i >= private:
                    block.key = PRIVATE_KEY
                    block.private = True
                    if on_cached is not None:
                        on_cached(block)
                    continue
                key = boxed[i] if not salt else keys[i] ^ salt
                block.key = key
                if keyed.setdefault(key, block) is not block:
                    self.duplicates.setdefault(cast(int, key), []).append(block)
                if on_cached is not None:
                    on_cached(block)
                if told is not None:
                    told(cast(int, key), block.block_id)

    def publish(self, table: list[KVBlock | None], keys: list[int], first: i64) -> None:
        """Enter the private blocks of `table` (from its place `first` on) under their keys, `keys[i]` at place i
        (see the module): its request may look them up again."""
        boxed = cast("list[int | None]", keys)  # (as objects, as in `register_blocks`)
        keyed = cast("dict[int | None, KVBlock]", self.cached)
        for i in range(first, len(table)):
            block = table[i]
            if block is not None and block.private:
                key = boxed[i]
                block.key = key
                block.private = False
                if keyed.setdefault(key, block) is not block:
                    self.duplicates.setdefault(cast(int, key), []).append(block)

    def unregister(self, block: KVBlock) -> None:
        """Take an in-use block out of the prefix cache: its contents were never computed (its request was
        preempted in the step that registered it)."""
        if block.key is not None:
            self._drop_key(block)
            self.policy.forget(block)

    def drop_cache(self) -> int:
        """Forget every cached free block (they become empty). Returns how many were dropped."""
        dropped = 0
        while len(self.policy):
            block = self.policy.pop_victim()
            self._drop_key(block)
            self._empty.append(block)
            dropped += 1
        return dropped


def check_pool_size(path: str, num_blocks: int, needed: int, what: str) -> None:
    if num_blocks < needed:
        raise ConfigError(f"{path}: {num_blocks} blocks cannot hold {what} ({needed} blocks needed); "
                          f"allowed: at least {needed}")
