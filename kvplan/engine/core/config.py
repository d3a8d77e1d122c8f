"""Validated configuration of the KV cache and the scheduler.

The fields are the core's settings, declared once in `engine.core.settings` (name, default, range, help); each is
checked there, and the checks across fields are here. Every check raises `ConfigError` whose message starts with
the key path (`cache.block_size`, ...), so that the YAML layer can point at the offending key, and says what is
allowed.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.engine.core.kv_layout import KVLayout, cdiv
from kvplan.engine.core.setting_classes import SETTING, check_settings, config_fields
from kvplan.engine.core.settings import (  # noqa: F401 (the names the core's users import from here)
    ALLOCATORS,
    PREEMPTION_MODES,
    QUEUE_POLICIES,
    SCHEDULES,
    SETTINGS,
    Field,
)
from kvplan.engine.core.speculative import SpeculativeConfig, parse_speculative_config
from kvplan.engine.core.vllm_versions import VERSIONS, VllmVersion, since
from kvplan.errors import ConfigError


def check_int(path: str, value: object, lo: int, hi: int | None = None) -> None:
    """An integer in [lo, hi] for a part built without a config (the block pool), checked as a setting is."""
    Field("int", minimum=lo, maximum=hi).check(value, path)


@dataclass(slots=True)
@config_fields("cache")
class CacheConfig:
    """How KV memory is carved up.

    `allocator="paged"` is PagedAttention-style block allocation; `max`, `pow2` and `oracle` are the contiguous
    reservation baselines of the vLLM paper (reserve the model's max length, the next power of two of the real
    need, or exactly the real need). `sink_tokens`/`window_tokens` > 0 keeps only the attention sinks and a
    recent window of each request (StreamingLLM); `window_tokens=0` means full attention. A model mixing
    sliding-window and full-attention layers gets a `HybridCacheConfig`, which adds its KV cache groups.
    """

    block_size: int = SETTING
    num_blocks: int = SETTING
    num_cpu_blocks: int = SETTING
    enable_prefix_caching: bool = SETTING
    eviction_policy: str = SETTING
    kv_offloading_blocks: int = SETTING
    kv_offloading_eviction: str = SETTING
    kv_disk_blocks: int = SETTING
    kv_shared_blocks: int = SETTING
    kv_shared_eviction: str = SETTING
    kv_offloading_write_through: bool = SETTING
    allocator: str = SETTING
    max_model_len: int = SETTING
    sink_tokens: int = SETTING
    window_tokens: int = SETTING
    watermark: float = SETTING

    def __post_init__(self) -> None:
        check_settings(self, "cache", "cache")
        if self.sink_tokens and not self.window_tokens:
            raise ConfigError("cache.sink_tokens: needs cache.window_tokens > 0 (sinks only make sense with a window)")
        if self.sink_tokens > self.window_tokens:
            # StreamingLLM keeps a few sink tokens beside a much longer window (4 + 1020); more sinks than window
            # is a swapped pair of settings, not a cache anyone means to plan.
            raise ConfigError(f"cache.sink_tokens: {self.sink_tokens} exceeds cache.window_tokens "
                              f"{self.window_tokens}; allowed: at most the window (typically 4 sinks beside a window "
                              "of thousands)")
        if self.allocator != "paged":
            for key, on in (("enable_prefix_caching", self.enable_prefix_caching),
                            ("window_tokens", self.window_tokens), ("num_cpu_blocks", self.num_cpu_blocks),
                            ("kv_offloading_blocks", self.kv_offloading_blocks),
                            ("kv_disk_blocks", self.kv_disk_blocks), ("kv_shared_blocks", self.kv_shared_blocks)):
                if on:
                    raise ConfigError(f"cache.{key}: not supported with the contiguous reservation allocator "
                                      f"{self.allocator!r}; allowed only with allocator 'paged'")

        need = self.blocks_per_request(self.max_model_len)
        if self.num_blocks < need:
            raise ConfigError(
                f"cache.num_blocks: {self.num_blocks} blocks of {self.block_size} tokens cannot hold one request of "
                f"max_model_len {self.max_model_len} ({need} blocks needed); allowed: num_blocks >= {need}, or a "
                "smaller cache.max_model_len")

    @property
    def hybrid_layout(self) -> KVLayout | None:
        """The KV cache groups when they mix sliding-window and full attention (vLLM's hybrid allocator), else None."""
        layout: KVLayout | None = getattr(self, "kv_layout", None)  # only a HybridCacheConfig has one
        return layout if layout is not None and layout.hybrid else None

    @property
    def hybrid(self) -> bool:
        return self.hybrid_layout is not None

    def blocks_per_request(self, num_tokens: int) -> int:
        """Blocks one request of `num_tokens` tokens holds once its window has slid (decode steady state); for a
        hybrid layout, summed over its groups."""
        layout = self.hybrid_layout
        if layout is not None:
            return sum(group_blocks(num_tokens, g.kept_tokens, self.block_size) for g in layout.groups)
        blocks = -(-num_tokens // self.block_size)
        if self.window_tokens:
            sink = -(-self.sink_tokens // self.block_size)
            blocks = min(blocks, sink + -(-self.window_tokens // self.block_size) + 1)
        return blocks

    def peak_blocks(self, num_positions: int, chunk: int) -> int:
        """Most GPU blocks one sequence holds in any step while it writes KV positions 0 .. num_positions-1 in
        steps of at most `chunk` tokens starting anywhere (a prefill chunk, a recompute chunk, a decode token).

        Without a window that is every position's block. With sink+window, a step writing [s, e) holds the sink
        blocks, the blocks not yet released at s (those from (s - W) // b on) and the new ones up to e; blocks
        leave the window only after the step. So the peak is the largest of, over starts s < num_positions:

        * s < s0 = W + sink blocks * b - nothing released yet beyond the sinks: ceil(min(s + chunk, n) / b),
          largest at the last such s;
        * s >= s0, step not clipped by the end (s + chunk <= n): it depends only on s mod b, so one period of b
          starts covers all of them;
        * s >= s0, clipped (e = n): largest at the first such s (fewer blocks released).
        """
        bs, n = self.block_size, num_positions
        layout = self.hybrid_layout
        if layout is not None:
            return hybrid_peak_blocks(layout, n, chunk, bs)
        if not self.window_tokens or n <= 0:
            return -(-max(n, 0) // bs)
        sink = -(-self.sink_tokens // bs)
        first_release = self.window_tokens + sink * bs  # s0: the first start at which a non-sink block is gone

        def held(start: int) -> int:
            return window_held(start, min(start + chunk, n), self.window_tokens, sink, bs)

        peak = held(min(first_release, n) - 1)
        steady = range(first_release, min(n - chunk, first_release + bs - 1) + 1)  # empty unless s0 + chunk <= n
        peak = max(peak, *(held(s) for s in steady), 0)
        clipped = max(first_release, n - chunk + 1)
        if clipped < n:
            peak = max(peak, held(clipped))
        return peak

    @property
    def windowed(self) -> bool:
        return self.window_tokens > 0

    @property
    def watermark_blocks(self) -> int:
        return int(self.watermark * self.num_blocks)


@dataclass(slots=True)
class HybridCacheConfig(CacheConfig):
    """A `CacheConfig` plus the model's KV cache groups. `kv_layout` is not a setting: the side building the config
    derives it from the model's layer kinds. A hybrid layout (sliding-window and full-attention groups) runs vLLM's
    hybrid allocator (`kv_groups`); None, or a layout of one kind, is the single-group cache."""

    kv_layout: KVLayout | None = None

    def __post_init__(self) -> None:
        CacheConfig.__post_init__(self)  # (a slots dataclass has no zero-argument super())
        if self.hybrid:
            for key, on in (("window_tokens", self.window_tokens), ("num_cpu_blocks", self.num_cpu_blocks),
                            ("kv_offloading_blocks", self.kv_offloading_blocks),
                            ("kv_disk_blocks", self.kv_disk_blocks), ("kv_shared_blocks", self.kv_shared_blocks),
                            ("allocator", self.allocator != "paged")):
                if on:
                    raise ConfigError(f"cache.{key}: not supported for a model mixing sliding-window and full "
                                      "attention layers (vLLM's hybrid allocator: paged, its windows from the "
                                      "model, no swap); allowed: the default")


def window_held(start: int, end: int, window: int, sink_blocks: int, bs: int) -> int:
    """Blocks a sequence holds in a step writing positions [start, end) when it keeps its sink blocks and the
    `window` tokens before `start` (window 0: every block): released blocks are those wholly before
    start - window, beyond the sinks."""
    blocks = cdiv(end, bs)
    if not window:
        return blocks
    gone = max(0, start - window) // bs  # blocks < gone have left the window
    return min(sink_blocks, blocks) + max(0, blocks - max(sink_blocks, gone))


def group_blocks(num_tokens: int, kept_tokens: int, bs: int) -> int:
    """Blocks a group holds for a request of `num_tokens` tokens once its window has slid: a full group every
    block, a sliding group at most cdiv(kept, b) + 1 (the window rarely starts on a block boundary)."""
    blocks = cdiv(num_tokens, bs)
    return min(blocks, cdiv(kept_tokens, bs) + 1) if kept_tokens else blocks


def hybrid_peak_blocks(layout: KVLayout, n: int, chunk: int, bs: int) -> int:
    """Most blocks one sequence holds, summed over the layout's groups, in any step writing at most `chunk` of
    positions 0 .. n-1. A sliding group frees what left its window before each step allocates (vLLM's
    `remove_skipped_blocks`), so a step [s, e) holds cdiv(e, b) - (s - kept) // b of its blocks and a full group
    cdiv(e, b). While a step is not clipped by the end (s + chunk <= n) every group's count is at least as large
    b starts later, so the largest is among the last b unclipped starts; clipped steps (e = n) only release
    more as s grows, so the first clipped start covers them."""
    if n <= 0:
        return 0
    kept = [g.kept_tokens for g in layout.groups]

    def held(start: int) -> int:
        end = min(start + chunk, n)
        return sum(window_held(start, end, k, 0, bs) for k in kept)

    starts = set(range(max(0, n - chunk - bs + 1), n - chunk + 1))
    starts.add(max(0, n - chunk + 1) if chunk < n else 0)
    return max(held(s) for s in starts if s < n)


@dataclass(slots=True)
@config_fields("scheduler")
class SchedulerConfig:
    """Continuous batching limits and policies (names follow vLLM).

    `schedule="mixed"` puts running requests first and fills the rest of the token budget with prefill chunks
    (vLLM V1, Sarathi); `"prefill_first"` runs a step of prefills alone whenever any can be scheduled and decodes
    only in steps without one (vLLM V0 and the vLLM paper). `scheduler_reserve_full_isl` admits a waiting request
    only when its whole prompt fits in the free blocks (vLLM's default since its PR #37307); off, a first chunk
    that fits is enough (vLLM <= 0.10).
    """

    max_num_batched_tokens: int = SETTING
    max_num_seqs: int = SETTING
    long_prefill_token_threshold: int = SETTING
    enable_chunked_prefill: bool = SETTING
    policy: str = SETTING
    preemption_mode: str = SETTING
    victim_policy: str = SETTING
    schedule: str = SETTING
    scheduler_reserve_full_isl: bool = SETTING
    vllm_version: str = SETTING
    cache_aware_admission_window: int = SETTING
    cache_aware_admission_threshold: float = SETTING
    speculative_config: str | None = SETTING
    enable_lora: bool = SETTING
    max_loras: int = SETTING
    max_lora_rank: int = SETTING
    max_cpu_loras: int | None = SETTING

    def __post_init__(self) -> None:
        check_settings(self, "scheduler", "scheduler")
        first = SETTINGS["cache_aware_admission_window"].since  # the release that added it (its declaration)
        if self.cache_aware_admission_window and self.vllm_version not in since(first):
            raise ConfigError(f"scheduler.cache_aware_admission_window: vLLM {self.vllm_version} has no cache-aware "
                              f"admission (added in {first}); allowed: 0, or vllm_version {' or '.join(since(first))}")
        if self.cache_aware_admission_window and self.policy != "fcfs":
            raise ConfigError("scheduler.cache_aware_admission_window: reorders the waiting queue by position, which "
                              "only the fcfs policy has (vLLM ignores it otherwise); allowed: 0 with policy "
                              f"{self.policy!r}, or policy 'fcfs'")

    @property
    def version(self) -> VllmVersion:
        return VERSIONS[self.vllm_version]

    @property
    def speculative(self) -> SpeculativeConfig | None:
        """`speculative_config` parsed (None: off); checked already, so this never raises."""
        return parse_speculative_config(self.speculative_config, "scheduler.speculative_config")
