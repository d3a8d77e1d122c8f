"""Steady-state workloads and probes: a sustained workload is stationary at its rate, copies sessions with their
shared prefixes shared and their private ones fresh, and scales with the rate (common random numbers); a
probe's window, closed loop and overload stop give exactly the results of stepping one step at a time; goodput
counts the requests meeting every bound."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pandas as pd
import pytest

from kvplan.results.goodput import goodput_count
from kvplan.sim.probe import Probe, run_probe
from kvplan.sim.spec import SimSpec
from kvplan.traces import Trace
from kvplan.traces.schema import NO_VALUE
from kvplan.traces.steady import hash_ids_name_prefixes, open_loop, population
from tests.sim.helpers import random_trace


def sessions_trace() -> Trace:
    """Three sessions of 3, 2 and 1 turns (turns re-send the earlier turns' blocks) sharing a system prompt
    (ids 0-1), plus two requests without a session; hash granularity 16."""
    system = [0, 1]
    rows = [  # (arrival, session, turn, private ids)
        (0.0, 7, 1, [10]), (5.0, 7, 2, [10, 11]), (9.0, 7, 3, [10, 11, 12]),
        (1.0, 8, 1, [20]), (4.0, 8, 2, [20, 21]),
        (2.0, 9, 1, [30]),
        (3.0, NO_VALUE, NO_VALUE, [40]), (6.0, NO_VALUE, NO_VALUE, [41]),
    ]
    rows.sort()
    hashes = [system + own for _, _, _, own in rows]
    offsets = np.cumsum([0] + [len(h) for h in hashes])
    return Trace.build([r[0] for r in rows], [16 * len(h) + 3 for h in hashes], [5] * len(rows),
                       session_id=[r[1] for r in rows], turn=[r[2] for r in rows],
                       hash_ids=np.concatenate(hashes), hash_offsets=offsets, hash_granularity=16)


def test_population_groups_sessions_and_marks_private_ids():
    pop = population(sessions_trace())
    assert pop.sessions == 5 and pop.requests_per_session == pytest.approx(8 / 5)
    trace = pop.trace
    for s in range(pop.sessions):  # turns in order, delays after the session's first request
        rows = pop.order[pop.offsets[s]:pop.offsets[s + 1]]
        assert np.all(np.diff(trace.arrival_s[rows]) >= 0)
        assert pop.delays[pop.offsets[s]] == 0
    shared = trace.hash_ids[~pop.private]
    assert set(shared.tolist()) == {0, 1}  # the system prompt; a session's own turns share only within it
    assert set(trace.hash_ids[pop.private].tolist()) == {10, 11, 12, 20, 21, 30, 40, 41}


def test_open_loop_copies_sessions_with_fresh_private_ids():
    pop = population(sessions_trace())
    out = open_loop(pop, 4.0, 200.0, seed=3)
    assert np.all(np.diff(out.arrival_s) >= 0) and out.arrival_s[0] >= 0 and out.arrival_s[-1] < 200
    for copy in np.unique(out.session_id)[:50]:
        rows = np.flatnonzero(out.session_id == copy)
        ids = [set(out.hashes_of(r).tolist()) for r in rows]
        assert all({0, 1} <= i for i in ids)  # the shared system prompt stays shared
        own = set().union(*ids) - {0, 1}
        copy_of_hash = np.repeat(out.session_id, out.hash_counts())
        others = set(out.hash_ids[copy_of_hash != copy].tolist())
        assert not own & others  # a copy's conversation is its own
        for earlier, later in itertools.pairwise(ids):  # ... and its turns still share their history
            assert earlier <= later


def test_open_loop_is_stationary_at_its_rate_and_scales_with_it():
    pop = population(random_trace(5, 300, rate=3.0))
    for rate in (2.0, 20.0):
        out = open_loop(pop, rate, 600.0, seed=1)
        counts = np.histogram(out.arrival_s, bins=6, range=(0, 600))[0] / 100.0
        assert len(out) / 600 == pytest.approx(rate, rel=0.15)
        assert counts.min() > 0.6 * rate and counts.max() < 1.5 * rate
    slow, fast = open_loop(pop, 2.0, 600.0, seed=1), open_loop(pop, 4.0, 300.0, seed=1)
    n = min(len(slow), len(fast))
    np.testing.assert_allclose(fast.arrival_s[:n] * 2, slow.arrival_s[:n], rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(fast.prompt_tokens[:n], slow.prompt_tokens[:n])  # the same sessions, in order
    again = open_loop(pop, 2.0, 600.0, seed=1)
    np.testing.assert_array_equal(again.arrival_s, slow.arrival_s)
    assert not np.array_equal(open_loop(pop, 2.0, 600.0, seed=2).arrival_s, slow.arrival_s)


@pytest.mark.parametrize("arrivals", ["measured", "poisson", "tiled"])
def test_every_arrival_process_keeps_the_rate(arrivals):
    pop = population(random_trace(6, 200, rate=5.0))
    out = open_loop(pop, 8.0, 400.0, seed=0, arrivals=arrivals)
    assert len(out) / 400 == pytest.approx(8.0, rel=0.2)


PROBES = [
    (Probe(rate=12.0, duration_s=60, min_requests=10), SimSpec(num_blocks=400, block_size=16)),
    pytest.param(Probe(rate=40.0, duration_s=60, min_requests=10), SimSpec(num_blocks=150, block_size=8, replicas=2,
                                                                         router="least_outstanding"),
                 marks=pytest.mark.slow),
    (Probe(mode="concurrency", concurrency=6, duration_s=60, min_requests=10),
     SimSpec(num_blocks=300, block_size=16)),
    (Probe(mode="concurrency", concurrency=9, think_s=0.5, duration_s=60, min_requests=10),
     SimSpec(num_blocks=200, block_size=8, replicas=3, router="round_robin")),
    (Probe(mode="concurrency", concurrency=5, duration_s=60, min_requests=10),
     SimSpec(num_blocks=200, block_size=16, replicas=2, router="prefix_aware")),
]


@pytest.mark.parametrize(("probe", "spec"), PROBES, ids=["open", "open-2", "closed", "closed-think-3", "closed-pa"])
def test_probes_equal_stepping_one_step_at_a_time(probe, spec):
    """The window's gaps, the counter marks, the closed loop's sends and the overload check see the same state
    on the fast path as step by step."""
    pop = population(random_trace(8, 80, rate=10.0, output=(1, 120)))
    fast = run_probe(pop, spec, probe, seed=4)
    slow = run_probe(pop, dataclasses.replace(spec, fast_path=False), probe, seed=4)
    assert fast.info["fast_steps"] > 0 and slow.info["fast_steps"] == 0
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.series, slow.series, check_exact=True)
    assert fast.summary == slow.summary
    assert fast.info["probe"] == slow.info["probe"]


def test_a_closed_loop_user_waits_for_each_answer():
    pop = population(random_trace(9, 60, rate=10.0))
    result = run_probe(pop, SimSpec(num_blocks=400), Probe(mode="concurrency", concurrency=4, think_s=0.25,
                                                           duration_s=60, min_requests=10), seed=0)
    table = result.requests.sort_values("arrival_s")
    in_flight = [((table["arrival_s"] <= t) & (table["finish_s"] > t)).sum() for t in table["arrival_s"]]
    assert max(in_flight) <= 4  # never more requests in the system than users
    finishes = np.sort(table["finish_s"].to_numpy())
    for arrival in table["arrival_s"].to_numpy()[4:]:  # after the first round, each send follows a finish
        assert np.any(np.isclose(finishes + 0.25, arrival))


def test_goodput_counts_requests_meeting_every_bound():
    table = pd.DataFrame({"request": [0, 1, 1, 2, 3], "sample": [0, 0, 1, 0, 0],
                          "ttft_ms": [100, 100, 100, 900, np.nan], "tpot_ms": [10, 10, 60, 10, 10],
                          "itl_max_ms": [20] * 5, "e2el_ms": [500] * 5})
    assert goodput_count(table, {"ttft_ms": 500, "tpot_ms": 50}) == 1  # request 1's second sample is too slow
    assert goodput_count(table, {"ttft_ms": 1000}) == 3  # NaN (no first token) never meets
    assert goodput_count(table, {"e2el_ms": 100}) == 0
    assert goodput_count(table, {"itl_ms": 10}) == 0 and goodput_count(table, {"itl_ms": 20}) == 4


def test_a_one_token_request_meets_the_gap_bounds_as_vllm_counts_it():
    """vLLM's goodput takes a one-token output's TPOT as 0: it has no gap to be slow. A missing TTFT still fails,
    and so does a missing TPOT of a longer sequence (it never produced its second token)."""
    table = pd.DataFrame({"request": [0, 1, 2, 3], "sample": [0] * 4, "output_tokens": [1, 1, 5, 1],
                          "ttft_ms": [100, 100, 100, np.nan], "tpot_ms": [np.nan, np.nan, np.nan, np.nan],
                          "itl_max_ms": [np.nan] * 4, "e2el_ms": [100, 100, 500, np.nan]})
    assert goodput_count(table, {"ttft_ms": 500, "tpot_ms": 50}) == 2
    assert goodput_count(table, {"itl_ms": 10}) == 2 and goodput_count(table, {"tpot_ms": 0}) == 2
    assert goodput_count(table, {"e2el_ms": 200}) == 2


def test_every_per_request_bound_reads_a_column_of_the_per_request_table():
    result = run_probe(population(random_trace(2, 40)), SimSpec(num_blocks=300),
                       Probe(rate=5.0, duration_s=30, min_requests=10,
                             goodput={"ttft_ms": 1e6, "tpot_ms": 1e6, "itl_ms": 1e6, "e2el_ms": 1e6}), seed=0)
    measured = result.requests[result.requests["phase"] == "measured"]
    assert result.summary["request_goodput"] == pytest.approx(measured["request"].nunique() / 24.0)


def test_hash_ids_name_their_prefixes_only_where_each_id_follows_one_id():
    """An id names its prefix where every occurrence follows the same id, or starts its request every time: the
    sessions' turns and the random traces do; an id after two different ids, or once first and once not, does
    not - and then, or with a negative id (its copies' private ids could meet another id), the population keys
    its blocks by chained hashes."""
    assert hash_ids_name_prefixes(sessions_trace()) and population(sessions_trace()).hash_ids_named
    assert population(random_trace(8, 80)).hash_ids_named

    def trace(*hashes: list[int]) -> Trace:
        return Trace.build([0.0] * len(hashes), [16 * len(h) for h in hashes], [1] * len(hashes),
                           hash_ids=np.concatenate(hashes), hash_offsets=np.cumsum([0] + [len(h) for h in hashes]),
                           hash_granularity=16)

    assert hash_ids_name_prefixes(trace([1, 2, 3], [1, 2], [4]))
    assert not hash_ids_name_prefixes(trace([1, 2, 3], [4, 2]))  # 2 after 1 and after 4
    assert not hash_ids_name_prefixes(trace([1, 2], [2, 3]))  # 2 first once
    assert population(trace([1, 2], [1, 2, 3])).hash_ids_named
    assert not population(trace([-1, 2], [-1, 2, 3])).hash_ids_named
    assert not population(trace([1, 2], [2, 3])).hash_ids_named


@pytest.mark.parametrize(("block_size", "probe"), [
    (16, Probe(rate=12.0, duration_s=60, min_requests=10)), (32, Probe(rate=12.0, duration_s=60, min_requests=10)),
    (16, Probe(mode="concurrency", concurrency=6, duration_s=60, min_requests=10))], ids=["open", "open-32", "closed"])
def test_blocks_keyed_by_id_give_the_results_of_chained_keys(block_size, probe):
    """A population whose ids name their prefixes keys its blocks by id (one group per block, or two; open and
    closed loops): every request, sample, counter and summary is what the chained keys give - prefix hits,
    evictions under a small cache and the timings that follow from them alike."""
    pop = population(random_trace(8, 80, rate=10.0, output=(1, 120)))
    spec = SimSpec(num_blocks=150, block_size=block_size)
    by_id = run_probe(pop, spec, probe, seed=4)
    chained = run_probe(dataclasses.replace(pop, hash_ids_named=False), spec, probe, seed=4)
    assert pop.hash_ids_named and by_id.summary["prefix_cache_hit_rate"] > 0.1
    pd.testing.assert_frame_equal(by_id.requests, chained.requests, check_exact=True)
    pd.testing.assert_frame_equal(by_id.series, chained.series, check_exact=True)
    assert by_id.summary == chained.summary and by_id.info == chained.info
