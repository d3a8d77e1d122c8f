"""A compiled build of the core (scripts/build_compiled_core.sh, mypyc) runs exactly as the pure-Python core, which
stays the executable specification: the same seeded random traces (arrivals, aborts, n > 1 groups, prefix hashes,
decode stretches applied at once) drive a pure scheduler here and a compiled one in a subprocess whose PYTHONPATH
puts the build first (tests/compiled_sides.py), and every step's output and the state it leaves must be equal.

The build is named by KVPLAN_COMPILED_CORE (the OUT directory of the build script); without it the test skips.
One subprocess serves every hypothesis example (one JSON line in, one out).
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.compiled_sides import compiled_side, serve

POLICIES = ("lru", "fifo", "lfu", "s3fifo")


def transcript(params: dict) -> list:
    """Drive one scheduler with the seeded random trace `params` describes; every step's work, completions and the
    state it leaves, as plain data (JSON-comparable: `repr` for the core's own value classes)."""
    from kvplan.engine.core import CacheConfig, Scheduler, SchedulerConfig, make_request
    from kvplan.engine.core.decode_steps import DecodeMode

    paged = params["allocator"] == "paged"
    cache = CacheConfig(block_size=params["block_size"], num_blocks=params["num_blocks"], watermark=params["watermark"],
                        max_model_len=120, eviction_policy=params["policy"], allocator=params["allocator"],
                        enable_prefix_caching=params["caching"] and paged,
                        num_cpu_blocks=200 if params["mode"] == "swap" and paged else 0,
                        kv_offloading_blocks=params["tier_blocks"] if params["caching"] and paged else 0)
    sched = Scheduler(cache, SchedulerConfig(max_num_batched_tokens=params["budget"], max_num_seqs=params["max_seqs"],
                                             schedule=params["schedule"], preemption_mode=params["mode"]))
    if params["bulk"]:
        sched.decode_mode = DecodeMode.BULK
    rng = random.Random(params["seed"])
    log: list = []
    counter = 0
    for _ in range(params["iterations"]):
        if rng.random() < 0.15 or not sched.has_unfinished():
            for _ in range(rng.randint(1, 3)):
                counter += 1
                prompt = rng.randint(1, 50)
                hashes = [rng.randrange(2)] + [rng.randrange(10**6) for _ in range(prompt // 8)]
                added = sched.add_request(make_request(
                    f"r{counter}", prompt_len=prompt, max_tokens=rng.randint(1, 70), n=rng.choice([1, 1, 1, 2]),
                    prefix_hashes=hashes, hash_granularity=8, arrival_s=rng.random(), priority=rng.randint(0, 2)))
                log.append(("add", counter, added))
        if rng.random() < 0.02 and sched.requests:
            log.append(("abort", sched.abort(rng.choice(sorted(sched.requests)))))
        k = sched.decode_horizon(rng.randint(1, 30)) if params["stretches"] else 0
        if k:
            log.append(("advance", k, [(t, r.request_id, r.finish_reason) for t, r in sched.advance_decodes(k)]))
        else:
            out = sched.schedule()
            work = (out.step_id, [(r.request_id, r.num_computed_tokens) for r in out.decodes],
                    [(i.request_id, i.num_new_tokens, i.start_pos, i.num_cached_tokens, list(i.block_ids),
                      i.samples, i.is_decode, i.copies) for i in out.scheduled],
                    out.num_batched_tokens, out.copies, out.swap_out, out.swap_in, repr(out.tier_transfers),
                    out.promotions, out.preempted, out.rejected)
            update = sched.update(out)
            log.append(("step", work, [(r.request_id, r.finish_reason) for r in update.finished],
                        [r.request_id for r in update.forked], update.released))
        kv = sched.kv
        pool = kv.pool
        log.append(("state", sorted((r.request_id, repr(r.status), r.num_computed_tokens, r.num_output_tokens,
                                     r.num_preemptions, r.num_cached_tokens) for r in sched.requests.values()),
                    [r.request_id for r in sched.running], [r.request_id for r in sched.waiting],
                    [r.request_id for r in sched.swapped], {rid: list(ids) for rid, ids in kv.block_ids.items()},
                    repr(sched.stats), kv.usage(), None if pool is None else pool.empty_order(),
                    None if pool is None else sorted((key, b.block_id) for key, b in pool.cached.items())))
    return log


@pytest.fixture(scope="module")
def compiled():
    """The subprocess running the compiled core (tests/compiled_sides.py)."""
    yield from compiled_side("tests.core.test_compiled_core")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), block_size=st.sampled_from([1, 4, 8]), blocks=st.integers(30, 160),
       policy=st.sampled_from(POLICIES), schedule=st.sampled_from(["mixed", "prefill_first"]),
       max_seqs=st.sampled_from([2, 4, 16]), budget=st.sampled_from([16, 40, 64]), caching=st.booleans(),
       mode=st.sampled_from(["recompute", "swap"]), tier_blocks=st.sampled_from([0, 6]),
       watermark=st.sampled_from([0.0, 0.05]), bulk=st.booleans(), stretches=st.booleans(),
       allocator=st.sampled_from(["paged", "paged", "paged", "max", "pow2", "oracle"]))
def test_the_compiled_core_steps_exactly_as_the_pure_core(compiled, seed, block_size, blocks, policy, schedule,
                                                          max_seqs, budget, caching, mode, tier_blocks, watermark,
                                                          bulk, stretches, allocator):
    params = dict(seed=seed, block_size=block_size, num_blocks=max(blocks * 4 // block_size, 120 // block_size + 2),
                  policy=policy, schedule=schedule, max_seqs=max_seqs, budget=budget, caching=caching, mode=mode,
                  tier_blocks=tier_blocks, watermark=watermark, bulk=bulk, stretches=stretches, allocator=allocator,
                  iterations=120)
    expected = json.loads(json.dumps(transcript(params)))  # as JSON carries it: tuples as lists, floats by repr
    got = json.loads(compiled(json.dumps(params)))
    assert len(got) == len(expected)
    for index, (mine, theirs) in enumerate(zip(expected, got, strict=True)):
        assert theirs == mine, f"entry {index} differs for {params}"


if __name__ == "__main__":
    serve(lambda line: json.dumps(transcript(json.loads(line))),
          ("kvplan.engine.core.scheduler", "kvplan.engine.core.decode_steps", "kvplan.engine.core.kv_manager",
           "kvplan.engine.core.block_pool"))
