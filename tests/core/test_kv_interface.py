"""Every KV manager implements the declared `KVManager` protocol: each member, with the protocol's parameters."""

from __future__ import annotations

import inspect

import pytest

from kvplan.engine.core import CacheConfig, Scheduler
from kvplan.engine.core.config import HybridCacheConfig
from kvplan.engine.core.kv_groups import HybridKVCacheManager
from kvplan.engine.core.kv_interface import KVManager
from kvplan.engine.core.kv_layout import KVLayout
from kvplan.engine.core.kv_manager import KVCacheManager
from kvplan.engine.core.reservation import ReservationAllocator


def as_kv_manager(kv: KVCacheManager | HybridKVCacheManager | ReservationAllocator) -> KVManager:
    """The static half of the check: mypy accepts each manager class where a `KVManager` is expected."""
    return kv


def hybrid_layout() -> KVLayout:
    return KVLayout.from_layer_types(("sliding_attention", "full_attention") * 2, 8)


def managers() -> list:
    layout = hybrid_layout()
    return [KVCacheManager(CacheConfig(num_blocks=32, max_model_len=256, kv_offloading_blocks=8)),
            HybridKVCacheManager(HybridCacheConfig(num_blocks=32, max_model_len=256, kv_layout=layout), 64),
            ReservationAllocator(CacheConfig(num_blocks=32, max_model_len=256, allocator="oracle",
                                             enable_prefix_caching=False))]


def protocol_members() -> list[str]:
    return sorted(name for name in vars(KVManager) if not name.startswith("_"))


@pytest.mark.parametrize("kv", managers(), ids=lambda kv: type(kv).__name__)
def test_each_manager_implements_the_protocol(kv):
    assert isinstance(as_kv_manager(kv), KVManager)
    for name in protocol_members():
        declared = vars(KVManager)[name]
        assert hasattr(kv, name), f"{type(kv).__name__} lacks {name}"
        if callable(declared):  # a method: the same parameters, in the same order
            expected = list(inspect.signature(declared).parameters)[1:]
            assert list(inspect.signature(getattr(kv, name)).parameters) == expected, name


@pytest.mark.parametrize("kv", managers(), ids=lambda kv: type(kv).__name__)
def test_the_optional_members_say_what_a_manager_lacks(kv):
    paged = isinstance(kv, KVCacheManager)
    assert (kv.pool is None) == isinstance(kv, ReservationAllocator)
    assert bool(kv.tiers) == paged  # only the single-group paged cache has tiers (here: a CPU tier)
    assert list(kv.groups) == ([kv] if paged else kv.managers if isinstance(kv, HybridKVCacheManager) else [])
    assert kv.take_transfers() == []


def test_the_scheduler_builds_every_manager_kind_behind_the_protocol():
    layout = hybrid_layout()
    for cache in (CacheConfig(num_blocks=32, max_model_len=256),
                  HybridCacheConfig(num_blocks=32, max_model_len=256, kv_layout=layout),
                  CacheConfig(num_blocks=32, max_model_len=256, allocator="pow2", enable_prefix_caching=False)):
        assert isinstance(Scheduler(cache).kv, KVManager)
