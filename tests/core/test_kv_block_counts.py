"""The KV manager's block counts (`request_blocks`, `peak_blocks`) answer exactly what the cache configuration
answers (`CacheConfig.blocks_per_request`, `CacheConfig.peak_blocks`), with and without a sink+window: the manager
only keeps the common windowless case out of the interpreted configuration class."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from kvplan.engine.core import CacheConfig
from kvplan.engine.core.kv_manager import KVCacheManager


@settings(max_examples=200, deadline=None)
@given(block_size=st.sampled_from([1, 2, 4, 16]), window=st.sampled_from([0, 8, 24, 100]),
       sinks=st.integers(0, 8), positions=st.integers(-3, 400), chunk=st.integers(1, 64))
def test_the_managers_block_counts_are_the_configurations(block_size: int, window: int, sinks: int,
                                                          positions: int, chunk: int) -> None:
    config = CacheConfig(num_blocks=64, block_size=block_size, max_model_len=64, window_tokens=window,
                         sink_tokens=min(sinks, window))
    kv = KVCacheManager(config)
    assert kv.peak_blocks(positions, chunk) == config.peak_blocks(positions, chunk)
    assert kv.request_blocks(positions) == config.blocks_per_request(positions)
