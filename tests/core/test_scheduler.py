"""Scheduling behaviour: chunked prefill, preemption in both modes, victims, rejection, forks, priorities."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvplan.engine.core import CacheConfig, ConfigError, RequestStatus, SchedulerConfig, make_request
from kvplan.engine.core.victims import VICTIM_POLICIES, pick_victim
from tests.core.helpers import make_scheduler, run_to_completion, step


def test_chunked_prefill_splits_a_long_prompt_across_steps():
    sched = make_scheduler(block_size=4, budget=32)
    sched.add_request(make_request("r", prompt_len=100, max_tokens=2))
    chunks = []
    for _ in range(5):
        out, _ = step(sched)
        chunks.append([(i.start_pos, i.num_new_tokens, i.samples) for i in out.scheduled])
    assert chunks == [[(0, 32, False)], [(32, 32, False)], [(64, 32, False)], [(96, 4, True)], [(100, 1, True)]]
    assert not sched.has_unfinished()


def test_running_requests_come_first_then_waiting_share_the_budget():
    sched = make_scheduler(block_size=4, budget=10)
    sched.add_request(make_request("a", prompt_len=6, max_tokens=5))
    step(sched)
    sched.add_request(make_request("b", prompt_len=20, max_tokens=5))
    out, _ = step(sched)
    assert [(i.request_id, i.num_new_tokens) for i in out.scheduled] == [("a", 1), ("b", 9)]


@pytest.mark.parametrize(("chunked", "first_step"), [(False, [("a", 6)]), (True, [("a", 6), ("b", 4)])])
def test_without_chunking_a_prompt_waits_for_a_step_with_room(chunked, first_step):
    sched = make_scheduler(block_size=4, budget=10, enable_chunked_prefill=chunked)
    sched.add_request(make_request("a", prompt_len=6, max_tokens=3))
    sched.add_request(make_request("b", prompt_len=8, max_tokens=3))
    out, _ = step(sched)
    assert [(i.request_id, i.num_new_tokens) for i in out.scheduled] == first_step
    out, _ = step(sched)
    assert [(i.request_id, i.num_new_tokens) for i in out.scheduled] == [("a", 1), ("b", 8 if not chunked else 4)]


def pressure(mode: str, victim: str = "newest", **kwargs):
    """Three requests that fit at admission but not once they grow."""
    sched = make_scheduler(block_size=4, num_blocks=8, budget=64, preemption_mode=mode, victim_policy=victim,
                           num_cpu_blocks=8 if mode == "swap" else 0, **kwargs)
    for i, prio in enumerate((1, 0, 2)):
        sched.add_request(make_request(f"r{i}", prompt_len=8, max_tokens=8 + i, priority=prio, arrival_s=i))
    return sched


def test_recompute_preemption_frees_the_newest_and_requeues_it_first():
    sched = pressure("recompute")
    preempted = []
    while sched.has_unfinished() and not preempted:
        out, _ = step(sched)
        preempted = out.preempted
    assert preempted == ["r2"]
    victim = sched.requests["r2"]
    assert victim.status is RequestStatus.PREEMPTED and victim.num_computed_tokens == 0
    assert sched.waiting.peek() is victim and "r2" not in sched.kv.tables
    finished = run_to_completion(sched)
    assert sorted((r.request_id, r.num_output_tokens) for r in finished) == [("r0", 8), ("r1", 9), ("r2", 10)]
    assert sched.stats.num_preemptions >= 1 and sched.stats.num_recomputes >= 1


def test_swap_preemption_moves_blocks_to_cpu_and_back_before_new_admissions():
    sched = pressure("swap")
    out = None
    while sched.has_unfinished():
        out, _ = step(sched)
        if out.preempted:
            break
    assert out.swap_out and sched.requests["r2"].status is RequestStatus.SWAPPED
    sched.add_request(make_request("late", prompt_len=4, max_tokens=2))
    first_seen: dict[str, int] = {}
    while sched.has_unfinished():
        out, _ = step(sched)
        if out.swap_in:
            first_seen.setdefault("swap_in", out.step_id)
        if any(i.request_id == "late" for i in out.scheduled):
            first_seen.setdefault("late", out.step_id)
    assert first_seen["swap_in"] <= first_seen["late"]
    assert sched.stats.num_swap_outs >= 1


@pytest.mark.parametrize(("policy", "expected"), [("newest", "r2"), ("lowest_priority", "r2"),
                                                  ("longest_remaining", "r2")])
def test_victim_policies_on_the_pressure_workload(policy, expected):
    sched = pressure("recompute", policy)
    while sched.has_unfinished():
        out, _ = step(sched)
        if out.preempted:
            assert out.preempted[0] == expected
            return
    raise AssertionError("no preemption happened")


def test_pick_victim_hand_worked():
    reqs = [make_request("old_low_prio", prompt_len=4, max_tokens=50, priority=5, arrival_s=0),
            make_request("mid", prompt_len=4, max_tokens=10, priority=1, arrival_s=1),
            make_request("new", prompt_len=4, max_tokens=20, priority=1, arrival_s=2)]
    for seq, r in enumerate(reqs):
        r.seq = seq
    reqs[0].num_output_tokens = 5  # 45 to go
    assert pick_victim("newest", reqs).request_id == "new"
    assert pick_victim("lowest_priority", reqs).request_id == "old_low_prio"
    assert pick_victim("longest_remaining", reqs).request_id == "old_low_prio"
    reqs[0].num_output_tokens = 40  # 10 to go: "new" (20 to go) has the most left
    assert pick_victim("longest_remaining", reqs).request_id == "new"


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(0, 9)), min_size=1, max_size=12),
       st.permutations(range(12)), st.sampled_from(sorted(VICTIM_POLICIES)))
def test_pick_victim_is_the_policy_key_maximum(fields, order, policy):
    """Whatever the running order - forks share their parent's `started`, cache-aware admission starts a later
    arrival first - the victim is the request with the largest policy key (the default's field-by-field scan
    included), ties in the key's leading fields falling to the larger `seq`."""
    reqs = []
    for seq, (started, priority, output) in enumerate(fields):
        request = make_request(f"r{seq}", prompt_len=4, max_tokens=10, priority=priority, arrival_s=started)
        request.seq, request.started, request.num_output_tokens = seq, started, output
        reqs.append(request)
    running = [reqs[i] for i in order if i < len(reqs)]
    assert pick_victim(policy, running) is max(running, key=VICTIM_POLICIES[policy])


def test_priority_queue_admits_the_most_important_first():
    sched = make_scheduler(block_size=4, budget=8, max_seqs=1, policy="priority")
    for rid, prio in (("low", 3), ("high", 0), ("mid", 1)):
        sched.add_request(make_request(rid, prompt_len=4, max_tokens=1, priority=prio))
    order = [step(sched)[0].scheduled[0].request_id for _ in range(3)]
    assert order == ["high", "mid", "low"]


def test_impossible_requests_are_rejected_with_a_reason():
    sched = make_scheduler(block_size=4, num_blocks=8, max_model_len=32, budget=16, enable_chunked_prefill=False)
    assert not sched.add_request(make_request("long", prompt_len=30, max_tokens=5))
    assert not sched.add_request(make_request("chunk", prompt_len=20, max_tokens=1))
    out, _ = step(sched)
    reasons = dict(out.rejected)
    assert "exceeds max_model_len 32" in reasons["long"]
    assert "exceeds max_num_batched_tokens 16" in reasons["chunk"]
    assert not sched.has_unfinished()


def test_watermark_keeps_blocks_free_for_running_requests():
    sched = make_scheduler(block_size=4, num_blocks=10, budget=64, watermark=0.2, max_model_len=40)
    sched.add_request(make_request("a", prompt_len=16, max_tokens=4))  # 4 blocks
    sched.add_request(make_request("b", prompt_len=16, max_tokens=4))  # 4 more would leave 2 = watermark
    sched.add_request(make_request("c", prompt_len=4, max_tokens=4))  # 1 more would leave 1 < 2
    out, _ = step(sched)
    assert [i.request_id for i in out.scheduled] == ["a", "b"]


def test_n_samples_share_the_prompt_blocks_then_copy_on_write():
    sched = make_scheduler(block_size=8, num_blocks=32)
    sched.add_request(make_request("r", prompt_len=20, max_tokens=3, n=4))
    out, result = step(sched)
    assert [c.request_id for c in result.forked] == ["r#1", "r#2", "r#3"]
    assert sched.kv.pool.num_used == 3  # 20 prompt tokens in 3 blocks, shared by all four
    assert all(sched.kv.block_ids[rid] == sched.kv.block_ids["r"] for rid in ("r#1", "r#2", "r#3"))
    out, _ = step(sched)
    assert len(out.copies) == 3  # three of the four copy the shared partial block; the last writes in place
    assert sched.kv.pool.num_used == 6
    finished = run_to_completion(sched)
    assert sorted(r.request_id for r in finished) == ["r", "r#1", "r#2", "r#3"]
    assert all(r.num_output_tokens == 3 for r in finished)


def test_stop_token_finishes_early_and_abort_frees():
    sched = make_scheduler(block_size=4)
    sched.add_request(make_request("s", prompt_len=5, max_tokens=10, stop_token_ids={9}))
    sched.add_request(make_request("a", prompt_len=5, max_tokens=10))
    _, result = step(sched, token=9)
    assert [(r.request_id, r.finish_reason) for r in result.finished] == [("s", "stop")]
    assert sched.abort("a") and not sched.abort("a")
    assert sched.kv.pool.num_used == 0 and not sched.has_unfinished()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"block_size": 0}, r"cache.block_size: must be an integer >= 1 and <= 256, got 0"),
    ({"block_size": 512}, r"cache.block_size: must be an integer >= 1 and <= 256"),
    ({"eviction_policy": "random"}, r"cache.eviction_policy: unknown value 'random'; allowed: fifo, lfu, lru, s3fifo"),
    ({"num_blocks": 3, "block_size": 16, "max_model_len": 100}, r"cache.num_blocks: 3 blocks of 16 tokens cannot "
                                                                 r"hold one request of max_model_len 100 \(7 blocks"),
    ({"allocator": "buddy"}, r"cache.allocator: unknown value 'buddy'; allowed: paged, max, pow2, oracle"),
    ({"allocator": "max", "enable_prefix_caching": True}, r"cache.enable_prefix_caching: not supported"),
    ({"watermark": 1.5}, r"cache.watermark: must be a finite number >= 0 and <= 0.5, got 1.5"),
])
def test_bad_cache_configuration_says_what_is_allowed(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        CacheConfig(**kwargs)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"victim_policy": "oldest"}, r"scheduler.victim_policy: unknown value 'oldest'; allowed: longest_remaining, "
                                  r"lowest_priority, newest"),
    ({"preemption_mode": "kill"}, r"scheduler.preemption_mode: unknown value 'kill'; allowed: recompute, swap"),
    ({"max_num_seqs": 0}, r"scheduler.max_num_seqs: must be an integer >= 1 and <= 1000000, got 0"),
])
def test_bad_scheduler_configuration_says_what_is_allowed(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        SchedulerConfig(**kwargs)


def test_kv_metrics_report_vllm_names_and_a_breakdown_that_sums_to_one():
    sched = make_scheduler(block_size=4, num_blocks=16)
    sched.add_request(make_request("a", prompt_token_ids=list(range(10)), max_tokens=4))
    step(sched)
    metrics = sched.kv_metrics()
    assert metrics["kv_usage"] == 3 / 16 and metrics["num_blocks_used"] == 3
    assert metrics["token_states"] == 10 / 64 and metrics["reserved_unused"] == 2 / 64  # 11 computed next step
    parts = ("token_states", "reserved_unused", "internal_fragmentation", "external_fragmentation", "free")
    assert abs(sum(metrics[p] for p in parts) - 1) < 1e-12
    run_to_completion(sched)
    metrics = sched.kv_metrics()
    assert metrics["kv_usage"] == 0 and metrics["num_cached_free_blocks"] == 3


@pytest.mark.parametrize("known_places", [False, True])
@pytest.mark.parametrize("new_list", [False, True])
@given(finished=st.sets(st.integers(0, 7)))
def test_drop_finished_keeps_the_running_order_in_place_or_in_a_new_list(known_places, new_list, finished):
    """`drop_finished` leaves the RUNNING requests in their order: in the same list (what a step's update does), or
    in a new one with the old list untouched (what a stretch does: the replica stamps its tokens on the old list)."""
    sched = make_scheduler()
    for i in range(8):
        sched.add_request(make_request(str(i), prompt_len=4, max_tokens=4))
    while sched.waiting:
        step(sched)
    running = sched.running
    before = list(running)
    assert len(before) == 8
    for i in finished:
        before[i].status = RequestStatus.FINISHED
    sched.drop_finished(sorted(finished) if known_places else None, new_list=new_list)
    assert [r.request_id for r in sched.running] == [r.request_id for i, r in enumerate(before) if i not in finished]
    assert (sched.running is running) == (not new_list or not finished)
    if new_list:
        assert running == before
