"""Records feed the serving core as the contract says, and trace-level granularity expansion shares exactly
the blocks that the core's own expansion shares."""

from __future__ import annotations

from itertools import combinations

from kvplan import traces
from kvplan.engine.core.request import attach_block_keys, make_request
from tests.traces.trace_fixtures import MOONCAKE, write_jsonl
from kvplan.traces.transforms import expand_granularity

BLOCK = 16


def _leading_common(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def test_core_requests_from_records_share_what_the_expanded_trace_shares(tmp_path):
    trace = traces.load(write_jsonl(tmp_path, "m.jsonl", MOONCAKE))
    expanded = expand_granularity(trace, BLOCK)
    core_keys, trace_ids = [], []
    for record, small in zip(trace.records(), expanded.records(), strict=True):
        request = make_request(record.request_id, max_tokens=record.output_tokens,
                               prompt_len=record.prompt_tokens, prefix_hashes=list(record.prefix_hashes),
                               hash_granularity=record.hash_granularity, arrival_s=record.arrival_s)
        attach_block_keys(request, BLOCK)
        full_blocks = request.block_keys.num_hashed_blocks
        core_keys.append([request.block_keys.key(i) for i in range(full_blocks)])
        trace_ids.append(list(small.prefix_hashes[:full_blocks]))
    shared = [(_leading_common(core_keys[i], core_keys[j]), _leading_common(trace_ids[i], trace_ids[j]))
              for i, j in combinations(range(len(trace)), 2)]
    assert all(core == ours for core, ours in shared)
    assert sorted(core for core, _ in shared) == [32, 32, 12 * 32]
