"""Speculative decoding in the scheduler core (engine.core.spec_steps): drafts scheduled after the verified tokens,
lookahead slots, draft budget rows, rollback of rejected drafts, and the checks of `speculative_config`."""

from __future__ import annotations

import json

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from kvplan.engine.core import CacheConfig, RequestStatus, Scheduler, SchedulerConfig, make_request
from kvplan.engine.core.config import ConfigError
from kvplan.engine.core.decode_steps import DecodeMode
from kvplan.engine.core.kv_layout import cdiv
from kvplan.engine.core.speculative import parse_speculative_config
from tests.core.invariants import check_scheduler

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}
DRAFT = {"method": "draft_model", "model": "draft-dir", "num_speculative_tokens": 3}


def spec_scheduler(spec: dict, *, block_size: int = 4, num_blocks: int = 64, budget: int = 64,
                   max_model_len: int = 200, prefix: bool = True, **sched) -> Scheduler:
    return Scheduler(CacheConfig(block_size=block_size, num_blocks=num_blocks, max_model_len=max_model_len,
                                 enable_prefix_caching=prefix, watermark=0.0),
                     SchedulerConfig(max_num_batched_tokens=budget, speculative_config=json.dumps(spec), **sched))


def decoding(sched: Scheduler, rid: str = "a", prompt: int = 10, max_tokens: int = 20, tokens: bool = False,
             stops: frozenset[int] = frozenset()):
    """A request past its prompt (one output token), decoding."""
    request = make_request(rid, max_tokens=max_tokens, prompt_token_ids=list(range(100, 100 + prompt))
                           if tokens else None, prompt_len=None if tokens else prompt, stop_token_ids=stops)
    sched.add_request(request)
    out = sched.schedule()
    sched.update(out, [7] if tokens else None)
    assert request.num_computed_tokens == request.num_tokens - 1
    return request


def test_the_setting_parses_as_vllm_and_refuses_bad_input_in_one_line():
    config = parse_speculative_config(json.dumps(NGRAM), "p")
    assert (config.prompt_lookup_min, config.prompt_lookup_max, config.num_lookahead_tokens, config.draft_slots) == \
        (2, 2, 0, 0)  # one bound given: the other takes its value (vLLM)
    assert parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 2}', "p").prompt_lookup_max == 5
    draft = parse_speculative_config(json.dumps(DRAFT), "p")
    assert (draft.num_lookahead_tokens, draft.draft_slots) == (3, 1)
    sim = parse_speculative_config(json.dumps({**NGRAM, "acceptance": [0.5, 0.25, 0.125, 0.125],
                                               "acceptance_rate": 0.7}), "p")
    assert sim.acceptance == (0.5, 0.25, 0.125, 0.125) and sim.acceptance_rate == 0.7
    bad = {"{": "not valid JSON", '{"method": "medusa", "num_speculative_tokens": 2}': "allowed: ngram, draft_model",
           '{"method": "ngram", "num_speculative_tokens": 0}': "'num_speculative_tokens' must be an integer >= 1",
           '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2}':
               "prompt_lookup_min <= prompt_lookup_max",
           '{"method": "draft_model", "num_speculative_tokens": 2}': "needs key 'model'",
           '{"method": "ngram", "num_speculative_tokens": 2, "k": 1}': "unknown key 'k'",
           '{"method": "ngram", "num_speculative_tokens": 1, "acceptance": [0.2, 0.2]}': "summing to 1",
           '{"method": "ngram", "num_speculative_tokens": 1, "acceptance_rate": 0}': "> 0 and <= 1"}
    for text, why in bad.items():
        with pytest.raises(ConfigError, match=r"^scheduler\.speculative_config: ") as exc:
            SchedulerConfig(speculative_config=text)
        assert why in str(exc.value) and "\n" not in str(exc.value)


def test_rejected_drafts_roll_the_computed_count_back():
    sched = spec_scheduler(NGRAM)
    request = decoding(sched)
    before = request.num_computed_tokens
    sched.set_drafts({"a": [1, 2, 3]})
    out = sched.schedule()
    [item] = out.scheduled
    assert (item.num_new_tokens, list(item.spec_token_ids), item.samples, item.is_decode) == (4, [1, 2, 3], True,
                                                                                             False)
    assert request.spec_token_ids == []  # cleared once scheduled
    result = sched.update(out, accepted=[1])
    assert request.num_output_tokens == 3 and request.num_computed_tokens == before + 2
    assert request.num_computed_tokens == request.num_tokens - 1 and result.spec == {"a": (3, 1)}
    stats = sched.stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, 3, 1)
    assert stats.num_accepted_tokens_per_pos == [1, 0, 0] and stats.num_draft_tokens_per_pos == [1, 1, 1]
    # the rejected drafts' blocks stay with the request (vLLM frees nothing) and the next step writes over them
    held = len(sched.kv.tables["a"])
    out = sched.schedule()
    assert out.scheduled[0].start_pos == request.num_computed_tokens and len(sched.kv.tables["a"]) == held
    check_scheduler(sched, mid_step=True)


def test_a_draft_model_allocates_lookahead_slots_up_to_max_model_len():
    sched = spec_scheduler(DRAFT, max_model_len=32)
    request = decoding(sched, prompt=10, max_tokens=22)
    sched.set_drafts({"a": [1, 2, 3]})
    sched.schedule()
    bs = sched.block_size
    assert len(sched.kv.tables["a"]) == cdiv(request.num_computed_tokens + 4 + 3, bs)  # + k lookahead slots
    near = spec_scheduler(DRAFT, max_model_len=16)
    request = decoding(near, prompt=10, max_tokens=6)
    near.set_drafts({"a": [1, 2, 3]})
    out = near.schedule()
    assert out.scheduled[0].num_new_tokens == 4  # 10 computed: positions 10..13 stay below 16 - 1
    assert len(near.kv.tables["a"]) == cdiv(16, near.block_size)  # lookahead capped at max_model_len


def test_drafts_are_capped_so_no_position_reaches_max_model_len():
    sched = spec_scheduler(NGRAM, max_model_len=14)
    request = decoding(sched, prompt=12, max_tokens=2)  # 12 computed, 13 tokens: one position left
    sched.set_drafts({"a": [1, 2, 3]})
    out = sched.schedule()
    [item] = out.scheduled
    assert item.num_new_tokens == 1  # max_model_len - computed - 1: the verified token alone
    assert list(item.spec_token_ids) == [] and item.samples
    sched.update(out, accepted=[0])
    assert request.status is RequestStatus.FINISHED and request.finish_reason == "length"


def test_a_stop_token_inside_the_accepted_run_finishes_the_request():
    sched = spec_scheduler(NGRAM)
    request = decoding(sched, tokens=True, stops=frozenset({99}))
    sched.set_drafts({"a": [5, 99, 6]})
    out = sched.schedule()
    result = sched.update(out, [[5, 99, 6, 8]])  # all accepted, bonus 8: the stop ends it at 99
    assert request.status is RequestStatus.FINISHED and request.finish_reason == "stop"
    assert request.output_token_ids == [7, 5, 99] and result.finished == [request]
    assert "a" not in sched.kv.tables


def test_max_tokens_reached_mid_run_drops_the_rest():
    sched = spec_scheduler(NGRAM)
    request = decoding(sched, max_tokens=3)
    sched.set_drafts({"a": [1, 2, 3]})
    out = sched.schedule()
    sched.update(out, accepted=[3])
    assert request.status is RequestStatus.FINISHED and request.num_output_tokens == 3


def test_each_scheduled_request_takes_its_draft_rows_from_the_budget():
    def widths(spec: dict) -> list[tuple[int, int]]:
        sched = spec_scheduler(spec, budget=11)
        for rid in "abc":
            decoding(sched, rid, prompt=4)
        sched.set_drafts({rid: [1, 2, 3] for rid in "abc"})
        return [(i.num_new_tokens, len(i.spec_token_ids)) for i in sched.schedule().scheduled]

    assert widths(NGRAM) == [(4, 3), (4, 3), (3, 2)]  # no rows: the last one's drafts are trimmed to fit
    assert widths(DRAFT) == [(4, 3), (4, 3)]  # 4 + 1 each; 1 left is not more than its one row


def test_drafts_are_trimmed_to_the_budget_with_chunked_prefill_off():
    sched = spec_scheduler(NGRAM, budget=6, enable_chunked_prefill=False)
    for rid in "ab":
        decoding(sched, rid, prompt=3)
    sched.set_drafts({rid: [1, 2, 3] for rid in "ab"})
    assert [(i.num_new_tokens, len(i.spec_token_ids)) for i in sched.schedule().scheduled] == [(4, 3), (2, 1)]


def test_prefix_keys_cover_only_verified_tokens():
    sched = spec_scheduler(NGRAM)
    request = decoding(sched, prompt=6, tokens=True)  # 7 tokens, 6 computed
    sched.set_drafts({"a": [1, 2, 3]})
    sched.schedule()  # computes positions 6..9: a second block fills, but only with drafts
    assert request.num_hashed_blocks == 1


def test_no_bulk_decodes_or_fast_path_and_refusals():
    sched = Scheduler(CacheConfig(num_blocks=64, max_model_len=200),
                      SchedulerConfig(speculative_config=json.dumps(NGRAM)), decode_mode=DecodeMode.BULK)
    assert sched.decode_mode is DecodeMode.PER_REQUEST
    decoding(sched)
    assert sched.decode_horizon(100) == 0
    beam = make_request("b", prompt_len=4, max_tokens=4, n=2, beam=True)
    assert sched.add_request(beam)  # accepted; its sequences never take drafts (vLLM's beam search neither)
    sched.update(sched.schedule())
    sched.set_drafts({"b": [1, 2]})
    assert beam.spec_token_ids == []
    with pytest.raises(ConfigError, match=r"sink\+window"):
        Scheduler(CacheConfig(num_blocks=64, max_model_len=200, window_tokens=32),
                  SchedulerConfig(speculative_config=json.dumps(NGRAM)))
    with pytest.raises(ValueError, match="speculative decoding is off"):
        Scheduler().set_drafts({"a": [1]})


def test_drafts_for_a_prefilling_request_are_dropped():
    sched = spec_scheduler(NGRAM, budget=4)
    request = make_request("a", prompt_len=10, max_tokens=5)
    sched.add_request(request)
    sched.update(sched.schedule())
    sched.set_drafts({"a": [1, 2]})
    assert request.spec_token_ids == []


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(spec=st.sampled_from([NGRAM, DRAFT]), num_blocks=st.integers(16, 40), budget=st.integers(6, 40),
       lengths=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 20)), min_size=1, max_size=6),
       seed=st.randoms(use_true_random=False))
def test_random_acceptance_keeps_the_invariants(spec, num_blocks, budget, lengths, seed):
    sched = spec_scheduler(spec, num_blocks=num_blocks, budget=budget, max_model_len=60)
    for i, (prompt, out_len) in enumerate(lengths):
        sched.add_request(make_request(f"r{i}", prompt_len=prompt, max_tokens=out_len))
    for _ in range(2000):
        if not sched.has_unfinished():
            break
        out = sched.schedule()
        check_scheduler(sched, mid_step=True)
        accepted = [seed.randint(0, len(item.spec_token_ids)) for item in out.scheduled]
        sched.update(out, None, accepted)
        check_scheduler(sched)
        for request in sched.running:
            assert request.num_computed_tokens <= request.num_tokens
            assert request.num_hashed_blocks * sched.block_size <= request.num_tokens
        sched.set_drafts({r.request_id: [0] * seed.randint(0, 3) for r in sched.running})
    assert not sched.has_unfinished()
    assert sched.stats.num_accepted_tokens <= sched.stats.num_draft_tokens
