"""KV cache groups of a model whose layers mix full attention and sliding-window attention (Gemma 2/3, gpt-oss).

vLLM's hybrid allocator (`kv_cache_planning`, `HybridKVCacheCoordinator`) gives every attention kind its own
block tables but one shared block pool, and makes that work by grouping layers so that every group has the same
number of layers (`group_size`, padded where a kind does not divide evenly):

* layers are bucketed by kind in the order the kinds first appear; `group_size` is the smallest bucket - or the
  largest, when the largest is under 1.5x the smallest (less padding);
* a bucket of n layers becomes cdiv(n, group_size) groups, group i taking layers i, i + k, i + 2k, ... of it;
* one block id then serves one layer of *every* group (group_size memory pools, each shared by one layer of each
  group), so a block costs group_size layers' pages and the pool holds memory // (group_size x page) blocks. A
  request holds blocks in every group: each token position of a full group costs one block id per b tokens, and
  each sliding group at most its window's worth.

Gemma-3-27B: 62 layers, 5 sliding (window 1024) then 1 full, repeated: 52 sliding and 10 full layers, group size
10, six sliding groups (the last with 2 padding layers) and one full group - seven groups, each block id worth 10
layers where the uniform layout's is worth 62.

`KVLayout` is the plain description (groups, group size, the block count rule); the manager that runs it is
`kv_groups.HybridKVCacheManager`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from kvplan.errors import ConfigError

FULL: Final = "full_attention"  # HF `layer_types` spelling
SLIDING: Final = "sliding_attention"
LAYER_KINDS: Final = (FULL, SLIDING)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(slots=True, frozen=True)
class KVGroup:
    """One KV cache group: `num_layers` real layers (at most the layout's group size; the rest is padding) of one
    kind. A sliding group attends to the last `sliding_window` tokens, the token being computed included."""

    kind: str
    num_layers: int
    sliding_window: int = 0  # 0 for a full-attention group

    @property
    def sliding(self) -> bool:
        return self.kind == SLIDING

    @property
    def kept_tokens(self) -> int:
        """Tokens before the next one to compute whose KV it still reads: sliding_window - 1 (vLLM's
        `get_num_skipped_tokens` skips everything before them); 0 for full attention (keep everything)."""
        return self.sliding_window - 1 if self.sliding else 0


@dataclass(slots=True, frozen=True)
class KVLayout:
    """The KV cache groups of a model and the size every group is padded to (vLLM's KV cache group specs).
    Invariant: every group has at most `group_size` layers, and all kinds' layers are covered exactly once."""

    groups: tuple[KVGroup, ...]
    group_size: int

    @classmethod
    def from_layer_types(cls, layer_types: tuple[str, ...] | list[str], sliding_window: int | None) -> KVLayout:
        """vLLM's grouping of `layer_types` (HF spelling) into equal-sized KV cache groups."""
        if not layer_types:
            raise ConfigError("model.layer_types: empty; allowed: one of full_attention, sliding_attention per layer")
        buckets: dict[str, int] = {}
        for i, kind in enumerate(layer_types):
            if kind not in LAYER_KINDS:
                raise ConfigError(f"model.layer_types[{i}]: {kind!r}; allowed: {', '.join(LAYER_KINDS)}")
            buckets[kind] = buckets.get(kind, 0) + 1  # dicts keep first-appearance order, as vLLM's buckets
        sliding = 0
        if SLIDING in buckets:
            if not isinstance(sliding_window, int) or sliding_window < 2:
                raise ConfigError(f"model.sliding_window: {sliding_window!r} with sliding_attention layers; allowed: "
                                  "an integer >= 2 (tokens each sliding layer attends to, itself included)")
            sliding = sliding_window
        smallest, largest = min(buckets.values()), max(buckets.values())
        # vLLM's heuristic: the "1" of an n:1 pattern, unless the kinds are nearly balanced (then pad the smaller)
        size = largest if largest < smallest * 1.5 else smallest
        groups: list[KVGroup] = []
        for kind, n in buckets.items():
            k = cdiv(n, size)
            window = sliding if kind == SLIDING else 0
            # group i takes layers i, i + k, ...: len(range(i, n, k)) of them
            groups.extend(KVGroup(kind, len(range(i, n, k)), window) for i in range(k))
        return cls(tuple(groups), size)

    @property
    def hybrid(self) -> bool:
        """More than one kind of group: the hybrid allocator runs. A uniform model is the single-group manager."""
        return len({g.kind for g in self.groups}) > 1

    @property
    def num_layers(self) -> int:
        return sum(g.num_layers for g in self.groups)

    def num_blocks(self, memory_bytes: float, page_bytes_per_layer: float) -> int:
        """Blocks that fit `memory_bytes`: each block id holds `group_size` layers' pages (vLLM: available memory
        // bytes per block, the largest group's pages)."""
        return max(int(memory_bytes // (self.group_size * page_bytes_per_layer)), 0)

    def blocks_from_uniform(self, uniform_blocks: int) -> int:
        """The block count for memory measured as `uniform_blocks` blocks of every layer (a profile's capacity):
        the same bytes re-cut into blocks of `group_size` layers."""
        return uniform_blocks * self.num_layers // self.group_size

    def describe(self) -> str:
        kinds: dict[str, list[int]] = {}
        for g in self.groups:
            kinds.setdefault(g.kind, []).append(g.num_layers)
        parts = [f"{len(v)} {k.split('_')[0]} group{'s' if len(v) > 1 else ''}" for k, v in kinds.items()]
        return f"{', '.join(parts)} of {self.group_size} layers"
