"""The memory-efficiency figures that `kvplan bench core` prints, on a smaller workload (no timing)."""

from __future__ import annotations

from kvplan.bench.core import memory_efficiency
from kvplan.bench.workloads import sharegpt_like


def test_paged_block16_keeps_token_states_above_95_percent_and_baselines_far_below():
    lengths = sharegpt_like(150, seed=1)
    util = {name: memory_efficiency(alloc, bs, lengths, num_slots=16 * 1024, max_model_len=2048)
            for name, alloc, bs in (("paged", "paged", 16), ("oracle", "oracle", 1), ("pow2", "pow2", 1),
                                    ("max", "max", 1))}
    assert util["paged"]["kv_token_utilization"] >= 0.95
    assert util["oracle"]["kv_token_utilization"] < 0.8
    assert util["max"]["kv_token_utilization"] < util["pow2"]["kv_token_utilization"] < util["oracle"][
        "kv_token_utilization"]
    for result in util.values():
        parts = ("token_states", "reserved_unused", "internal_fragmentation", "external_fragmentation", "free")
        assert abs(sum(result[p] for p in parts) - 1.0) < 1e-9


def test_sharegpt_like_lengths_have_the_published_means():
    lengths = sharegpt_like(20_000, seed=0)
    prompt = sum(p for p, _ in lengths) / len(lengths)
    output = sum(o for _, o in lengths) / len(lengths)
    assert 140 < prompt < 170 and 290 < output < 345
    assert max(p + o for p, o in lengths) <= 2048
