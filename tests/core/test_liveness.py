"""Every accepted request finishes: the memory-pressure cases that used to stall the core, one test each."""

from __future__ import annotations

import pytest

from kvplan.engine.core import CacheConfig, RequestStatus, Scheduler, SchedulerConfig, make_request
from kvplan.engine.core.eviction import EVICTION_POLICIES
from kvplan.engine.core.eviction.heap_queue import LazyHeap
from tests.core.helpers import make_scheduler, run_to_completion, step
from tests.core.invariants import check_all_free, check_scheduler


def drain(sched: Scheduler, max_steps: int = 20_000) -> tuple[list, list]:
    """Run to the end, checking the invariants and that no step is empty; returns (finished, preempted ids)."""
    finished, preempted = [], []
    for _ in range(max_steps):
        if not sched.has_unfinished():
            return finished, preempted
        out, result = step(sched)
        assert out.scheduled or out.preempted, "an empty step"
        preempted.extend(out.preempted)
        finished.extend(result.finished)
        check_scheduler(sched)
    raise AssertionError(f"no progress to the end in {max_steps} steps")


def test_chunking_off_a_recompute_longer_than_the_budget_is_chunked():
    """Case 1: after a preemption, prompt + generated tokens > max_num_batched_tokens with chunking off."""
    sched = make_scheduler(block_size=16, num_blocks=8, budget=64, max_model_len=128, enable_prefix_caching=False,
                           enable_chunked_prefill=False)
    for rid, (prompt, max_tokens) in enumerate([(48, 60), (60, 40), (8, 4)]):
        assert sched.add_request(make_request(f"r{rid}", prompt_len=prompt, max_tokens=max_tokens, arrival_s=rid))
    finished, preempted = drain(sched)
    assert preempted, "the case needs a preemption"
    assert sorted((r.request_id, r.num_output_tokens) for r in finished) == [("r0", 60), ("r1", 40), ("r2", 4)]
    check_all_free(sched)


def big_and_small(mode: str, prefix_caching: bool) -> Scheduler:
    """Case 2 and 3: a request that needs ~all 1000 blocks, preempted while a small one holds a few."""
    sched = Scheduler(CacheConfig(block_size=16, num_blocks=1000, num_cpu_blocks=2000 if mode == "swap" else 0,
                                  max_model_len=16000, enable_prefix_caching=prefix_caching, watermark=0.01),
                      SchedulerConfig(max_num_batched_tokens=16384, preemption_mode=mode))
    assert sched.cache_config.watermark_blocks == 10
    sched.add_request(make_request("small", prompt_len=8, max_tokens=400, arrival_s=0.0))
    sched.add_request(make_request("big", prompt_len=15823, max_tokens=177, arrival_s=1.0))
    return sched


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_readmission_after_recompute_is_not_held_back_by_the_watermark(prefix_caching):
    """Case 2: re-admission needs ~995 blocks + 10 of watermark > 1000: admitted once it would run alone."""
    sched = big_and_small("recompute", prefix_caching)
    finished, preempted = drain(sched)
    assert "big" in preempted
    assert {r.request_id: r.num_output_tokens for r in finished} == {"small": 400, "big": 177}


def test_swap_in_is_not_held_back_by_the_watermark_and_later_requests_run():
    """Case 3: the swapped-out big request comes back once the cache is empty; a later 4-token request too."""
    sched = big_and_small("swap", False)
    swapped = False
    while not swapped:
        out, _ = step(sched)
        swapped = bool(out.swap_out)
    assert sched.requests["big"].status is RequestStatus.SWAPPED
    sched.add_request(make_request("late", prompt_len=4, max_tokens=4, arrival_s=2.0))
    finished, _ = drain(sched)
    assert {r.request_id: r.num_output_tokens for r in finished} == {"small": 400, "big": 177, "late": 4}


@pytest.mark.parametrize("allocator", ["max", "pow2", "oracle"])
def test_a_reservation_of_every_slot_is_admitted_into_an_empty_cache(allocator):
    """Case 4: a reservation equal to all slots; the watermark must not come on top."""
    sched = Scheduler(CacheConfig(block_size=16, num_blocks=256, max_model_len=4096, allocator=allocator,
                                  enable_prefix_caching=False), SchedulerConfig())
    assert sched.add_request(make_request("r", prompt_len=4000, max_tokens=96))
    assert sched.add_request(make_request("s", prompt_len=10, max_tokens=5))
    finished, _ = drain(sched)
    assert sorted(r.request_id for r in finished) == ["r", "s"]


def test_max_num_seqs_counts_every_sequence_of_an_n_way_request():
    """Case 5: two n=4 requests and one n=1 under max_num_seqs=4 run one group at a time."""
    sched = make_scheduler(block_size=4, num_blocks=64, budget=64, max_seqs=4)
    for rid, n in (("a", 4), ("b", 4), ("c", 1)):
        sched.add_request(make_request(rid, prompt_len=6, max_tokens=3, n=n))
    steps = 0
    while sched.has_unfinished():
        out, _ = step(sched)
        steps += 1
        sequences = sum(i.request.n if not i.request.forked else 1 for i in out.scheduled)
        assert sequences <= 4 and sched.num_running_seqs <= 4
        assert sched.num_running_seqs == sum(r.seq_slots for r in sched.running)
    assert steps >= 3 * 3


def test_an_n_way_request_larger_than_max_num_seqs_is_rejected_up_front():
    sched = make_scheduler(max_seqs=2)
    assert not sched.add_request(make_request("a", prompt_len=4, max_tokens=2, n=3))
    out, _ = step(sched)
    assert out.rejected == [("a", "n = 3 parallel sequences exceed max_num_seqs 2")]


def test_a_sampling_group_is_swapped_all_or_nothing_and_shares_its_blocks_again():
    """Case 6: the group's shared prompt blocks go to the CPU once and come back shared."""
    sched = make_scheduler(block_size=4, num_blocks=9, budget=64, num_cpu_blocks=16, preemption_mode="swap",
                           enable_prefix_caching=False, max_model_len=36)
    sched.add_request(make_request("old", prompt_len=12, max_tokens=16, arrival_s=0.0))
    sched.add_request(make_request("g", prompt_len=8, max_tokens=6, n=2, arrival_s=1.0))
    members = {"g", "g#1"}
    saw_swap_out = saw_swap_in = False
    while sched.has_unfinished():
        out = sched.schedule()  # checked before update(), which may finish a member
        preempted = set(out.preempted)
        if preempted & members:
            assert preempted >= members, "a sampling group was split"
            cpu = sched.kv.cpu_tables
            assert cpu["g"][:2] == cpu["g#1"][:2] and all(block.ref_cnt == 2 for block in cpu["g"][:2])
            entries = len(cpu["g"]) + len(cpu["g#1"])
            assert len(out.swap_out) == len({g for g, _ in out.swap_out}) == entries - 2  # shared ones once
            saw_swap_out = True
        if out.swap_in:
            tables = sched.kv.tables
            assert tables["g"][:2] == tables["g#1"][:2], "the prompt blocks are shared again"
            assert all(block.ref_cnt == 2 for block in tables["g"][:2])
            saw_swap_in = True
        sched.update(out, [[1, 1] if i.request.n > 1 and not i.request.forked else 1 for i in out.scheduled])
    assert saw_swap_out and saw_swap_in
    check_all_free(sched)


def test_sink_window_with_chunked_prefill_counts_every_chunk():
    """Case 7: each later chunk needs the sinks, the window and a whole budget-sized chunk."""
    config = dict(block_size=16, num_blocks=10, sink_tokens=16, window_tokens=64, max_model_len=2000)
    sched = make_scheduler(budget=128, **config)
    assert not sched.add_request(make_request("long", prompt_len=1000, max_tokens=8))
    (rid, reason), = step(sched)[0].rejected
    assert rid == "long" and "max_num_batched_tokens" in reason
    sched = make_scheduler(budget=32, **config)  # a smaller chunk fits: 1 sink + 4 window + 2 new + 1 partial
    assert sched.add_request(make_request("long", prompt_len=1000, max_tokens=8))
    finished, preempted = drain(sched)
    assert [r.num_output_tokens for r in finished] == [8] and not preempted


def policy_footprint(policy) -> int:
    """Entries held by a policy's containers (a lazy heap counts its stale entries too)."""
    total = 0
    for value in vars(policy).values():
        if isinstance(value, LazyHeap):
            total += value.num_entries + len(value)
        elif hasattr(value, "__len__"):
            total += len(value)
    return total


@pytest.mark.parametrize("policy", sorted(EVICTION_POLICIES))
def test_eviction_policy_state_stays_bounded_by_the_cache(policy):
    """Case 8: 3000 requests sharing an 8-block system prompt, each hitting and releasing it."""
    sched = make_scheduler(block_size=4, num_blocks=64, budget=64, eviction_policy=policy)
    system = list(range(32))
    for i in range(3000):
        sched.add_request(make_request(f"r{i}", prompt_token_ids=[*system, 1000 + i], max_tokens=1))
        run_to_completion(sched)
    assert sched.kv.prefix_hits >= 2999 * 32
    assert policy_footprint(sched.kv.pool.policy) <= 4 * sched.cache_config.num_blocks + 64


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_a_group_that_outgrows_the_pool_finishes_as_independent_sequences(mode):
    """Two samples sharing a 4-token prompt need 1 + 3 + 3 blocks of a 4-block pool: the group preempts itself
    (a step with nothing scheduled), is recomputed, and its members then run one at a time."""
    sched = make_scheduler(block_size=4, num_blocks=4, budget=64, max_model_len=16, enable_prefix_caching=False,
                           preemption_mode=mode, num_cpu_blocks=8 if mode == "swap" else 0)
    sched.add_request(make_request("g", prompt_len=4, max_tokens=10, n=2))
    finished, preempted = drain(sched)
    assert set(preempted) >= {"g", "g#1"}
    assert sorted((r.request_id, r.num_output_tokens) for r in finished) == [("g", 10), ("g#1", 10)]
    check_all_free(sched)
