"""Speculative decoding in the simulator: the shared scheduler's verification steps, outcomes drawn from the
acceptance model, the verification's width priced, and the run's counters."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.errors import UserError
from kvplan.sim.run import simulate
from kvplan.sim.spec import SimSpec
from kvplan.traces import Trace


def ngram(k: int, **extra) -> str:
    return json.dumps({"method": "ngram", "num_speculative_tokens": k, **extra})


def one_request(prompt: int, output: int, config: str | None, **kw):
    trace = Trace.build([0.0], [prompt], [output])
    # (a context well past the request: drafts are trimmed only short of max_model_len)
    return simulate(trace, SimSpec(model="llama-3-8b", hardware="h100-sxm", speculative_config=config,
                                   entry_point="engine", max_model_len=1024, **kw))


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 60), st.integers(1, 6))
def test_every_draft_accepted_emits_k_plus_one_tokens_per_step(output, k):
    result = one_request(64, output, ngram(k, acceptance_rate=1.0))
    # one prefill step samples the first token; each verification then emits k + 1, the last one what is left
    assert result.info["steps"] == 1 + math.ceil((output - 1) / (k + 1))
    spec = result.info["speculative"]
    assert spec["num_drafts"] == math.ceil((output - 1) / (k + 1))
    assert spec["num_draft_tokens"] == k * spec["num_drafts"]
    assert result.requests["output_tokens"].tolist() == [output]


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 40), st.integers(1, 5))
def test_no_draft_accepted_takes_a_step_per_token_as_plain_decoding_but_wider(output, k):
    plain = one_request(64, output, None, fast_path=False)
    spec = one_request(64, output, ngram(k, acceptance=[1.0] + [0.0] * k))
    assert spec.info["steps"] == plain.info["steps"] == output
    assert spec.info["speculative"]["num_accepted_tokens"] == 0
    # each verification computes k + 1 rows where plain decoding computes one: never cheaper
    assert spec.requests["finish_s"].iloc[0] >= plain.requests["finish_s"].iloc[0]


def test_a_long_run_accepts_as_the_model_says():
    trace = Trace.build([0.05 * i for i in range(200)], [200] * 200, [64] * 200)
    result = simulate(trace, SimSpec(model="llama-3-8b", hardware="h100-sxm", entry_point="engine",
                                     speculative_config=ngram(4, acceptance=[0.2, 0.2, 0.2, 0.2, 0.2])))
    spec = result.info["speculative"]
    # P(a) uniform on 0..4: E[a] = 2, but a request's last step keeps only what its output budget has left
    assert spec["acceptance_rate"] == pytest.approx(0.5, abs=0.03)
    assert spec["mean_acceptance_length"] == pytest.approx(3.0, abs=0.1)
    again = simulate(trace, SimSpec(model="llama-3-8b", hardware="h100-sxm", entry_point="engine",
                                    speculative_config=ngram(4, acceptance=[0.2, 0.2, 0.2, 0.2, 0.2])))
    assert again.info["speculative"] == spec  # every draw seeded
    assert (again.requests["finish_s"] == result.requests["finish_s"]).all()


def test_speculation_lowers_tpot_when_drafts_are_accepted():
    trace = Trace.build([0.1 * i for i in range(100)], [300] * 100, [128] * 100)
    tpot = {}
    for label, config in (("plain", None), ("spec", ngram(4, acceptance_rate=0.8))):
        result = simulate(trace, SimSpec(model="llama-3-8b", hardware="h100-sxm", entry_point="engine",
                                         speculative_config=config))
        tpot[label] = result.summary["median_tpot_ms"]
    assert tpot["spec"] < 0.6 * tpot["plain"]


def test_a_draft_model_costs_its_passes_and_reserves_lookahead_slots():
    trace = Trace.build([0.0], [64], [33])
    config = {"method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": 4, "acceptance_rate": 1.0}
    spec = simulate(trace, SimSpec(model="llama-3-8b", hardware="h100-sxm", entry_point="engine",
                                   speculative_config=json.dumps(config)))
    free = simulate(trace, SimSpec(model="llama-3-8b", hardware="h100-sxm", entry_point="engine",
                                   speculative_config=ngram(4, acceptance_rate=1.0)))
    assert spec.info["steps"] == free.info["steps"]  # the same verifications
    assert spec.requests["finish_s"].iloc[0] > free.requests["finish_s"].iloc[0]  # plus the draft model's passes


def test_the_simulator_needs_an_acceptance_model():
    with pytest.raises(UserError, match="acceptance_rate"):
        one_request(64, 8, ngram(3))
    with pytest.raises(UserError, match="model"):
        one_request(64, 8, json.dumps({"method": "draft_model", "num_speculative_tokens": 2, "acceptance_rate": 0.5}))
