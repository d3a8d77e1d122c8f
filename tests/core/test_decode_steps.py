"""The decode step applied at once equals the general loop: k steps of `advance_decodes` leave the state of k plain
`schedule()` + `update()` cycles, and bulk-scheduled decodes (`DecodeMode.BULK`) that of the per-request loop -
full state: block tables, the pool's empty stack, keys, duplicates and eviction order, the tiers below it, every
request's counters, the queues, and the completions in order."""

from __future__ import annotations

import copy
import random

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvplan.engine.core import Scheduler, make_request
from kvplan.engine.core.decode_events import FINISH, UPDATE, block_events
from kvplan.engine.core.decode_steps import DecodeMode
from kvplan.engine.core.decode_stretch import _sorted_order
from kvplan.engine.core.eviction import EVICTION_POLICIES
from tests.core.helpers import make_scheduler
from tests.core.test_bulk_decode import batch


def state(sched: Scheduler, full: bool) -> tuple:
    """Everything a decode step can change, in comparable form (`full`: with the eviction order from here on, the
    costly part)."""
    requests = sorted((r.request_id, r.status, r.num_computed_tokens, r.num_output_tokens, r.num_hashed_blocks,
                       r.num_preemptions, r.num_cached_tokens, r.finish_reason) for r in sched.requests.values())
    kv = sched.kv
    queues = ([r.request_id for r in sched.running], [r.request_id for r in sched.waiting],
              [r.request_id for r in sched.swapped])
    common = (requests, queues, {rid: list(ids) for rid, ids in kv.block_ids.items()}, sched.step_id, sched.stats,
              sched.num_running_seqs, kv.usage(), kv.prefix_queries, kv.prefix_hits)
    pool = kv.pool
    if pool is None:
        return common
    eviction_order = []
    if full:
        drained = copy.deepcopy(pool)  # the eviction order the policy would follow from here on
        drained.spill = drained.on_register = None
        while drained.num_empty:
            drained.allocate()
        eviction_order = [drained.allocate().block_id for _ in range(len(drained.policy))]
    blocks = [(b.block_id, b.ref_cnt, b.key) for b in pool.blocks]
    cached = sorted((key, b.block_id) for key, b in pool.cached.items())
    duplicates = sorted((key, [b.block_id for b in copies]) for key, copies in pool.duplicates.items())
    empty = pool.empty_order()  # its order decides the next block ids
    tiers = [(t.name, sorted(t.pool.cached), t.stats) for t in kv.tiers]
    return (*common, blocks, cached, duplicates, empty, eviction_order, pool.num_evictions, tiers)


def drive(seed: int, iterations: int, backlog: bool = True, **kwargs) -> int:
    """Three schedulers on the same random arrivals and aborts: `fast` applies every decode stretch the horizon
    allows at once (`backlog` False: only while nothing waits), `plain` steps per request, `bulk` steps with bulk
    decodes. Returns the steps `fast` applied at once."""
    rng = random.Random(seed)
    fast, plain, bulk = (make_scheduler(**kwargs) for _ in range(3))
    fast.decode_mode = bulk.decode_mode = DecodeMode.BULK
    done: dict[str, list] = {"fast": [], "plain": [], "bulk": []}
    counter = fast_steps = 0

    def step(sched: Scheduler, name: str) -> tuple:
        """One cycle; the step's batch and memory operations (read before the update advances them)."""
        out = sched.schedule()
        work = (batch(out), out.copies, out.swap_out, out.swap_in, out.preempted, out.num_batched_tokens,
                out.tier_transfers)
        done[name].extend((out.step_id, r.request_id, r.finish_reason) for r in sched.update(out).finished)
        return work

    for iteration in range(iterations):
        if rng.random() < 0.15 or not fast.has_unfinished():
            for _ in range(rng.randint(1, 3)):
                counter += 1
                prompt = rng.randint(1, 50)
                hashes = [rng.randrange(2)] + [rng.randrange(10**6) for _ in range(prompt // 8)]
                n, max_tokens = rng.choice([1, 1, 1, 2]), rng.randint(1, 70)
                for sched in (fast, plain, bulk):
                    sched.add_request(make_request(f"r{counter}", prompt_len=prompt, max_tokens=max_tokens, n=n,
                                                   prefix_hashes=hashes, hash_granularity=8))
        if rng.random() < 0.02 and fast.requests:
            victim = rng.choice(sorted(fast.requests))
            for sched in (fast, plain, bulk):
                sched.abort(victim)
        k = fast.decode_horizon(rng.randint(1, 50)) if backlog or not len(fast.waiting) else 0
        if k:
            start = fast.step_id
            done["fast"].extend((start + t, r.request_id, r.finish_reason) for t, r in fast.advance_decodes(k))
            fast_steps += k
        for _ in range(max(k, 1)):
            if not k:
                step(fast, "fast")
            assert step(bulk, "bulk") == step(plain, "plain")
        full = iteration % 10 == 9
        assert state(fast, full) == state(plain, full) == state(bulk, full)
        assert done["fast"] == done["plain"] == done["bulk"]
    return fast_steps


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), block_size=st.sampled_from([1, 4, 8]), blocks=st.integers(30, 160),
       policy=st.sampled_from(sorted(EVICTION_POLICIES)), schedule=st.sampled_from(["mixed", "prefill_first"]),
       max_seqs=st.sampled_from([2, 4, 16]), caching=st.booleans(), mode=st.sampled_from(["recompute", "swap"]),
       tier_blocks=st.sampled_from([0, 0, 6]), write_through=st.booleans(), watermark=st.sampled_from([0.0, 0.05]),
       full_isl=st.booleans())
def test_decode_steps_applied_at_once_equal_the_general_loop(seed, block_size, blocks, policy, schedule, max_seqs,
                                                             caching, mode, tier_blocks, write_through, watermark,
                                                             full_isl):
    num_blocks = max(blocks * 4 // block_size, 120 // block_size + 2)  # room for the longest request alone
    # With prefix caching a blocked head is not always blocked until the first completion (see
    # `test_a_backlog_head_with_cached_hits_can_come_in_before_the_first_completion`): stretches then run only
    # while nothing waits.
    fast_steps = drive(seed, 150, backlog=not caching, block_size=block_size, num_blocks=num_blocks, budget=40,
                       max_seqs=max_seqs, eviction_policy=policy, schedule=schedule, enable_prefix_caching=caching,
                       preemption_mode=mode, num_cpu_blocks=200 if mode == "swap" else 0, max_model_len=120,
                       kv_offloading_blocks=tier_blocks if caching else 0,
                       kv_offloading_write_through=write_through, watermark=watermark,
                       scheduler_reserve_full_isl=full_isl)
    event(f"fast-forwarded steps > 0: {fast_steps > 0}")


@given(seed=st.integers(0, 10_000), allocator=st.sampled_from(["max", "pow2", "oracle"]))
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_reservation_caches_step_decodes_at_once_too(seed, allocator):
    drive(seed, 100, block_size=4, num_blocks=200, budget=40, max_seqs=6, allocator=allocator, max_model_len=120,
          enable_prefix_caching=False)


def test_the_workload_exercises_every_path():
    """The driver is not vacuous: a good share of its steps are applied at once."""
    assert drive(5, 300, block_size=4, num_blocks=60, budget=40, max_seqs=6, eviction_policy="lru",
                 max_model_len=120) > 300


def test_a_backlog_head_with_cached_hits_can_come_in_before_the_first_completion():
    """A regression (a gap kept as found, now closed): a preempted head whose 58 cached-free hits plus one token
    exceed the 58 free blocks was judged blocked, while two decode steps later (its hits partly evicted, its chunk
    capped at the budget) step by step admits it. `Admission.head_blocked` no longer counts a head with cached hits
    under the first-chunk gate as blocked."""
    drive(0, 150, backlog=True, block_size=1, num_blocks=122, budget=40, max_seqs=2, eviction_policy="fifo",
          enable_prefix_caching=True, max_model_len=120, preemption_mode="recompute",
          scheduler_reserve_full_isl=False)


@given(requests=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 60), st.integers(0, 3), st.booleans(),
                                   st.booleans()), max_size=40),
       k=st.integers(1, 80), block_size=st.sampled_from([1, 2, 4, 16]))
@settings(max_examples=300, deadline=None)
def test_a_stretch_s_events_sort_by_step_and_place_as_by_the_whole_tuple(requests, k, block_size):
    """`advance()` appends each request's block events (`block_events`) and completion in running order; the int
    sort by (step, phase) and place in the list must give exactly the tuples' sorted order."""
    events = []
    for idx, (pos, remaining, behind, registering, at_boundary) in enumerate(requests):
        n = min(k, remaining)
        held = pos if at_boundary and pos % block_size == 0 else -(-pos // block_size) * block_size
        hashed = max(0, pos // block_size - behind)  # up to `behind` full blocks not keyed yet
        block_events(events, idx, pos, n, held, hashed, block_size, registering)
        if remaining <= k:
            events.append((n - 1, UPDATE, idx, FINISH, 0))
    assert [events[i] for i in _sorted_order(events)] == sorted(events)
