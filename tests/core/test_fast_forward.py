"""The batched decode advance leaves exactly the state of k single cycles."""

from __future__ import annotations

import copy
import random

import pytest

from kvplan.engine.core import make_request
from kvplan.engine.core.eviction import EVICTION_POLICIES
from tests.core.helpers import make_scheduler


def snapshot(sched, full: bool) -> tuple:
    kv, pool = sched.kv, sched.kv.pool
    requests = sorted((r.request_id, r.status, r.num_computed_tokens, r.num_output_tokens, r.num_hashed_blocks)
                      for r in sched.requests.values())
    state = (requests, dict(kv.block_ids), pool.empty_order(), sched.step_id,
             [r.request_id for r in sched.running], sched.stats.num_steps)
    if not full:
        return state
    drained = copy.deepcopy(pool)  # the eviction order the policy would follow from here on
    while drained.num_empty:
        drained.allocate()
    eviction_order = [drained.allocate().block_id for _ in range(len(drained.policy))]
    return (*state, sorted((k, b.block_id) for k, b in pool.cached.items()), eviction_order)


def add_random_requests(rng: random.Random, scheds, counter: int, shared_roots: int) -> int:
    for _ in range(rng.randint(1, 3)):
        counter += 1
        prompt = rng.randint(1, 60)
        hashes = [rng.randrange(shared_roots)] + [rng.randrange(10**6) for _ in range(prompt // 16)]
        n = rng.choice([1, 1, 1, 2])
        max_tokens = rng.randint(1, 90)
        for sched in scheds:
            sched.add_request(make_request(f"r{counter}", prompt_len=prompt, max_tokens=max_tokens, n=n,
                                           prefix_hashes=hashes, hash_granularity=16))
    return counter


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("block_size", [1, 16, 48])  # 48: not a power of two (no shifts; a multiple of the hashes)
def test_fast_path_equals_step_by_step(seed, block_size):
    rng = random.Random(seed)
    policy = sorted(EVICTION_POLICIES)[seed % len(EVICTION_POLICIES)]
    kwargs = {"block_size": block_size, "num_blocks": 1200 // block_size, "budget": 128, "max_seqs": 12,
              "eviction_policy": policy, "max_model_len": 160}
    fast, slow = make_scheduler(**kwargs), make_scheduler(**kwargs)
    counter = fast_steps = 0
    for iteration in range(300):
        if rng.random() < 0.08 or not fast.has_unfinished():
            counter = add_random_requests(rng, (fast, slow), counter, shared_roots=3)
            if fast.num_unfinished > 10:  # let the batch drain now and then so blocks run short less often
                continue
        limit = rng.randint(1, 40)
        k = fast.decode_horizon(limit)
        least = 1 + iteration % 6  # a caller's shortest worthwhile stretch cuts only shorter ones, to 0
        assert fast.decode_horizon(limit, least) == (k if k >= least else 0)
        if k:
            fast.advance_decodes(k)
            fast_steps += k
            for _ in range(k):
                slow.update(slow.schedule())
        else:
            fast.update(fast.schedule())
            slow.update(slow.schedule())
        full = iteration % 30 == 29
        assert snapshot(fast, full) == snapshot(slow, full)
    assert fast_steps > 100, "the workload never exercised the fast path"


def test_stretch_runs_through_completions_and_reports_their_steps():
    sched = make_scheduler(block_size=4, num_blocks=8, budget=64, max_model_len=32)
    sched.add_request(make_request("a", prompt_len=3, max_tokens=10))
    sched.add_request(make_request("b", prompt_len=3, max_tokens=5))
    sched.update(sched.schedule())  # both prefilled, one token each: a has 9 tokens to go, b 4
    # 2 blocks used, 6 empty; a writes positions 3..11 (2 new blocks), b positions 3..6 (1 new block)
    assert sched.decode_horizon(100) == 9  # nobody is left after a's last token
    assert sched.decode_horizon(2) == 2
    usage: list[float] = []
    finished = sched.advance_decodes(6, usage)
    assert [(step, r.request_id) for step, r in finished] == [(3, "b")]  # b's 5th token, in step 3
    assert finished[0][1].finish_reason == "length"
    assert [r.request_id for r in sched.running] == ["a"] and "b" not in sched.kv.tables
    # step 0 writes position 3 into the first blocks; step 1 opens both second blocks; b's 2 blocks go free
    # after step 3; step 5 opens a's third block (position 8)
    assert usage == [2 / 8, 4 / 8, 4 / 8, 4 / 8, 2 / 8, 3 / 8]
    assert sched.running[0].num_output_tokens == 7 and sched.decode_horizon(100) == 3
    sched.add_request(make_request("c", prompt_len=3, max_tokens=5))
    assert sched.decode_horizon(100) == 0  # someone is waiting: admissions are events


@pytest.mark.parametrize("block_size", [4, 6])  # (6: block numbers by division, not by shifts)
def test_horizon_is_bounded_by_the_empty_blocks(block_size):
    sched = make_scheduler(block_size=block_size, num_blocks=9, budget=64, max_model_len=block_size + 30)
    for rid in "abc":
        sched.add_request(make_request(rid, prompt_len=block_size, max_tokens=30))
    sched.update(sched.schedule())  # 3 blocks used (one full prompt each): 6 empty blocks
    # every request needs a new block at each of its next steps 0, b, 2b: 6 blocks last exactly 2b steps
    assert sched.decode_horizon(100) == 2 * block_size
    assert sched.decode_horizon(2 * block_size + 1) == 2 * block_size  # one step too many: 9 blocks for 6


@pytest.mark.parametrize("policy", sorted(EVICTION_POLICIES))
@pytest.mark.parametrize("schedule", ["mixed", "prefill_first"])
def test_stretches_with_evictions_and_a_backlog_equal_single_steps(policy, schedule):
    """A small cache full of cached-free blocks (so decode allocations evict inside stretches) and a queue that
    max_num_seqs or the free blocks hold back (so stretches run with requests waiting)."""
    rng = random.Random(sorted(EVICTION_POLICIES).index(policy) * 2 + (schedule == "mixed"))
    kwargs = {"block_size": 4, "num_blocks": 90, "budget": 64, "max_seqs": 4, "eviction_policy": policy,
              "max_model_len": 120, "schedule": schedule, "watermark": 0.05}
    fast, slow = make_scheduler(**kwargs), make_scheduler(**kwargs)
    counter = 0
    evicting = backlogged = 0  # stretches that evicted, and that ran with requests waiting
    for iteration in range(400):
        if rng.random() < 0.2 or not fast.has_unfinished():
            counter = add_random_requests(rng, (fast, slow), counter, shared_roots=2)
        k = fast.decode_horizon(rng.randint(1, 60))
        if k:
            evictions, waiting = fast.kv.pool.num_evictions, len(fast.waiting)
            fast.advance_decodes(k)
            evicting += fast.kv.pool.num_evictions > evictions
            backlogged += waiting > 0
            for _ in range(k):
                slow.update(slow.schedule())
        else:
            fast.update(fast.schedule())
            slow.update(slow.schedule())
        assert snapshot(fast, iteration % 25 == 24) == snapshot(slow, iteration % 25 == 24)
    assert evicting > 5 and backlogged > 5, (evicting, backlogged)


def test_backlog_stretch_ends_at_the_first_completion():
    sched = make_scheduler(block_size=4, num_blocks=64, budget=64, max_seqs=2, max_model_len=64)
    for rid, out in (("a", 9), ("b", 4), ("c", 5)):
        sched.add_request(make_request(rid, prompt_len=3, max_tokens=out))
    sched.update(sched.schedule())  # a and b prefilled; c waits for a sequence slot
    assert [r.request_id for r in sched.running] == ["a", "b"] and len(sched.waiting) == 1
    assert sched.decode_horizon(100) == 3  # b's last token (its 4th) comes in step 2; c may enter at step 3
    finished = sched.advance_decodes(3)
    assert [(step, r.request_id) for step, r in finished] == [(2, "b")]
    assert sched.decode_horizon(100) == 0  # c's admission is due
    sched.update(sched.schedule())
    assert [r.request_id for r in sched.running] == ["a", "c"]


def test_horizon_counts_cached_free_blocks_as_room():
    sched = make_scheduler(block_size=4, num_blocks=6, budget=64, max_model_len=24)
    sched.add_request(make_request("old", prompt_len=8, max_tokens=1, prefix_hashes=[7, 8], hash_granularity=4))
    sched.update(sched.schedule())  # its two full prompt blocks stay cached after it finishes
    assert sched.kv.pool.num_cached_free == 2 and sched.kv.pool.num_empty == 4
    sched.add_request(make_request("new", prompt_len=4, max_tokens=20))
    sched.update(sched.schedule())  # 1 block held, 3 empty, 2 cached
    # writes positions 4.. open a block every 4 steps: 5 free blocks (3 empty + 2 evictable) cover 20 steps
    assert sched.decode_horizon(100) == 19
    sched.advance_decodes(19)
    assert sched.kv.pool.num_evictions == 2 and not sched.has_unfinished()


def test_a_backlog_bounds_the_stretch_by_the_first_completion_and_least_cuts_it_to_zero():
    sched = make_scheduler(block_size=4, num_blocks=40, budget=64, max_seqs=2, max_model_len=64)
    sched.add_request(make_request("a", prompt_len=3, max_tokens=4))
    sched.add_request(make_request("b", prompt_len=3, max_tokens=11))
    sched.update(sched.schedule())  # one token each: a has 3 to go, b 10
    sched.add_request(make_request("c", prompt_len=3, max_tokens=5))  # no sequence slot until one finishes
    assert sched.waiting_head_blocked()
    assert sched.decode_horizon(100) == 3  # a's completion frees a slot: c may be admitted then
    assert sched.decode_horizon(100, 3) == 3
    assert sched.decode_horizon(100, 4) == 0
    assert sched.decode_horizon(2, 3) == 0  # the limit alone is below it
