"""Bulk-scheduled decodes leave exactly the state, and describe exactly the batch, of the general loop."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvplan.engine.core import CacheConfig, Request, Scheduler, SchedulerConfig, make_request
from kvplan.engine.core.decode_steps import DecodeMode
from kvplan.engine.core.eviction import EVICTION_POLICIES
from kvplan.engine.core.victims import VICTIM_POLICIES
from kvplan.sim.cost.step_sums import decode_sums
from tests.core.helpers import make_scheduler
from tests.core.test_fast_forward import add_random_requests, snapshot


def batch(out) -> list[tuple]:
    """The step's work in running order: (request id, tokens, first position, samples, decode)."""
    return [(e.request_id, 1, e.num_computed_tokens, True, True) if isinstance(e, Request)
            else (e.request_id, e.num_new_tokens, e.start_pos, e.samples, e.is_decode) for e in out.in_running_order()]


def drive(seed: int, steps: int, **kwargs) -> tuple[int, int, int]:
    """Run a bulk and a general scheduler side by side on the same random arrivals and aborts; returns how many
    decodes went through the bulk path, how many of them behind a scheduled item (`schedule_inline`), and how
    many the last update had found quiet (`DecodeSteps.update`: their checks skipped)."""
    rng = random.Random(seed)
    bulk, general = make_scheduler(**kwargs), make_scheduler(**kwargs)
    bulk.decode_mode = DecodeMode.BULK
    counter = bulked = behind = quiet = 0
    for step in range(steps):
        if rng.random() < 0.25 or not bulk.has_unfinished():
            counter = add_random_requests(rng, (bulk, general), counter, shared_roots=2)
        if rng.random() < 0.03 and bulk.requests:
            victim = rng.choice(sorted(bulk.requests))
            bulk.abort(victim)
            general.abort(victim)
        noted = bulk.decode_steps
        if noted.quiet_step == bulk.step_id:  # noted for this step (an abort above may still void it)
            quiet += noted.quiet_count - len(noted.quiet_marks)
        a, b = bulk.schedule(), general.schedule()
        assert batch(a) == batch(b)
        assert (a.copies, a.swap_out, a.swap_in, a.preempted, a.num_batched_tokens) == (
            b.copies, b.swap_out, b.swap_in, b.preempted, b.num_batched_tokens)
        # the bulk's sums, taken as it was scheduled (None: no bulk, or a victim left it)
        if a.decode_sums is not None:
            assert a.decode_sums == decode_sums(a.decodes, bulk.block_size)
        else:
            assert not a.decodes or a.preempted
        bulked += len(a.decodes)
        behind += len(a.decodes) - (a.scheduled[0].decodes_before if a.scheduled else len(a.decodes))
        ua, ub = bulk.update(a), general.update(b)
        assert [r.request_id for r in ua.finished] == [r.request_id for r in ub.finished]
        assert [r.request_id for r in ua.forked] == [r.request_id for r in ub.forked]
        full = step % 40 == 39
        assert snapshot(bulk, full) == snapshot(general, full)
        assert bulk.stats == general.stats
    return bulked, behind, quiet


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), block_size=st.sampled_from([1, 4, 16]), blocks=st.integers(40, 300),
       policy=st.sampled_from(sorted(EVICTION_POLICIES)), mode=st.sampled_from(["recompute", "swap"]),
       schedule=st.sampled_from(["mixed", "prefill_first"]), victim=st.sampled_from(sorted(VICTIM_POLICIES)),
       queue=st.sampled_from(["fcfs", "priority"]), max_seqs=st.sampled_from([3, 8, 64]))
# A victim that empties the leading run, then decodes joining from behind: their places no longer line up with
# `running` (found by this test: `update` dropped a live request as finished)
@example(seed=603, block_size=4, blocks=177, policy="fifo", mode="recompute", schedule="mixed",
         victim="longest_remaining", queue="fcfs", max_seqs=64)
def test_bulk_decodes_equal_the_general_loop(seed, block_size, blocks, policy, mode, schedule, victim, queue,
                                             max_seqs):
    num_blocks = max(blocks * 4 // block_size, 160 // block_size + 2)
    drive(seed, 150, block_size=block_size, num_blocks=num_blocks, budget=48, max_seqs=max_seqs,
          eviction_policy=policy, preemption_mode=mode, num_cpu_blocks=400, schedule=schedule, victim_policy=victim,
          policy=queue, max_model_len=160)


def test_bulk_path_carries_most_decodes_under_load_and_memory_pressure():
    bulked, behind, quiet = drive(3, 400, block_size=4, num_blocks=70, budget=64, max_seqs=12,
                                  preemption_mode="recompute", max_model_len=160)
    assert bulked > 500
    assert behind > 10  # (at 4 tokens a block, half of the decode steps open or fill one)
    assert quiet > 100  # decodes off a block's edge, taken by their sums


def test_quiet_decodes_are_most_of_a_long_run_with_large_blocks():
    bulked, _, quiet = drive(7, 300, block_size=16, num_blocks=400, budget=64, max_seqs=32, max_model_len=160)
    assert quiet > bulked // 2


def test_plain_decodes_behind_a_prompt_in_chunks_go_in_bulk_in_their_place():
    """Decodes admitted behind a long prompt still in its chunks: those whose step touches no block join the bulk
    (`schedule_inline`), and update in running order; those that fill a block stay in the general loop."""
    sched = Scheduler(CacheConfig(block_size=4, num_blocks=64, watermark=0.0, max_model_len=64,
                                  enable_prefix_caching=True),
                      SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=16, long_prefill_token_threshold=8))
    sched.decode_mode = DecodeMode.BULK
    for rid, prompt, max_tokens in (("p", 40, 10), ("a", 2, 10), ("b", 2, 2)):
        sched.add_request(make_request(rid, prompt_len=prompt, max_tokens=max_tokens))
    sched.update(sched.schedule())  # p's first chunk of 8 (the threshold); a and b prefilled
    out = sched.schedule()
    assert [r.request_id for r in out.decodes] == ["a", "b"]
    assert [(i.request_id, i.num_new_tokens, i.decodes_before) for i in out.scheduled] == [("p", 8, 0)]
    assert batch(out) == [("p", 8, 8, False, False), ("a", 1, 2, True, True), ("b", 1, 2, True, True)]
    assert out.decode_sums == (4, 0, 2)
    result = sched.update(out)
    assert [r.request_id for r in result.finished] == ["b"]  # its budget of 2 tokens
    assert [(r.request_id, r.num_computed_tokens) for r in sched.running] == [("p", 16), ("a", 3)]
    out = sched.schedule()  # a's token fills its first block, keyed when scheduled: the general loop's
    assert out.decodes == [] and [i.request_id for i in out.scheduled] == ["p", "a"]


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


def test_forked_decodes_behind_a_prompt_in_chunks_copy_on_write_in_the_general_loop():
    """Siblings share the partial block their prompt ends in: the first to write it copies it (copy-on-write), so a
    forked decode never joins the bulk behind the leading run, even off a block boundary."""
    sched = Scheduler(CacheConfig(block_size=4, num_blocks=64, watermark=0.0, max_model_len=64),
                      SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=16, long_prefill_token_threshold=8))
    sched.decode_mode = DecodeMode.BULK
    sched.add_request(make_request("p", prompt_len=40, max_tokens=10))
    sched.add_request(make_request("f", prompt_len=2, max_tokens=10, n=2))
    result = sched.update(sched.schedule())  # p's first chunk; f's prompt, then its two samples
    assert len(result.forked) == 1
    out = sched.schedule()
    assert out.decodes == [] and len(out.scheduled) == 3
    assert len(out.copies) == 1  # the first sibling to write the shared block copies it


def test_bulk_decodes_behind_an_item_finish_after_it():
    """Running order holds in `update()` too: a prompt whose last chunk ends its budget finishes (and frees its
    blocks) before the bulk decode behind it that finishes in the same step."""
    sched = Scheduler(CacheConfig(block_size=4, num_blocks=64, watermark=0.0, max_model_len=64),
                      SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=16, long_prefill_token_threshold=8))
    sched.decode_mode = DecodeMode.BULK
    sched.add_request(make_request("p", prompt_len=16, max_tokens=1))
    sched.add_request(make_request("a", prompt_len=2, max_tokens=2))
    sched.update(sched.schedule())  # p's first chunk, a's prompt
    out = sched.schedule()
    assert [r.request_id for r in out.decodes] == ["a"] and out.scheduled[0].decodes_before == 0
    assert [r.request_id for r in sched.update(out).finished] == ["p", "a"]
