"""Pluggable eviction policies for cached free KV blocks, chosen by name."""

from __future__ import annotations

from kvplan.engine.core.eviction.base import EvictionPolicy
from kvplan.engine.core.eviction.fifo import FIFOPolicy
from kvplan.engine.core.eviction.lfu import LFUPolicy
from kvplan.engine.core.eviction.lru import LRUPolicy
from kvplan.engine.core.eviction.s3fifo import S3FIFOPolicy
from kvplan.errors import ConfigError

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
