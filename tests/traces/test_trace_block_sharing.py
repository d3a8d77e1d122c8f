"""Hash expansion and token materialization (issue 3): expanding 512-token hash ids to block 16, materializing
token ids, then re-hashing the tokens in 16-token blocks reproduces exactly the same sharing structure.

The trace is Mooncake-faithful (synthesized from segment content, written in the Mooncake layout and loaded
back): a shared hash id means the same content, so also the same length when the block is a request's last,
partial one. On such a trace the partial last blocks agree too, and so does the infinite-cache reuse.
"""

from __future__ import annotations

from array import array
from itertools import combinations

import numpy as np
import pytest

from kvplan import traces
from kvplan.engine.core.block_keys import ROOT_KEY, HashBlockKeys, TokenBlockKeys, chain_hash
from tests.traces.trace_fixtures import write_text
from kvplan.traces.io import MOONCAKE_GRANULARITY, render_layout
from kvplan.traces.materialize import materialize
from kvplan.traces.schema import Trace, offsets_from_counts
from kvplan.traces.stats import infinite_cache_hits
from kvplan.traces.synth import synthesize
from kvplan.traces.transforms import expand_granularity

BLOCK = 16
VOCAB = 32_000
SPEC = {
    "seed": 2, "requests": 60,
    "arrivals": {"process": "poisson", "rate": 1.0},
    "lengths": {"prompt": {"dist": "lognormal", "median": 700, "sigma": 0.8, "max": 6000},
                "output": {"dist": "uniform", "min": 10, "max": 200}},
    "prefix": {"granularity": MOONCAKE_GRANULARITY,
               "system_prompts": {"count": 4, "tokens": {"dist": "uniform", "min": 300, "max": 2500}, "zipf": 1.0},
               "few_shot": {"templates": 2, "shots": 3, "shot_tokens": {"dist": "fixed", "value": 200},
                            "fraction": 0.4},
               "conversations": {"fraction": 0.6, "turns": {"dist": "uniform", "min": 2, "max": 4}, "think_s": 20}},
}


@pytest.fixture(scope="module")
def mooncake(tmp_path_factory: pytest.TempPathFactory) -> Trace:
    folder = tmp_path_factory.mktemp("sharing")
    path = write_text(folder, "mooncake.jsonl", render_layout(synthesize(SPEC), "mooncake").decode())
    trace = traces.load(path)
    assert trace.report.format == "mooncake"
    return trace


def _token_keys(tokens: list[int]) -> list[int]:
    """The engine's chained keys of the full 16-token blocks, then (as Mooncake's hash_ids) one for a partial
    last block, chained the same way over its tokens."""
    keys = TokenBlockKeys(tokens, BLOCK)
    full = [keys.key(i) for i in range(len(tokens) // BLOCK)]
    tail = tokens[len(full) * BLOCK:]
    return full + ([chain_hash(full[-1] if full else ROOT_KEY, array("q", tail).tobytes())] if tail else [])


def _leading_common(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _pairwise(keys: list[list[int]]) -> list[int]:
    return [_leading_common(keys[i], keys[j]) for i, j in combinations(range(len(keys)), 2)]


def test_expanded_hashes_materialized_tokens_and_core_keys_share_the_same_blocks(mooncake):
    expanded = expand_granularity(mooncake, BLOCK)
    trace_ids = [expanded.hashes_of(i).tolist() for i in range(len(expanded))]
    token_ids = [r.prompt_token_ids for r in materialize(mooncake, VOCAB, seed=9)]
    token_keys = [_token_keys(tokens) for tokens in token_ids]
    assert [len(t) for t in token_ids] == mooncake.prompt_tokens.tolist()
    assert [len(k) for k in token_keys] == [len(i) for i in trace_ids]  # hashes cover every prompt
    shared = _pairwise(trace_ids)
    assert _pairwise(token_keys) == shared
    assert max(shared) > 64 and sum(s > 0 for s in shared) > 20  # the trace does share, deeply and often
    # The core's own expansion of the original 512-token ids: full blocks only, as the engine keys them.
    full = [p // BLOCK for p in mooncake.prompt_tokens.tolist()]
    core_keys = []
    for record, blocks in zip(mooncake.records(), full, strict=True):
        keys = HashBlockKeys(record.prefix_hashes, record.hash_granularity, BLOCK, record.prompt_tokens,
                             salt=record.request_id)
        core_keys.append([keys.key(i) for i in range(blocks)])
    assert _pairwise(core_keys) == _pairwise([ids[:blocks] for ids, blocks in zip(trace_ids, full, strict=True)])


def test_infinite_cache_reuse_is_the_same_on_materialized_tokens(mooncake):
    expanded = expand_granularity(mooncake, BLOCK)
    keys = [_token_keys(r.prompt_token_ids) for r in materialize(mooncake, VOCAB, seed=9)]
    by_tokens = expanded.with_columns(hash_ids=np.array([k for ks in keys for k in ks], dtype=np.int64),
                                      hash_offsets=offsets_from_counts(np.array([len(k) for k in keys])))
    hits = infinite_cache_hits(expanded)
    assert hits.sum() > 0
    assert infinite_cache_hits(by_tokens).tolist() == hits.tolist()
    assert hits.tolist() == infinite_cache_hits(mooncake).tolist()
