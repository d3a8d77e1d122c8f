"""Bulk-scheduled decodes leave exactly the state, and describe exactly the batch, of the general loop."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvplan.engine.core import make_request
from kvplan.engine.core.decode_steps import DecodeMode
from kvplan.engine.core.eviction import EVICTION_POLICIES
from tests.core.helpers import make_scheduler
from tests.core.test_fast_forward import add_random_requests, snapshot


def batch(out) -> list[tuple]:
    """The step's work in running order: (request id, tokens, first position, samples, decode)."""
    bulk = [(r.request_id, 1, r.num_computed_tokens, True, True) for r in out.decodes]
    return bulk + [(i.request_id, i.num_new_tokens, i.start_pos, i.samples, i.is_decode) for i in out.scheduled]


def drive(seed: int, steps: int, **kwargs) -> int:
    """Run a bulk and a general scheduler side by side on the same random arrivals and aborts; returns how many
    decodes went through the bulk path."""
    rng = random.Random(seed)
    bulk, general = make_scheduler(**kwargs), make_scheduler(**kwargs)
    bulk.decode_mode = DecodeMode.BULK
    counter = bulked = 0
    for step in range(steps):
        if rng.random() < 0.25 or not bulk.has_unfinished():
            counter = add_random_requests(rng, (bulk, general), counter, shared_roots=2)
        if rng.random() < 0.03 and bulk.requests:
            victim = rng.choice(sorted(bulk.requests))
            bulk.abort(victim)
            general.abort(victim)
        a, b = bulk.schedule(), general.schedule()
        assert batch(a) == batch(b)
        assert (a.copies, a.swap_out, a.swap_in, a.preempted, a.num_batched_tokens) == (
            b.copies, b.swap_out, b.swap_in, b.preempted, b.num_batched_tokens)
        bulked += len(a.decodes)
        ua, ub = bulk.update(a), general.update(b)
        assert [r.request_id for r in ua.finished] == [r.request_id for r in ub.finished]
        assert [r.request_id for r in ua.forked] == [r.request_id for r in ub.forked]
        full = step % 40 == 39
        assert snapshot(bulk, full) == snapshot(general, full)
        assert bulk.stats == general.stats
    return bulked


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), block_size=st.sampled_from([1, 4, 16]), blocks=st.integers(40, 300),
       policy=st.sampled_from(sorted(EVICTION_POLICIES)), mode=st.sampled_from(["recompute", "swap"]),
       schedule=st.sampled_from(["mixed", "prefill_first"]), victim=st.sampled_from(["newest", "longest_remaining"]),
       queue=st.sampled_from(["fcfs", "priority"]), max_seqs=st.sampled_from([3, 8, 64]))
def test_bulk_decodes_equal_the_general_loop(seed, block_size, blocks, policy, mode, schedule, victim, queue,
                                             max_seqs):
    num_blocks = max(blocks * 4 // block_size, 160 // block_size + 2)
    drive(seed, 150, block_size=block_size, num_blocks=num_blocks, budget=48, max_seqs=max_seqs,
          eviction_policy=policy, preemption_mode=mode, num_cpu_blocks=400, schedule=schedule, victim_policy=victim,
          policy=queue, max_model_len=160)


def test_bulk_path_carries_most_decodes_under_load_and_memory_pressure():
    bulked = drive(3, 400, block_size=4, num_blocks=70, budget=64, max_seqs=12, preemption_mode="recompute",
                   max_model_len=160)
    assert bulked > 500


def test_only_the_leading_plain_decodes_go_in_bulk():
    sched = make_scheduler(block_size=4, num_blocks=64, budget=64, max_model_len=64)
    sched.decode_mode = DecodeMode.BULK
    sched.add_request(make_request("a", prompt_len=3, max_tokens=10))
    sched.add_request(make_request("b", prompt_len=3, max_tokens=10))
    sched.update(sched.schedule())  # both prefilled
    sched.add_request(make_request("c", prompt_len=30, max_tokens=10))
    out = sched.schedule()  # a and b decode in bulk, c's prompt goes through the general loop
    assert [r.request_id for r in out.decodes] == ["a", "b"]
    assert [(i.request_id, i.num_new_tokens) for i in out.scheduled] == [("c", 30)]
    assert out.num_batched_tokens == 32
    sched.update(out)
    assert [r.num_output_tokens for r in sched.running] == [2, 2, 1]


def test_a_victim_among_the_bulk_decodes_leaves_their_batch(monkeypatch):
    """`longest_remaining` can pick a victim the bulk scheduled earlier in the step (vLLM's FCFS victim never is
    one): it leaves `out.decodes`, its token refunded and its registration undone, and the step stays the general
    loop's (`drive` compares them at every step)."""
    from kvplan.engine.core.preemption import GroupPreemption

    bulk_victims = []
    unschedule = GroupPreemption._unschedule

    def recording(self, request, out, undone):
        if any(decode is request for decode in out.decodes):
            bulk_victims.append(request.request_id)
        return unschedule(self, request, out, undone)

    monkeypatch.setattr(GroupPreemption, "_unschedule", recording)
    drive(0, 150, block_size=4, num_blocks=40, budget=48, max_seqs=8, preemption_mode="recompute",
          victim_policy="longest_remaining", max_model_len=160)
    assert bulk_victims
