"""Transforms, granularity expansion, token materialization and the stats they feed."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan import traces
from tests.traces.trace_fixtures import MOONCAKE, VIDUR, write_jsonl, write_text
from kvplan.traces import transforms as tf
from kvplan.traces.materialize import materialize, prompt_token_ids
from kvplan.traces.schema import RequestRecord, Trace
from kvplan.traces.stats import infinite_cache_hits, summarize


def _hashed(prompts: list[int], hashes: list[list[int]], granularity: int) -> Trace:
    counts = [len(h) for h in hashes]
    return Trace.build(np.arange(len(prompts), dtype=float), prompts, [1] * len(prompts),
                       hash_ids=[h for hs in hashes for h in hs], hash_offsets=np.cumsum([0, *counts]),
                       hash_granularity=granularity)


def test_window_scale_sample(tmp_path):
    t = traces.load(write_text(tmp_path, "v.csv", VIDUR))
    w = tf.window(t, 0.2, 1.0)
    assert w.prompt_tokens.tolist() == [2048] and w.arrival_s.tolist() == [pytest.approx(0.05)]
    assert "window [0.2, 1) s kept 1 of 3 requests" in w.report.notes
    assert tf.scale_rate(t, 2.0).arrival_s.tolist() == [0.0, 0.125, 0.75]
    assert tf.scale_rate(t, 0.5).arrival_s.tolist() == [0.0, 0.5, 3.0]
    s = tf.sample(t, 2 / 3, seed=1)
    assert len(s) == 2 and np.all(np.diff(s.arrival_s) >= 0)
    assert tf.sample(t, 2 / 3, seed=1).request_id.tolist() == s.request_id.tolist()
    with pytest.raises(ValueError, match="rate factor must be > 0"):
        tf.scale_rate(t, 0)


def test_retime_keeps_lengths_and_times_length_only_traces(tmp_path):
    t = traces.load(write_text(tmp_path, "l.csv", "num_prefill_tokens,num_decode_tokens\n" +
                               "".join(f"{10 + i},{i}\n" for i in range(200))))
    r = tf.retime(t, {"process": "gamma", "rate": 5.0, "cv": 2.0}, seed=3)
    assert r.timed and r.arrival_s[0] == 0 and np.all(np.diff(r.arrival_s) >= 0)
    assert r.prompt_tokens.tolist() == t.prompt_tokens.tolist()
    assert summarize(r)["mean_rate_rps"] == pytest.approx(5.0, rel=0.4)


def test_clip_to_context_truncates_lengths_and_hashes():
    t = _hashed([1000, 100], [[1, 2], [1]], 512)
    c = tf.clip_to_context(t.with_columns(output_tokens=np.array([500, 5])), 600)
    assert c.prompt_tokens.tolist() == [599, 100] and c.output_tokens.tolist() == [1, 5]
    assert c.hash_offsets.tolist() == [0, 2, 3]
    c = tf.clip_to_context(t, 300)
    assert c.prompt_tokens.tolist() == [299, 100] and c.hash_ids.tolist() == [1, 1]


def test_jitter_spreads_quantized_arrivals_within_the_quantum(tmp_path):
    t = traces.load(write_jsonl(tmp_path, "m.jsonl", MOONCAKE))
    j = tf.jitter(t, 3.0, seed=0)
    assert np.all(np.diff(j.arrival_s) >= 0)
    by_id = dict(zip(j.request_id.tolist(), j.arrival_s.tolist(), strict=True))
    for rid, before in zip(t.request_id.tolist(), t.arrival_s.tolist(), strict=True):
        assert before <= by_id[rid] < before + 3.0
    assert len(set(j.arrival_s.tolist())) == 3


def test_expand_granularity_preserves_sharing_exactly():
    t = _hashed([2048, 1536, 2048], [[7, 8, 9, 10], [7, 8, 11], [7, 12, 9, 10]], 512)
    e = tf.expand_granularity(t, 16)
    per = 512 // 16
    assert e.hash_granularity == 16 and e.hash_counts().tolist() == [128, 96, 128]
    a, b, c = (e.hashes_of(i) for i in range(3))
    assert np.array_equal(a[:2 * per], b[:2 * per]) and not np.isin(b[2 * per:], a).any()
    assert np.array_equal(a[:per], c[:per]) and a[per] != c[per]
    # Derived ids depend on the hash id and the sub-index only: the same in another trace and process.
    again = tf.expand_granularity(_hashed([600], [[8, 99]], 512), 16)
    assert np.array_equal(again.hashes_of(0)[:per], a[per:2 * per])
    assert again.hash_counts().tolist() == [38]  # ceil(600 / 16): sub-blocks past the prompt are dropped
    assert infinite_cache_hits(e).tolist() == infinite_cache_hits(t).tolist() == [0, 1024, 512]
    with pytest.raises(ValueError, match="granularity 512 is not a multiple of block size 48"):
        tf.expand_granularity(t, 48)


def test_infinite_cache_reuse_follows_the_definition():
    # Request 2 reuses the 2 leading blocks of request 0, request 3 none (its first block is new),
    # request 4 all three of its blocks but only up to its prompt length.
    t = _hashed([30, 20, 25, 30, 20], [[1, 2, 3], [4, 5], [1, 2, 6], [9, 1, 2], [1, 2, 6]], 10)
    assert infinite_cache_hits(t).tolist() == [0, 0, 20, 0, 20]
    prefix = summarize(t)["prefix"]
    assert prefix["hit_tokens"] == 40 and prefix["unique_blocks"] == 7
    assert prefix["reuse_fraction"] == pytest.approx(40 / 125)


def test_materialized_tokens_share_exactly_the_shared_hash_prefix():
    g = 16
    a = RequestRecord("a", 0.0, 40, 1, prefix_hashes=(5, 6, 7), hash_granularity=g)
    b = RequestRecord("b", 0.0, 50, 1, prefix_hashes=(5, 6, 8, 9), hash_granularity=g)
    ta, tb = (prompt_token_ids(r, 1000, seed=4, low=3) for r in (a, b))
    assert len(ta) == 40 and len(tb) == 50 and min(ta + tb) >= 3 and max(ta + tb) < 1000
    assert ta[:2 * g] == tb[:2 * g] and ta[2 * g:40] != tb[2 * g:40]
    assert prompt_token_ids(a, 1000, seed=4, low=3) == ta
    assert prompt_token_ids(a, 1000, seed=5, low=3) != ta
    plain = RequestRecord("c", 0.0, 10, 1)
    other = RequestRecord("d", 0.0, 10, 1)
    assert prompt_token_ids(plain, 50, seed=0) != prompt_token_ids(other, 50, seed=0)


def test_materialize_trace_records():
    t = _hashed([20, 20], [[1, 2], [1, 3]], 8)
    recs = list(materialize(t, 500, seed=0))
    assert [len(r.prompt_token_ids) for r in recs] == [20, 20]
    assert recs[0].prompt_token_ids[:8] == recs[1].prompt_token_ids[:8]


def test_compact_hash_ids_keeps_sharing_and_numbers_by_first_appearance():
    t = _hashed([30, 30, 30], [[900, 5, 77], [900, 5, 12], [3, 77]], 10)
    c = tf.compact_hash_ids(t)
    assert c.hash_ids.tolist() == [0, 1, 2, 0, 1, 3, 4, 2]
    assert infinite_cache_hits(c).tolist() == infinite_cache_hits(t).tolist()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 60), st.lists(st.integers(0, 6), max_size=6)), max_size=12))
def test_vectorized_reuse_matches_the_definition(requests):
    """Against a direct reading of the definition, on random small traces."""
    g = 8
    trace = _hashed([p for p, _ in requests], [h for _, h in requests], g)
    seen: set[int] = set()
    expected = []
    for prompt, hashes in requests:
        run = next((k for k, h in enumerate(hashes) if h not in seen), len(hashes))
        expected.append(min(run * g, prompt))
        seen.update(hashes)
    assert infinite_cache_hits(trace).tolist() == expected
