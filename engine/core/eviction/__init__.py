"""Pluggable eviction policies for cached free KV blocks, chosen by name."""

from __future__ import annotations

from engine.core.config import ConfigError
from engine.core.eviction.base import EvictionPolicy
from engine.core.eviction.fifo import FIFOPolicy
from engine.core.eviction.lfu import LFUPolicy
from engine.core.eviction.lru import LRUPolicy
from engine.core.eviction.s3fifo import S3FIFOPolicy

EVICTION_POLICIES: dict[str, type[EvictionPolicy]] = {
    cls.name: cls for cls in (LRUPolicy, FIFOPolicy, LFUPolicy, S3FIFOPolicy)
}


def make_eviction_policy(name: str, capacity: int) -> EvictionPolicy:
    try:
        return EVICTION_POLICIES[name](capacity)
    except KeyError:
        raise ConfigError(f"cache.eviction_policy: unknown policy {name!r}; allowed: "
                          f"{', '.join(sorted(EVICTION_POLICIES))}") from None


__all__ = ["EVICTION_POLICIES", "EvictionPolicy", "make_eviction_policy"]
