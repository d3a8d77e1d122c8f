"""The batched decode advance leaves exactly the state of k single cycles."""

from __future__ import annotations

import copy
import random

import pytest

from engine.core import make_request
from engine.core.eviction import EVICTION_POLICIES
from engine.core.fast_forward import advance_decode, decode_horizon
from tests.core.helpers import make_scheduler


def snapshot(sched, full: bool) -> tuple:
    kv, pool = sched.kv, sched.kv.pool
    requests = sorted((r.request_id, r.status, r.num_computed_tokens, r.num_output_tokens, r.num_hashed_blocks)
                      for r in sched.requests.values())
    state = (requests, dict(kv.block_ids), [b.block_id for b in pool._empty], sched.step_id,
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
@pytest.mark.parametrize("block_size", [1, 16])
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
        k = decode_horizon(fast, rng.randint(1, 40))
        if k:
            advance_decode(fast, k)
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
    assert decode_horizon(sched, 100) == 9  # nobody is left after a's last token
    assert decode_horizon(sched, 2) == 2
    usage: list[float] = []
    finished = advance_decode(sched, 6, usage)
    assert [(step, r.request_id) for step, r in finished] == [(3, "b")]  # b's 5th token, in step 3
    assert finished[0][1].finish_reason == "length"
    assert [r.request_id for r in sched.running] == ["a"] and "b" not in sched.kv.tables
    # step 0 writes position 3 into the first blocks; step 1 opens both second blocks; b's 2 blocks go free
    # after step 3; step 5 opens a's third block (position 8)
    assert usage == [2 / 8, 4 / 8, 4 / 8, 4 / 8, 2 / 8, 3 / 8]
    assert sched.running[0].num_output_tokens == 7 and decode_horizon(sched, 100) == 3
    sched.add_request(make_request("c", prompt_len=3, max_tokens=5))
    assert decode_horizon(sched, 100) == 0  # someone is waiting: admissions are events


def test_horizon_is_bounded_by_the_empty_blocks():
    sched = make_scheduler(block_size=4, num_blocks=9, budget=64, max_model_len=36)
    for rid in "abc":
        sched.add_request(make_request(rid, prompt_len=4, max_tokens=30))
    sched.update(sched.schedule())  # 3 blocks used (4 tokens each, all full): 6 empty blocks
    # every request needs a new block at each of its next steps 0, 4, 8: 6 blocks last exactly 8 steps
    assert decode_horizon(sched, 100) == 8
