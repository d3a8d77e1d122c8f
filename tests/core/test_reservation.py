"""Contiguous reservation baselines: first-fit placement, merging, and measurable fragmentation."""

from __future__ import annotations

import pytest

from kvplan.engine.core import CacheConfig, make_request, memory_breakdown
from kvplan.engine.core.reservation import ReservationAllocator, next_pow2
from tests.core.helpers import make_scheduler, run_to_completion


def allocator(mode: str, slots: int = 64, max_len: int = 32) -> ReservationAllocator:
    return ReservationAllocator(CacheConfig(block_size=1, num_blocks=slots, allocator=mode, max_model_len=max_len,
                                            enable_prefix_caching=False, watermark=0.0))


def test_next_pow2():
    assert [next_pow2(n) for n in (1, 2, 3, 5, 16, 17)] == [1, 2, 4, 8, 16, 32]


@pytest.mark.parametrize(("mode", "size"), [("max", 32), ("pow2", 16), ("oracle", 11)])
def test_reservation_sizes(mode, size):
    kv = allocator(mode)
    request = make_request("r", prompt_len=6, max_tokens=5)
    assert kv.allocate(request, 6) == ()
    assert kv.extents["r"] == (0, size)


def test_first_fit_reuses_holes_and_merges_neighbours():
    kv = allocator("oracle", slots=30, max_len=30)
    reqs = {rid: make_request(rid, prompt_len=n, max_tokens=1) for rid, n in (("a", 9), ("b", 4), ("c", 9))}
    for request in reqs.values():
        kv.allocate(request, request.prompt_len)
    assert [kv.extents[r][0] for r in "abc"] == [0, 10, 15]
    kv.free(reqs["a"])
    kv.free(reqs["c"])  # holes [0,10) and [15,30): 25 free slots, the largest hole 15
    big = make_request("big", prompt_len=19, max_tokens=1)
    assert kv.allocate(big, 19) is None  # external fragmentation: 25 free, no hole of 20
    breakdown = memory_breakdown(kv, reqs.values())
    assert breakdown.external_fragmentation == pytest.approx(10 / 30)
    assert breakdown.free == pytest.approx(15 / 30)
    kv.free(reqs["b"])  # everything merges back into one extent
    assert kv._free_starts == [0] and kv._free_lengths == {0: 30}
    assert kv.allocate(big, 19) == ()


def test_breakdown_separates_tokens_reserved_and_internal_fragmentation():
    kv = allocator("pow2", slots=64)
    request = make_request("r", prompt_len=6, max_tokens=5)  # needs 11, reserves 16
    kv.allocate(request, 6)
    request.num_computed_tokens = 6
    b = memory_breakdown(kv, [request])
    assert (b.token_states, b.reserved_unused, b.internal_fragmentation) == (6 / 64, 5 / 64, 5 / 64)
    assert b.free == pytest.approx(48 / 64) and b.kv_token_utilization == pytest.approx(6 / 16)


@pytest.mark.parametrize("mode", ["max", "pow2", "oracle"])
def test_baselines_run_a_workload_to_completion_without_leaks(mode):
    sched = make_scheduler(block_size=1, num_blocks=128, allocator=mode, enable_prefix_caching=False,
                           max_model_len=64, budget=64, max_seqs=8)
    for i in range(12):
        sched.add_request(make_request(f"r{i}", prompt_len=5 + 3 * i, max_tokens=4 + i, n=1 + i % 2))
    finished = run_to_completion(sched)
    assert len(finished) == 12 + 6
    assert sched.kv.reserved_slots == 0 and sched.kv._free_lengths == {0: 128}
