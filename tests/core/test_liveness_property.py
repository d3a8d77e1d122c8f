"""Property: over tiny pools and every combination of the core's knobs, every run drains.

Each example draws a configuration (1-16 blocks of 1, 4 or 16 tokens; chunking on/off; recompute/swap with or
without CPU room; sink+window; prefix caching; paged or a reservation allocator; both schedules; a watermark)
and a handful of requests (n > 1 and beam-search groups included) arriving over the first steps, some aborted.
Beam groups step by a seeded plan once all their beams have computed (`advance_beams`), the run must end with
each request finished or rejected/aborted with a reason, within a step bound derived from its work, never
taking an empty step, with `max_num_seqs` counting sequences, and without leaking a block.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, event, given, settings

from kvplan.engine.core import CacheConfig, RequestStatus, Scheduler, SchedulerConfig, make_request
from kvplan.engine.core.eviction import EVICTION_POLICIES
from kvplan.engine.core.victims import VICTIM_POLICIES
from tests.core.invariants import check_all_free, check_scheduler

SYSTEM_PROMPT = [(5 * j + 1) % 7 for j in range(256)]  # shared prefix material


@st.composite
def configs(draw, pressure: bool = False) -> tuple[CacheConfig, SchedulerConfig]:
    """`pressure`: whole prompts admitted at once, no watermark, room for six sequences - requests then run side
    by side and outgrow the pool, so preemption, swap and recompute happen in most runs."""
    bs = draw(st.sampled_from([1, 4, 16]))
    num_blocks = draw(st.integers(4 if pressure else 1, 16))
    allocator = draw(st.sampled_from(["paged", "paged", "paged", "max", "pow2", "oracle"]))
    paged = allocator == "paged"
    window = sink = 0
    if paged and num_blocks >= 3 and draw(st.booleans()):
        window = draw(st.integers(1, (num_blocks - 2) * bs))
        sink = draw(st.integers(0, min(bs, window)))
        if -(-sink // bs) + -(-window // bs) + 1 > num_blocks:
            sink = 0
    longest = num_blocks * bs if not window else 3 * num_blocks * bs
    mode = draw(st.sampled_from(["recompute", "swap"])) if paged else "recompute"
    cache = CacheConfig(
        block_size=bs, num_blocks=num_blocks, allocator=allocator,
        num_cpu_blocks=draw(st.integers(0, 16)) if mode == "swap" else 0,
        # prefix tiers below the GPU (the CPU tier, a disk tier under it) mixed into every run
        kv_offloading_blocks=draw(st.integers(0, 8)) if paged else 0,
        kv_offloading_eviction=draw(st.sampled_from(sorted(EVICTION_POLICIES))),
        kv_disk_blocks=draw(st.integers(0, 8)) if paged else 0,
        # a shared tier at the bottom (one replica's: the cluster's store), and write-through instead of write-back
        kv_shared_blocks=draw(st.integers(0, 8)) if paged else 0,
        kv_shared_eviction=draw(st.sampled_from(sorted(EVICTION_POLICIES))),
        kv_offloading_write_through=draw(st.booleans()),
        enable_prefix_caching=paged and draw(st.booleans()),
        eviction_policy=draw(st.sampled_from(sorted(EVICTION_POLICIES))),
        max_model_len=longest if window or pressure else draw(st.one_of(st.just(longest), st.integers(1, longest))),
        sink_tokens=sink, window_tokens=window,
        watermark=0.0 if pressure else draw(st.sampled_from([0.0, 0.0, 0.01, 0.3])))
    sched = SchedulerConfig(
        max_num_batched_tokens=(max(1, num_blocks * bs // 2) if pressure
                                else draw(st.one_of(st.integers(1, 48), st.just(longest)))),
        max_num_seqs=6 if pressure else draw(st.integers(1, 6)),
        enable_chunked_prefill=draw(st.booleans()), policy=draw(st.sampled_from(["fcfs", "priority"])),
        preemption_mode=mode, victim_policy=draw(st.sampled_from(sorted(VICTIM_POLICIES))),
        schedule=draw(st.sampled_from(["mixed", "prefill_first"])),
        scheduler_reserve_full_isl=draw(st.booleans()))
    return cache, sched


def request_specs(pressure: bool = False):
    return st.lists(st.tuples(
        st.just(0) if pressure else st.integers(0, 3),  # arrival step
        # prompt + max_tokens as a fraction of max_model_len, the prompt's share of that, the system prompt's
        # share of the prompt
        st.floats(0.3, 0.7) if pressure else st.one_of(st.floats(0.05, 0.6), st.floats(0, 1)),
        st.floats(0.2, 0.8) if pressure else st.floats(0, 1), st.floats(0, 1),
        st.sampled_from([1, 1, 2]) if pressure else st.sampled_from([1, 1, 1, 2, 3]),  # n
        st.integers(0, 2),  # priority
        st.none() if pressure else st.one_of(st.none(), st.integers(1, 12)),  # abort at this step, if still live
        st.sampled_from([False, False, True]),  # beam search (n beams)
    ), min_size=3 if pressure else 2, max_size=8)


def sampled_tokens(out) -> list:
    return [[(item.request.num_output_tokens + j) % 5 for j in range(item.request.n)]
            if item.request.n > 1 and not item.request.forked else item.request.num_output_tokens % 5
            for item in out.scheduled]


SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow,
                                                                          HealthCheck.data_too_large])


@pytest.mark.slow
@settings(max_examples=2000, **SETTINGS)
@given(config=configs(), specs=request_specs())
def test_every_run_drains(config, specs):
    drain(config, specs)


@pytest.mark.slow
@settings(max_examples=600, **SETTINGS)
@given(config=configs(pressure=True), specs=request_specs(pressure=True))
def test_every_run_under_memory_pressure_drains(config, specs):
    drain(config, specs)


def step_beam_groups(sched: Scheduler, step_index: int) -> list:
    """What the engine's beam search does after `update`, with seeded decisions instead of logits: every group
    whose beams have all computed advances (parents drawn, a parent's first child keeping its slot) or, one token
    short of its budget, finishes. Returns the requests that finished."""
    groups: dict[str, list] = {}
    for request in sched.requests.values():
        if request.beam:
            groups.setdefault(request.group, []).append(request)
    finished = []
    for members in groups.values():
        members.sort(key=lambda r: int(r.request_id.partition("#")[2] or 0))
        if not sched.beams_ready(members):
            continue
        head = members[0]
        if head.num_output_tokens + 1 >= head.max_tokens:
            event("beam group finished")
            finished += sched.finish_beams(members, "length").finished
            continue
        width = len(members) if head.forked else head.n
        draws = [((step_index * 7 + i * 3) % len(members), (step_index + i) % 5) for i in range(width)]
        plan: list = [None] * width
        extra = []
        for parent, token in draws:  # a parent's first child keeps its slot, the others take the pruned ones'
            if plan[parent] is None and head.forked:
                plan[parent] = (parent, token)
            else:
                extra.append((parent, token))
        plan = [entry if entry is not None else extra.pop() for entry in plan]
        event("beam step")
        finished += sched.advance_beams(members, plan).finished
    return finished


def drain(config: tuple[CacheConfig, SchedulerConfig], specs: list[tuple]) -> None:
    sched = Scheduler(*config)
    requests, aborts = [], {}
    work = 0
    limit = sched.cache_config.max_model_len
    for i, (_, size, split, shared, n, priority, abort_at, beam) in enumerate(specs):
        total = max(2, round(size * limit))
        prompt_len = max(1, round(split * (total - 1)))
        max_tokens = total - prompt_len
        tokens = SYSTEM_PROMPT[:int(shared * prompt_len)]
        tokens += [10 + i] * (prompt_len - len(tokens))
        requests.append(make_request(f"r{i}", prompt_token_ids=tokens, max_tokens=max_tokens, n=n, beam=beam,
                                     priority=priority, arrival_s=float(i)))
        work += n * (len(tokens) + max_tokens)
        if abort_at is not None:
            aborts.setdefault(abort_at, []).append(f"r{i}")
    arrivals = sorted(range(len(specs)), key=lambda i: specs[i][0])
    bound = 50 + 20 * work
    accepted, ended = set(), {}
    for step_index in range(bound):
        while arrivals and specs[arrivals[0]][0] <= step_index:
            request = requests[arrivals.pop(0)]
            if sched.add_request(request):
                accepted.add(request.request_id)
            else:
                assert request.finish_reason.startswith("rejected: ")
                event(f"rejected: {request.finish_reason.split()[1]}")
        for rid in aborts.get(step_index, []):
            if sched.abort(rid):
                ended[rid] = "abort"
        if not sched.has_unfinished() and not arrivals:
            break
        out = sched.schedule()
        assert out.scheduled or out.preempted or not sched.has_unfinished(), "an empty step"
        check_scheduler(sched, mid_step=True)
        if out.preempted:
            event("preempted")
        if out.swap_in:
            event("swapped in")
        result = sched.update(out, sampled_tokens(out))
        finished = [*result.finished, *step_beam_groups(sched, step_index)]
        for request in finished:
            ended[request.request_id] = request.finish_reason
            assert request.num_output_tokens == request.max_tokens - request.beam  # a beam ends with its last step
        check_scheduler(sched)
    else:
        raise AssertionError(f"not drained within {bound} steps")
    parents = {rid.split("#")[0] for rid in ended}
    assert accepted <= parents, f"accepted but never ended: {sorted(accepted - parents)}"
    for request in requests:
        if request.request_id in accepted and ended.get(request.request_id) != "abort":
            assert request.status is RequestStatus.FINISHED
            forks = request.n if not request.beam or request.max_tokens > 1 else 1  # a 1-token beam never forks
            assert all(f"{request.request_id}#{j}" in ended for j in range(1, forks))
    check_all_free(sched)
