"""Validated configuration of the KV cache and the scheduler.

Every check raises `ConfigError` whose message starts with the key path (`cache.block_size`, ...) so that the
YAML layer can point at the offending key, and says what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass

ALLOCATORS = ("paged", "max", "pow2", "oracle")
PREEMPTION_MODES = ("recompute", "swap")
QUEUE_POLICIES = ("fcfs", "priority")
SCHEDULES = ("mixed", "prefill_first")


class ConfigError(ValueError):
    """A configuration value is out of its allowed range or names something unknown."""


def check_int(path: str, value: object, lo: int, hi: int | None = None) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= lo and (hi is None or value <= hi)
    if not ok:
        allowed = f"an integer in {lo}..{hi}" if hi is not None else f"an integer >= {lo}"
        raise ConfigError(f"{path}: must be {allowed}, got {value!r}")


def check_choice(path: str, value: object, allowed: tuple[str, ...] | list[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{path}: unknown value {value!r}; allowed: {', '.join(allowed)}")


@dataclass(slots=True)
class CacheConfig:
    """How KV memory is carved up.

    `allocator="paged"` is PagedAttention-style block allocation; `max`, `pow2` and `oracle` are the contiguous
    reservation baselines of the vLLM paper (reserve the model's max length, the next power of two of the real
    need, or exactly the real need). `sink_tokens`/`window_tokens` > 0 keeps only the attention sinks and a
    recent window of each request (StreamingLLM); `window_tokens=0` means full attention.
    """

    block_size: int = 16
    num_blocks: int = 1024
    num_cpu_blocks: int = 0
    enable_prefix_caching: bool = True
    eviction_policy: str = "lru"
    allocator: str = "paged"
    max_model_len: int = 4096
    sink_tokens: int = 0
    window_tokens: int = 0
    watermark: float = 0.0  # vLLM V1: none (SchedulerConfig.watermark, 0.0 in 0.33); V0 kept 0.01

    def __post_init__(self) -> None:
        from kvplan.engine.core.eviction import EVICTION_POLICIES

        check_int("cache.block_size", self.block_size, 1, 256)
        check_int("cache.num_blocks", self.num_blocks, 1)
        check_int("cache.num_cpu_blocks", self.num_cpu_blocks, 0)
        check_int("cache.max_model_len", self.max_model_len, 1)
        check_int("cache.sink_tokens", self.sink_tokens, 0)
        check_int("cache.window_tokens", self.window_tokens, 0)
        check_choice("cache.eviction_policy", self.eviction_policy, sorted(EVICTION_POLICIES))
        check_choice("cache.allocator", self.allocator, ALLOCATORS)
        if not isinstance(self.watermark, int | float) or not 0.0 <= self.watermark < 1.0:
            raise ConfigError(f"cache.watermark: must be a fraction in [0, 1), got {self.watermark!r}")
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
                            ("window_tokens", self.window_tokens), ("num_cpu_blocks", self.num_cpu_blocks)):
                if on:
                    raise ConfigError(f"cache.{key}: not supported with the contiguous reservation allocator "
                                      f"{self.allocator!r}; allowed only with allocator 'paged'")

        need = self.blocks_per_request(self.max_model_len)
        if self.num_blocks < need:
            raise ConfigError(
                f"cache.num_blocks: {self.num_blocks} blocks of {self.block_size} tokens cannot hold one request of "
                f"max_model_len {self.max_model_len} ({need} blocks needed); allowed: num_blocks >= {need}, or a "
                "smaller cache.max_model_len")

    def blocks_per_request(self, num_tokens: int) -> int:
        """Blocks one request of `num_tokens` tokens holds once its window has slid (decode steady state)."""
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
        if not self.window_tokens or n <= 0:
            return -(-max(n, 0) // bs)
        sink = -(-self.sink_tokens // bs)
        first_release = self.window_tokens + sink * bs  # s0: the first start at which a non-sink block is gone

        def held(start: int) -> int:
            end = min(start + chunk, n)
            gone = max(0, start - self.window_tokens) // bs  # blocks < gone have left the window
            blocks = -(-end // bs)
            return min(sink, blocks) + max(0, blocks - max(sink, gone))

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
class SchedulerConfig:
    """Continuous batching limits and policies (names follow vLLM).

    `schedule="mixed"` puts running requests first and fills the rest of the token budget with prefill chunks
    (vLLM V1, Sarathi); `"prefill_first"` runs a step of prefills alone whenever any can be scheduled and decodes
    only in steps without one (vLLM V0 and the vLLM paper). `scheduler_reserve_full_isl` admits a waiting request
    only when its whole prompt fits in the free blocks (vLLM's default since its PR #37307); off, a first chunk
    that fits is enough (vLLM <= 0.10).
    """

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"
    preemption_mode: str = "recompute"
    victim_policy: str = "newest"
    schedule: str = "mixed"
    scheduler_reserve_full_isl: bool = True

    def __post_init__(self) -> None:
        from kvplan.engine.core.victims import VICTIM_POLICIES

        check_int("scheduler.max_num_batched_tokens", self.max_num_batched_tokens, 1)
        check_int("scheduler.max_num_seqs", self.max_num_seqs, 1)
        check_choice("scheduler.policy", self.policy, QUEUE_POLICIES)
        check_choice("scheduler.preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        check_choice("scheduler.victim_policy", self.victim_policy, sorted(VICTIM_POLICIES))
        check_choice("scheduler.schedule", self.schedule, SCHEDULES)
        if not isinstance(self.scheduler_reserve_full_isl, bool):
            raise ConfigError("scheduler.scheduler_reserve_full_isl: must be true or false, got "
                              f"{self.scheduler_reserve_full_isl!r}")
