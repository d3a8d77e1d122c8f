"""Synthetic workloads: determinism, prefix structure, arrival processes and spec errors."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import yaml

from tests.traces.trace_fixtures import VIDUR, write_text
from kvplan.traces.arrivals import arrival_times
from kvplan.traces.synth import synthesize, synthesize_file

SPEC = {
    "seed": 7,
    "requests": 300,
    "arrivals": {"process": "gamma", "rate": 2.0, "cv": 2.0},
    "lengths": {"prompt": {"dist": "lognormal", "median": 200, "sigma": 0.8, "max": 2000},
                "output": {"dist": "uniform", "min": 16, "max": 300}},
    "prefix": {"granularity": 16,
               "system_prompts": {"count": 4, "tokens": {"dist": "fixed", "value": 600}, "zipf": 1.1},
               "few_shot": {"templates": 3, "shots": 4, "shot_tokens": {"dist": "fixed", "value": 50},
                            "fraction": 0.3},
               "conversations": {"fraction": 0.5, "turns": {"dist": "uniform", "min": 2, "max": 5},
                                 "think_s": 20}},
}


def _spec(**changes: object) -> dict:
    spec = copy.deepcopy(SPEC)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = spec
        for p in parents:
            node = node[p]
        node[leaf] = value
    return spec


def test_deterministic_for_a_seed():
    a, b, c = synthesize(_spec()), synthesize(_spec()), synthesize(_spec(seed=8))
    for name in ("arrival_s", "prompt_tokens", "output_tokens", "session_id", "turn", "hash_ids",
                 "hash_offsets"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert not np.array_equal(a.prompt_tokens, c.prompt_tokens)
    assert len(a) == 300 and np.all(np.diff(a.arrival_s) >= 0) and a.arrival_s[0] == 0


def test_next_turn_contains_the_previous_turn():
    t = synthesize(_spec())
    g = t.hash_granularity
    index = {(s, k): i for i, (s, k) in enumerate(zip(t.session_id.tolist(), t.turn.tolist(), strict=True))}
    checked = 0
    for (s, k), i in index.items():
        prev = index.get((s, k - 1))
        if prev is None:
            continue
        assert t.prompt_tokens[i] > t.prompt_tokens[prev] + t.output_tokens[prev]
        full = t.prompt_tokens[prev] // g
        assert np.array_equal(t.hashes_of(i)[:full], t.hashes_of(prev)[:full])
        # The previous prompt's partial last block now holds more text: it is a different block.
        if t.prompt_tokens[prev] % g:
            assert t.hashes_of(i)[full] != t.hashes_of(prev)[full]
        checked += 1
    assert checked > 20


def test_shared_system_prompts_share_their_full_blocks():
    t = synthesize(_spec(prefix__few_shot=None, prefix__conversations=None))
    first_blocks = t.hash_ids[t.hash_offsets[:-1]]
    assert 1 < len(set(first_blocks.tolist())) <= 4  # the 4 system prompts (Zipf: not all need appear)
    same = np.flatnonzero(first_blocks == first_blocks[0])
    a, b = t.hashes_of(same[0]), t.hashes_of(same[1])
    assert np.array_equal(a[:600 // 16], b[:600 // 16]) and a[600 // 16] != b[600 // 16]
    assert np.all(t.turn == 1)


def test_without_prefix_section_there_is_no_prefix_identity():
    spec = _spec()
    del spec["prefix"]
    t = synthesize(spec)
    assert not t.has_prefix and np.all(t.prompt_tokens <= 2000)


def test_empirical_lengths_from_a_trace(tmp_path):
    write_text(tmp_path, "lengths.csv", VIDUR)
    spec = _spec(lengths={"prompt": {"dist": "empirical", "trace": "lengths.csv"},
                          "output": {"dist": "empirical", "trace": "lengths.csv", "format": "vidur"}})
    del spec["prefix"]
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    t = synthesize_file(tmp_path / "spec.yaml")
    assert set(t.prompt_tokens.tolist()) <= {100, 2048, 300}
    assert set(t.output_tokens.tolist()) <= {20, 7, 300}


@pytest.mark.parametrize(("changes", "message"), [
    ({"arrivals__cv": 0}, "arrivals.cv: must be > 0"),
    ({"arrivals__process": "weibull"}, "arrivals.process: unknown process 'weibull'; allowed: poisson"),
    ({"lengths__prompt__dist": "zipf"}, "lengths.prompt.dist: unknown distribution 'zipf'"),
    ({"lengths__output__max": 3}, "lengths.output.max: must be >= min (16), got 3"),
    ({"prefix__system_prompts__count": 2.5}, "prefix.system_prompts.count: must be an integer"),
    ({"prefix__conversations__turns": None}, "prefix.conversations.turns.dist: unknown distribution None"),
    ({"requests": None}, "spec.requests: required"),
    ({"prefix__few_shot__fraction": 1.5}, "prefix.few_shot.fraction: must be in (0, 1], got 1.5"),
    ({"prefix__colour": 1}, "prefix.colour: unknown key; allowed: granularity"),
    ({"lengths__prompt": {"dist": "empirical", "trace": "absent.csv"}}, "lengths.prompt.trace: no such file"),
])
def test_spec_errors_name_the_key_path(changes, message):
    with pytest.raises(ValueError) as err:
        synthesize(_spec(**changes))
    assert message in str(err.value)


def test_arrival_processes_have_their_rate_and_shape():
    rng = np.random.default_rng(0)
    gamma = np.diff(arrival_times({"process": "gamma", "rate": 4.0, "cv": 3.0}, 40_000, rng))
    assert 1 / gamma.mean() == pytest.approx(4.0, rel=0.05)
    assert gamma.std() / gamma.mean() == pytest.approx(3.0, rel=0.1)
    poisson = np.diff(arrival_times({"rate": 2.0}, 40_000, rng))
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, rel=0.05)
    onoff = arrival_times({"process": "onoff", "rate": 10.0, "on_s": 5, "off_s": 15}, 5_000, rng)
    assert np.all(onoff % 20 < 5) and len(onoff) / onoff[-1] == pytest.approx(2.5, rel=0.1)
    diurnal_spec = {"process": "diurnal", "rate": 2.0, "curve": [1, 0, 3], "period_s": 30}
    diurnal = arrival_times(diurnal_spec, 20_000, rng)
    counts = np.histogram(diurnal % 30, bins=3, range=(0, 30))[0]
    assert counts[1] == 0 and counts[2] / counts[0] == pytest.approx(3.0, rel=0.1)
