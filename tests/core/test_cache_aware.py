"""vLLM 0.34's cache-aware admission in kvplan's core (`admission.reorder_window`), on every side.

The step-for-step identity with vLLM's own scheduler is tests/core/test_vllm_parity.py's (cache-aware family);
here: the rule on hand-built queues (a brute force of the rule as vLLM's docstring states it), that the probe moves
nothing, and that every side takes the settings or refuses them in one line where the release lacks them.
"""

from __future__ import annotations

import random

import pytest

from kvplan.engine.core import CacheConfig, Scheduler, SchedulerConfig, make_request
from kvplan.engine.core.request import RequestStatus
from kvplan.errors import ConfigError
from tests.core.helpers import step

BS = 4


def scheduler(window: int, threshold: float = 0.0, num_blocks: int = 64, **cache) -> Scheduler:
    return Scheduler(CacheConfig(block_size=BS, num_blocks=num_blocks, max_model_len=128, **cache),
                     SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=1,
                                     cache_aware_admission_window=window,
                                     cache_aware_admission_threshold=threshold))


def expected_order(sched: Scheduler) -> list[str]:
    """The rule, brute force: within the first N of the queue, the plain waiting requests' slots are refilled
    by those requests sorted by cached tokens (deepest first, then position); every other slot is kept."""
    queue = list(sched.waiting)
    head = queue[:sched.config.cache_aware_admission_window]
    plain = [i for i, r in enumerate(head) if r.status is RequestStatus.WAITING and not r.num_computed_tokens]
    ranked = sorted(plain, key=lambda i: (-sched.kv.num_cached_tokens(head[i]), i))
    for slot, source in zip(plain, ranked, strict=True):
        head[slot] = queue[source]
    return [r.request_id for r in head + queue[len(head):]]


def test_the_window_reorders_plain_requests_by_cached_depth_as_a_brute_force_says():
    rng = random.Random(5)
    shared = [rng.randrange(50) for _ in range(40)]
    for trial in range(30):
        window = rng.choice((2, 3, 5, 8))
        sched = scheduler(window)
        # a running request that computes a shared prefix, then a queue mixing its sharers and strangers
        sched.add_request(make_request("seed", prompt_token_ids=shared, max_tokens=50))
        step(sched)
        for i in range(rng.randint(2, 9)):
            keep = rng.choice((0, 8, 16, 24, 40))
            prompt = shared[:keep] + [100 + rng.randrange(50) for _ in range(rng.randint(1, 12))]
            sched.add_request(make_request(f"r{trial}.{i}", prompt_token_ids=prompt, max_tokens=3))
        want = expected_order(sched)
        sched.admissions.reorder_window()
        assert [r.request_id for r in sched.waiting] == want


def test_below_the_threshold_nothing_moves_and_the_probe_moves_no_block():
    sched = scheduler(8, threshold=0.9)
    prompt = list(range(24))
    sched.add_request(make_request("a", prompt_token_ids=prompt, max_tokens=20))
    step(sched)
    sched.add_request(make_request("cold", prompt_token_ids=[999] * 8, max_tokens=2))
    sched.add_request(make_request("warm", prompt_token_ids=[*prompt, 7], max_tokens=2))
    before = (sched.kv.num_free_blocks, [r.request_id for r in sched.waiting])
    assert sched.kv.num_cached_tokens(sched.waiting.peek()) == 0
    assert sched.kv.num_cached_tokens(list(sched.waiting)[1]) == 24
    sched.admissions.reorder_window()  # usage far below 0.9
    assert (sched.kv.num_free_blocks, [r.request_id for r in sched.waiting]) == before


def test_the_probe_asks_the_gpu_only_and_promotes_nothing_from_a_lower_tier():
    sched = Scheduler(CacheConfig(block_size=BS, num_blocks=8, max_model_len=32, kv_offloading_blocks=16),
                      SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4))
    prompt = list(range(16))
    sched.add_request(make_request("a", prompt_token_ids=prompt, max_tokens=1))
    while sched.has_unfinished():
        step(sched)
    for i in range(3):  # other prompts push a's blocks out of the GPU into the CPU tier
        sched.add_request(make_request(f"x{i}", prompt_token_ids=[500 + 20 * i + j for j in range(16)], max_tokens=1))
        while sched.has_unfinished():
            step(sched)
    probe = make_request("b", prompt_token_ids=[*prompt, 1], max_tokens=1)
    sched.add_request(probe)
    assert sched.kv.cached_prefix_blocks(probe) > len(sched.kv._gpu_prefix(probe)[0])  # the CPU tier holds more
    sched.kv.take_transfers()
    assert sched.kv.num_cached_tokens(probe) == len(sched.kv._gpu_prefix(probe)[0]) * BS
    assert sched.kv.take_transfers() == []


def test_refused_where_vllm_lacks_or_ignores_it():
    with pytest.raises(ConfigError, match=r"^scheduler\.cache_aware_admission_window: vLLM 0\.33 has no cache-aware"):
        SchedulerConfig(vllm_version="0.33", cache_aware_admission_window=4)
    with pytest.raises(ConfigError, match="only the fcfs policy has"):
        SchedulerConfig(policy="priority", cache_aware_admission_window=4)
    with pytest.raises(ConfigError, match="enable_prefix_caching is off"):
        Scheduler(CacheConfig(enable_prefix_caching=False), SchedulerConfig(cache_aware_admission_window=4))


def test_every_side_takes_it_and_a_sweep_is_checked_per_point(tmp_path, capsys):
    import yaml

    from kvplan.cli import main
    from kvplan.engine.options import EngineOptions
    from kvplan.sim.run import simulate
    from kvplan.sim.spec import SimSpec
    from tests.sim.helpers import random_trace

    assert EngineOptions(cache_aware_admission_window=16).cache_aware_admission_window == 16
    with pytest.raises(ConfigError, match=r"vLLM 0\.33 has no cache_aware_admission_window"):
        EngineOptions(vllm_version="0.33", cache_aware_admission_window=16)
    trace = random_trace(3, 40, rate=8.0, prompt=(100, 2000), output=(10, 100))
    result = simulate(trace, SimSpec(cache_aware_admission_window=16, cache_aware_admission_threshold=0.0,
                                     num_blocks=400))
    assert result.summary["completed"] == 40 and result.info["vllm_version"] == "0.34"
    doc = {"name": "t", "model": "llama-3-8b", "hardware": "h100-sxm",
           "workload": {"trace": "sample:mooncake_style", "mode": "burst"},
           "sweep": {"zip": {"engine.vllm_version": ["0.33", "0.34"], "engine.cache_aware_admission_window": [0, 16]}}}
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["run", str(path), "--explain"]) == 0  # 0.33 without the window, 0.34 with it
    doc["sweep"]["zip"]["engine.cache_aware_admission_window"] = [16, 0]
    path.write_text(yaml.safe_dump(doc))
    capsys.readouterr()
    assert main(["run", str(path), "--explain"]) == 2
    err = capsys.readouterr().err
    assert "point 0 (" in err and "engine.cache_aware_admission_window: vLLM 0.33 has no cache-aware admission" in err
