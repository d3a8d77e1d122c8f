"""The memory breakdown's slot sums (`metrics._table_slots`) against their definition, by brute force."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.engine.core import make_request
from kvplan.engine.core.metrics import _table_slots


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(-1, 30), max_size=12), st.integers(0, 200), st.integers(1, 200),
                          st.integers(1, 60)), max_size=8),
       st.sampled_from([1, 4, 16]))
def test_table_slots_count_a_shared_block_once_with_its_largest_value(tables, bs):
    """The breakdown's slot sums against the definition, by brute force: over the distinct block ids of the live
    tables (-1: a hole), each id's largest written / final slot count of any holder."""
    requests, ids_of = [], {}
    for i, (ids, computed, prompt, max_tokens) in enumerate(tables):
        request = make_request(f"r{i}", prompt_len=prompt, max_tokens=max_tokens)
        request.num_computed_tokens = computed
        requests.append(request)
        ids_of[request.request_id] = ids
    requests.append(make_request("no-table", prompt_len=5, max_tokens=5))  # holds no blocks: skipped
    written: dict[int, int] = {}
    final: dict[int, int] = {}
    for request in requests[:-1]:
        for p, block in enumerate(ids_of[request.request_id]):
            if block == -1:
                continue
            end = max(request.final_len, request.num_tokens)
            written[block] = max(written.get(block, 0), min(max(request.num_computed_tokens - p * bs, 0), bs))
            final[block] = max(final.get(block, 0), min(max(end - p * bs, 0), bs))
    assert _table_slots(ids_of, requests, bs, 8) == (sum(written.values()), sum(final.values()))
