"""Stamped runs (`sim.token_clock`): a step's leading decodes stamped as one run, each record brought up to date only
when read, give the records, gaps and results that stamping every sequence at every step gives. The reference is
the same fast-path cluster with runs off (`TokenClock.runs`), on loaded traces that preempt, under an inter-token
measurement window, with stretches between the steps."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from kvplan.engine.core import make_request
from kvplan.engine.core.decode_steps import DecodeMode
from kvplan.engine.core.timing import SequenceTiming
from kvplan.sim.cluster import Cluster
from kvplan.sim.routers import make_router
from kvplan.sim.run import build_configs, build_cost, collect
from kvplan.sim.spec import SimSpec
from kvplan.sim.token_clock import TokenClock
from kvplan.traces import Trace
from tests.core.helpers import make_scheduler


def loaded_trace(seed: int, count: int, rate: float) -> Trace:
    rng = np.random.default_rng(seed)
    return Trace.build(np.cumsum(rng.exponential(1 / rate, count)), rng.integers(16, 900, count),
                       rng.integers(1, 400, count))


def run(trace: Trace, spec: SimSpec, runs: bool, window: tuple[float, float]) -> Cluster:
    cost, blocks = build_cost(spec)
    cache, config = build_configs(spec, trace, blocks, cost)
    cluster = Cluster(trace, spec.replicas, make_router(spec.router), cache, config, cost, sample_interval_s=1.0)
    for replica in cluster.replicas:
        replica.tokens.runs = runs
        replica.tokens.itl_from, replica.tokens.itl_until = window
    cluster.run()
    return cluster


@pytest.mark.parametrize(("seed", "caching", "window", "victim"), [
    (0, True, (-np.inf, np.inf), "newest"), (1, False, (2.0, 6.0), "newest"),
    (2, True, (1.0, 4.0), "longest_remaining"),  # victims from inside the run, while others join it behind
    (3, False, (-np.inf, np.inf), "longest_remaining")])
def test_stamped_runs_equal_stamping_every_step(seed, caching, window, victim):
    trace = loaded_trace(seed, 400, 60.0)
    # a small cache under load: long runs of bulk decodes, preemptions and stretches between them
    spec = SimSpec(model="llama-3-8b", hardware="h100-sxm", replicas=1, num_blocks=1500,
                   enable_prefix_caching=caching, victim_policy=victim)
    stamped, reference = run(trace, spec, True, window), run(trace, spec, False, window)
    pd.testing.assert_frame_equal(stamped.log.raw_frame(), reference.log.raw_frame(), check_exact=True)
    blocks = stamped.replicas[0].sched.cache_config.num_blocks
    a, b = collect(stamped, blocks), collect(reference, blocks)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    assert str(a.summary) == str(b.summary)  # (NaNs compare equal as text)
    assert stamped.itl().counts == reference.itl().counts
    # not vacuous: runs carried most tokens, across preemptions and stretches
    tokens = int(trace.output_tokens.sum())
    assert sum(r.tokens.run_stamps for r in stamped.replicas) > tokens // 4
    assert sum(r.tokens.run_stamps for r in reference.replicas) == 0
    assert sum(r.sched.stats.num_preemptions for r in stamped.replicas) > 0
    assert sum(r.num_fast_steps for r in stamped.replicas) > 0


def drive_clock(seed: int, runs: bool) -> tuple[list[tuple], dict, int]:
    """A bulk-decoding scheduler stamped by a `TokenClock`, with arrivals and aborts (a request taken out of the
    run between steps while others join behind it); every record, settled, in request order, the gaps' log and
    the run stamps."""
    rng = random.Random(seed)
    sched = make_scheduler(block_size=4, num_blocks=400, budget=48, max_seqs=24)
    sched.decode_mode = DecodeMode.BULK
    tokens = TokenClock(runs)
    tracks: dict[str, SequenceTiming] = {}
    clock = 0.0
    for _step in range(400):
        for _ in range(rng.choice([0, 0, 0, 1, 2])):
            request = make_request(f"r{len(tracks)}", prompt_len=rng.randint(1, 30), max_tokens=rng.randint(1, 90))
            request.timing = tracks[request.request_id] = SequenceTiming(len(tracks), 0, clock)
            sched.add_request(request)
        if rng.random() < 0.05 and len(sched.running) > 2:
            sched.abort(rng.choice(sched.running[:-1]).request_id)
        if not sched.has_unfinished():
            continue
        out = sched.schedule()
        end = clock + rng.choice([0.01, 0.02, 0.03, 0.05])
        finished = sched.update(out, None).finished
        tokens.step(out, clock, end)
        for request in finished:
            assert request.timing is not None
            tokens.settle(request.timing)
        clock = end
    tokens.settle_run()
    records = [(t.first_token_s, t.last_token_s, t.itl_max_s, t.stamped_to) for t in tracks.values()]
    return records, tokens.itl.counts, tokens.run_stamps


@pytest.mark.parametrize("seed", range(4))
def test_a_run_broken_between_steps_is_settled(seed):
    """Aborts take requests out of the middle of the run between steps while new ones join it at its end (so the
    leading decodes still outnumber it): the clock finds its last request moved and settles the run."""
    stamped, reference = drive_clock(seed, True), drive_clock(seed, False)
    assert stamped[0] == reference[0]
    assert stamped[1] == reference[1]
    assert stamped[2] > 1000 and reference[2] == 0
