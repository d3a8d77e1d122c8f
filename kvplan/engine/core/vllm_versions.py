"""The vLLM releases kvplan follows, and what differs between them: the one place a new release is added.

A planner that says "vLLM's defaults" must say which vLLM. `vllm_version` (a setting: `--vllm-version`,
`engine: {vllm_version: ...}`) picks one of `VERSIONS`; the core reads the behaviours that differ from it and the
simulator the defaults. Each entry was read from that release's wheel (`vllm/config/cache.py`,
`vllm/config/scheduler.py`, `vllm/v1/core/sched/scheduler.py`) and is held by the parity run against that
release's own scheduler (`scripts/vllm_parity.sh --vllm-version X`, tests/core/test_vllm_parity.py).

Adding a release: one `VllmVersion` in `VERSIONS` (its defaults and behaviour switches; a new behaviour gets a
switch here, read where the core implements it), `since=` on the settings it adds, and its parity run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class VllmVersion:
    """One release: its defaults where kvplan leaves a setting to vLLM, and the behaviours that changed."""

    name: str  # the setting's value: major.minor
    release: str  # the release whose scheduler the parity tests drive
    # `CacheConfig.DEFAULT_BLOCK_SIZE`: the block size when none is given (CUDA; a backend may prefer another)
    block_size: int
    # `gpu_memory_utilization` when none is given, on a CUDA GPU
    gpu_memory_utilization: float
    gpu_memory_utilization_why: str
    # `long_prefill_token_threshold` caps a prefill chunk only with chunked prefill on (0.34: "Ignored when
    # chunked prefill is disabled"); before, it capped the prompt either way
    long_prefill_needs_chunking: bool
    notes: str  # one line: what this release changed that kvplan follows


VERSIONS: dict[str, VllmVersion] = {v.name: v for v in (
    VllmVersion("0.33", "0.33.0", block_size=16, gpu_memory_utilization=0.92,
                gpu_memory_utilization_why="CacheConfig's default",
                long_prefill_needs_chunking=False,
                notes="the long-prefill cap applies with chunked prefill off too"),
    VllmVersion("0.34", "0.34.0", block_size=64, gpu_memory_utilization=1.0,
                gpu_memory_utilization_why="the extensible KV cache (on by default on CUDA) takes the memory free "
                                           "after warm-up: utilization 1.0",
                long_prefill_needs_chunking=True,
                notes="block size 64 by default; cache-aware admission (cache_aware_admission_window/_threshold); "
                      "long_prefill_token_threshold ignored without chunked prefill"),
)}


def _key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split("."))


NAMES = tuple(sorted(VERSIONS, key=_key))
NEWEST = NAMES[-1]


def since(first: str) -> tuple[str, ...]:
    """The versions from `first` on (a setting a release added is allowed with these)."""
    return tuple(name for name in NAMES if _key(name) >= _key(first))


def version(name: str) -> VllmVersion:
    return VERSIONS[name]
