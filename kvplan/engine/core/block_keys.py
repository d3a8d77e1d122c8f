"""Block keys: the identity of the i-th full KV block of a request, used for prefix caching.

A key is a chained hash: key(i) = H(key(i-1), content of block i), so two requests share block i only if their
whole prefixes up to and including block i agree. Keys never come from Python's salted `hash()` of str or bytes,
so they are stable across processes and runs: token contents (any length) go through blake2b; a trace hash's
block, whose content is two integers, through CPython's hash of an int tuple (deterministic, unlike str hashes)
- ten times cheaper, which matters to the simulator, which keys every block of a million requests. Keys are only
ever compared with keys of the same kind, so the two kinds never need to agree.

Two sources of content:

* `TokenBlockKeys`: the token ids themselves (the live engine).
* `HashBlockKeys`: a trace's prefix hashes at granularity G (Mooncake's 512-token `hash_ids`), G a multiple or a
  divisor of the block size b. Group j expands into its G/b sub-blocks, keyed base_j, base_j + 1, ... where
  base_j = H(base_{j-1}, hash_j, 0) with its low bits (those that number a sub-block) cleared: one hash per group
  instead of one per sub-block, and a sub-block's key still names every group before it and its own place (a
  simulator keys tens of millions of Mooncake blocks). Or block i gathers the b/G groups it covers, keyed H(prev,
  their hashes, 0). Either way sharing at granularity G is preserved exactly at block size b (a block is shared
  when all its groups are). Blocks past the hashed part of the prompt
  (the tail of the prompt not covered, and every block holding generated tokens) are keyed with a per-request salt:
  they are cacheable, but never shared with another request - as on the live engine, where generated text differs.
  Nothing but the request itself (re-admitted after a preemption) can ask for them, so they need no chain either:
  they are one run of consecutive keys, base, base + 1, ..., the base H(key before the run, salt, its first
  block) halved (63 bits) - a fork's own run starts where its inherited keys end, under its own salt. No token
  list is ever built, so a million such requests fit in memory.

  Where a trace's ids are known to *name their prefixes* (`named`: wherever an id occurs, the same ids come
  before it - Mooncake's convention; the simulator checks a workload's population once,
  `traces.steady.hash_ids_name_prefixes`), an id already says everything its chained hash would: a block that
  is one group, or that gathers several, is keyed by the id of its last group, with no hash at all (most of
  keying a chat workload's long shared contexts). Only under the plain root: an adapter's blocks keep their
  chained keys, which never equal the base model's. Ids that name prefixes give the same sharing either way.
"""

from __future__ import annotations

from array import array
from hashlib import blake2b
from typing import TYPE_CHECKING, Final, cast

from kvplan.errors import UserError

if TYPE_CHECKING:
    from mypy_extensions import i64  # native 64-bit locals in the compiled build; int when interpreted

ROOT_KEY: Final = 0x6B76706C616E  # "kvplan": the parent of block 0
# A request's first private block (`block_pool`: keyed by its own run) when it has none (`Request.private_from`):
# past any table (and within the compiled build's unboxed ints, where 2**62 would be an object compared slowly)
PUBLIC: Final = 1 << 60
# What a private block holds as its key until it is published: no block's key, which all are 64-bit (hashes, and
# trace ids, which the trace loaders keep as int64)
PRIVATE_KEY: Final = 1 << 64


def chain_hash(parent: int, payload: bytes) -> int:
    """Process-stable 63-bit hash of (parent key, payload)."""
    digest = blake2b(parent.to_bytes(8, "little") + payload, digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def stable_id_hash(text: str) -> int:
    return chain_hash(ROOT_KEY, text.encode())


SALT_TAG: Final = 0x73616C74  # "salt": keeps a request's salt apart from any other hash of the same integers


def request_salt(request_id: str) -> int:
    """Process-stable salt of a request's own blocks (those past its trace hashes). An id of ASCII digits - the
    simulator names each request by its trace row - goes through CPython's int-tuple hash with its length (so
    that "07" and "7" differ), a tenth of blake2b's cost, paid once per request of a million-request run; any
    other id through `stable_id_hash`."""
    if len(request_id) <= 18 and request_id.isascii() and request_id.isdigit():  # (an int64)
        return hash((SALT_TAG, len(request_id), int(request_id)))
    return stable_id_hash(request_id)


def chain_mix(parent: int, a: int, b: int) -> int:
    """Process-stable key of (parent key, a, b) for integers a, b. CPython hashes a tuple of ints with an
    xxHash-style combine of the ints' own hashes (their value modulo 2**61 - 1): deterministic in every process
    and run - only str, bytes and datetime hashes are salted per process - and ten times cheaper than blake2b."""
    return hash((parent, a, b))


class TokenBlockKeys:
    """Keys of the full blocks of a growing token list (shared by reference with the request)."""

    __slots__ = ("block_size", "keys", "root", "token_ids")

    def __init__(self, token_ids: list[int], block_size: int, root: int = ROOT_KEY) -> None:
        self.token_ids = token_ids
        self.block_size = block_size
        self.keys: list[int] = []
        self.root = root  # the parent of block 0 (a LoRA adapter's own: `request.adapter_root`)

    def key(self, index: int) -> int | None:
        """Key of block `index`, or None while that block is not full."""
        keys, bs = self.keys, self.block_size
        while len(keys) <= index:
            start = len(keys) * bs
            if start + bs > len(self.token_ids):
                return None
            parent = keys[-1] if keys else self.root
            keys.append(chain_hash(parent, array("q", self.token_ids[start:start + bs]).tobytes()))
        return keys[index]

    def fork(self, token_ids: list[int], child_salt: str, keep_blocks: int) -> TokenBlockKeys:
        child = TokenBlockKeys(token_ids, self.block_size, self.root)
        child.keys = self.keys[:keep_blocks]
        return child


class HashBlockKeys:
    """Keys derived from a trace's prefix hashes at granularity `granularity` (a multiple or a divisor of
    `block_size`); `named`: the ids name their prefixes (see the module)."""

    __slots__ = ("block_size", "granularity", "hash_ids", "keys", "named", "num_hashed_blocks", "own_from", "root",
                 "salt_id")

    def __init__(self, hash_ids: list[int] | tuple[int, ...], granularity: int, block_size: int,
                 prompt_len: int, salt: str, root: int = ROOT_KEY, named: bool = False) -> None:
        if granularity % block_size and block_size % granularity:
            raise UserError(f"hash granularity {granularity} is neither a multiple nor a divisor of block size "
                             f"{block_size}; prefix hashes can only be expanded or gathered into such blocks")
        self.hash_ids = hash_ids
        self.granularity = granularity
        self.block_size = block_size
        # Only blocks lying wholly inside both the prompt and the hashed span carry the trace's identity.
        self.num_hashed_blocks = min(prompt_len, len(hash_ids) * granularity) // block_size
        self.salt_id = salt  # the id its own run is salted with (`salt`, computed when the run is first keyed)
        self.keys: list[int] = []
        self.own_from = self.num_hashed_blocks  # the first block of the run keyed with this request's salt
        self.root = root  # the parent of block 0 (a LoRA adapter's own: `request.adapter_root`)
        # ids as keys (the module) where they name prefixes, a block holds whole groups, and the root is the plain one
        self.named = named and root == ROOT_KEY and granularity <= block_size

    def key(self, index: int) -> int:
        """Key of block `index` (always defined: the caller only asks for blocks it has filled)."""
        keys = self.keys
        start = len(keys)
        if index < start:
            return keys[index]
        hashed = self.num_hashed_blocks
        # `chain_mix` inlined (a simulator run keys every block of every request): the trace's blocks, then the
        # request's own run (a decode filling its next block, the common call, has only the latter)
        if start < hashed:
            parent = keys[-1] if keys else self.root
            hash_ids, per_group = self.hash_ids, self.granularity // self.block_size
            end = min(index + 1, hashed)
            if self.named:  # block i's key is the id of its last group, which names everything before it
                step = self.block_size // self.granularity
                keys.extend(hash_ids[step * start + step - 1:step * end:step])
            elif per_group == 1:  # one group per block (the granularity is the block size)
                # As objects, not ints: a compiled build then takes the ids and keys into the tuple as they are,
                # instead of unboxing each and boxing it again (an allocation per block; the hash is the same)
                ids = cast("list[object]", hash_ids) if isinstance(hash_ids, list) else list(hash_ids)
                link: object = parent
                chain = cast("list[object]", keys)
                for i in range(start, end):
                    link = hash((link, ids[i], 0))
                    chain.append(link)
            elif per_group:  # group by group: one hash per group, its sub-blocks consecutive keys (the module)
                low = -(1 << (per_group - 1).bit_length())  # clears the bits that number a group's sub-blocks
                for group in range(start // per_group, (end - 1) // per_group + 1):
                    first = group * per_group
                    if first < start:  # begun by an earlier call: its first key is its base
                        base = keys[first]
                    else:  # chained to the previous group's base (the root's for the first)
                        base = hash((keys[first - per_group] if group else self.root, int(hash_ids[group]), 0)) & low
                    keys.extend(range(base + max(start - first, 0), base + min(end - first, per_group)))
            else:  # blocks larger than a group: each gathers the groups it covers
                per_block = self.block_size // self.granularity
                for i in range(start, end):
                    parent = hash((parent, tuple(map(int, hash_ids[i * per_block:(i + 1) * per_block])), 0))
                    keys.append(parent)
        own = self.own_from
        if index >= own:  # the request's own run (the module): its base, then consecutive keys
            if start <= own:  # (start < own only with own == hashed: the trace's keys were just extended to it)
                # (halved: |base| < 2**62, so that the run's keys stay within the compiled build's unboxed ints,
                # where each `+= 1` is an add; beyond them - half of all bases - it allocated an int object)
                last = hash((keys[own - 1] if own else self.root, self.salt, own)) >> 1
                keys.append(last)
                start = own + 1
            else:
                last = keys[start - 1]
            count: i64 = index + 1 - start  # (a native count: a loop over a range of Python ints is twice the cost)
            for _key in range(count):  # (one add per key: a decode's call asks for one; `_` would box the index)
                last += 1
                keys.append(last)
        return keys[index]

    @property
    def salt(self) -> int:
        """The salt of its own run (`request_salt` of its id): computed only where the run is keyed (a simulated
        request whose blocks are all private keys none unless it is preempted: `block_pool`)."""
        return request_salt(self.salt_id)

    def fork(self, token_ids: list[int] | None, child_salt: str, keep_blocks: int) -> HashBlockKeys:
        # Through the constructor (a mypyc-compiled class has no __new__ that skips __init__): a prompt of exactly
        # the hashed blocks keeps num_hashed_blocks, which never exceeds the hashed span.
        child = HashBlockKeys(self.hash_ids, self.granularity, self.block_size,
                              self.num_hashed_blocks * self.block_size, child_salt, self.root, self.named)
        child.keys = self.keys[:keep_blocks]
        # its own run starts after the keys it inherits (its parent's, salted with the parent's salt)
        child.own_from = max(len(child.keys), child.num_hashed_blocks)
        return child


BlockKeys = TokenBlockKeys | HashBlockKeys
