"""Private blocks (`block_pool`): a request's own run of keys, entered in the prefix cache only when the request is
preempted, changes nothing anyone sees. The reference is the same scheduler with every key entered when it is
registered (each request's `private_from` set to PUBLIC): on the same random arrivals, aborts, forks and
preemptions under a small pool, both make the same batches, memory operations, block tables, evictions and prefix
hits, and each lookup a waiting or swapped request can make finds the same block."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvplan.engine.core import Scheduler, make_request
from kvplan.engine.core.block_keys import PUBLIC
from kvplan.engine.core.decode_steps import DecodeMode
from kvplan.engine.core.eviction import EVICTION_POLICIES
from kvplan.engine.core.victims import VICTIM_POLICIES
from tests.core.helpers import make_scheduler
from tests.core.test_bulk_decode import batch


def seen(sched: Scheduler) -> tuple:
    """What the scheduler's users can observe, and the lookups its waiting and swapped requests can make."""
    pool, kv = sched.kv.pool, sched.kv
    assert pool is not None
    lookups = []
    for request in [*sched.waiting, *sched.swapped]:
        if request.block_keys is not None:
            full = (request.num_tokens - 1) // pool.block_size  # every block a lookup may cover
            if full:
                request.block_keys.key(full - 1)  # (computed here if its lookups have not)
            found = [pool.cached.get(key) for key in request.block_keys.keys[:full]]
            lookups.append((request.request_id, [None if b is None else b.block_id for b in found]))
    requests = sorted((r.request_id, r.status, r.num_computed_tokens, r.num_output_tokens, r.num_hashed_blocks,
                       r.num_preemptions, r.num_cached_tokens) for r in sched.requests.values())
    # A private block's key, a placeholder, is the one at its place in its request's keys: a running request's
    # (the blocks a finished request left keep only the placeholder; nobody can ask for them)
    owned = {}
    for request in sched.running:
        table = kv.tables[request.request_id]
        if request.block_keys is not None and table:
            request.block_keys.key(len(table) - 1)
            owned.update({id(b): request.block_keys.keys[i] for i, b in enumerate(table) if b is not None})
    blocks = [(b.block_id, b.ref_cnt, owned.get(id(b)) if b.private else b.key, b.private) for b in pool.blocks]
    return (requests, {rid: list(ids) for rid, ids in kv.block_ids.items()}, pool.empty_order(),
            pool.num_evictions, len(pool.policy), kv.prefix_queries, kv.prefix_hits, lookups), blocks


def same_blocks(private: list[tuple], reference: list[tuple]) -> None:
    """Every block has the same id, references and key - a private one's the key at its place in its running
    request's keys, or any key where a finished request left it (a placeholder nobody can ask for)."""
    for (block_id, refs, key, is_private), (ref_id, ref_refs, ref_key, ref_private) in zip(private, reference,
                                                                                             strict=True):
        assert (block_id, refs) == (ref_id, ref_refs) and not ref_private
        if is_private and key is None:
            assert ref_key is not None and refs == 0
        else:
            assert key == ref_key


def drive(seed: int, steps: int, **kwargs) -> int:
    """Both schedulers on one random workload; returns how many blocks were still private at the end of a step,
    summed over the steps (the mechanism is exercised)."""
    rng = random.Random(seed)
    private, reference = make_scheduler(**kwargs), make_scheduler(**kwargs)
    if rng.random() < 0.5:
        private.decode_mode = reference.decode_mode = DecodeMode.BULK
    counter = held_private = 0
    for _ in range(steps):
        if rng.random() < 0.3 or not private.has_unfinished():
            for _ in range(rng.randint(1, 3)):
                counter += 1
                prompt = rng.randint(1, 60)
                # a shared first group (hits across requests) or none at all (every block the request's own run)
                hashes = [rng.randrange(3)] + [rng.randrange(10**6) for _ in range(prompt // 8)] \
                    if rng.random() < 0.5 else []
                n, max_tokens = rng.choice([1, 1, 1, 1, 2]), rng.randint(1, 60)
                for sched in (private, reference):
                    request = make_request(f"r{counter}", prompt_len=prompt, max_tokens=max_tokens, n=n,
                                           prefix_hashes=hashes, hash_granularity=8)
                    sched.add_request(request)
                    if sched is reference:
                        request.private_from = PUBLIC
        if rng.random() < 0.02 and private.requests:
            victim = rng.choice(sorted(private.requests))
            for sched in (private, reference):
                sched.abort(victim)
        outs = []
        for sched in (private, reference):
            out = sched.schedule()
            outs.append((batch(out), out.copies, out.swap_out, out.swap_in, out.preempted, out.num_batched_tokens))
            finished = sched.update(out, [[1] * item.request.n if item.request.n > 1 and not item.request.forked
                                          else 1 for item in out.scheduled]).finished
            outs.append([r.request_id for r in finished])
        assert outs[0] == outs[2] and outs[1] == outs[3]
        (seen_private, blocks_private), (seen_reference, blocks_reference) = seen(private), seen(reference)
        assert seen_private == seen_reference
        same_blocks(blocks_private, blocks_reference)
        assert private.kv.pool is not None and reference.kv.pool is not None
        assert not any(b.private for b in reference.kv.pool.blocks)
        held_private += sum(b.private for b in private.kv.pool.blocks)
    return held_private


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), block_size=st.sampled_from([1, 4, 8]), num_blocks=st.integers(20, 60),
       policy=st.sampled_from(sorted(EVICTION_POLICIES)), mode=st.sampled_from(["recompute", "swap"]),
       victim=st.sampled_from(sorted(VICTIM_POLICIES)))
def test_private_blocks_change_nothing_anyone_sees(seed, block_size, num_blocks, policy, mode, victim):
    num_blocks = max(num_blocks * 4 // block_size, 120 // block_size + 2)  # room for the longest request alone
    drive(seed, 120, block_size=block_size, num_blocks=num_blocks, budget=32, max_seqs=8, eviction_policy=policy,
          preemption_mode=mode, victim_policy=victim, num_cpu_blocks=200 if mode == "swap" else 0, max_model_len=120,
          enable_prefix_caching=True)


def test_the_workload_keeps_blocks_private_and_preempts():
    """Not vacuous: blocks stay private across steps, and requests are preempted and come back."""
    assert drive(3, 300, block_size=4, num_blocks=40, budget=32, max_seqs=8, max_model_len=120) > 1000
