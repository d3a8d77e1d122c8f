"""The memory breakdown's slot sums (`metrics._table_slots`) against their definition, by brute force."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.engine.core import make_request
from kvplan.engine.core.block_pool import KVBlock
from kvplan.engine.core.metrics import _table_slots


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(-1, 30), max_size=12), st.integers(0, 200), st.integers(1, 200),
                          st.integers(1, 60)), max_size=8),
       st.sampled_from([1, 4, 16]), st.lists(st.integers(0, 30), max_size=4))
def test_table_slots_count_a_shared_block_once_with_its_largest_value(tables, bs, other_holders):
    """The breakdown's slot sums against the definition, by brute force: over the distinct blocks of the live
    tables (-1: a hole), each block's largest written / final slot count of any holder. Every table entry holds one
    reference to its block, as in the pool; `other_holders` add references from outside the tables (a table of a
    request the breakdown is not given, a P/D hold)."""
    blocks = {i: KVBlock(i) for i in range(31)}
    for ids, *_ in tables:
        for block_id in ids:
            if block_id != -1:
                blocks[block_id].ref_cnt += 1
    for block_id in other_holders:
        blocks[block_id].ref_cnt += 1
    requests, tables_of, ids_of = [], {}, {}
    for i, (ids, computed, prompt, max_tokens) in enumerate(tables):
        request = make_request(f"r{i}", prompt_len=prompt, max_tokens=max_tokens)
        request.num_computed_tokens = computed
        requests.append(request)
        ids_of[request.request_id] = ids
        tables_of[request.request_id] = [None if block_id == -1 else blocks[block_id] for block_id in ids]
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
    assert _table_slots(tables_of, requests, bs, 8) == (sum(written.values()), sum(final.values()))


def test_the_shortcut_scans_on_behind_a_block_whose_key_has_another_copy():
    """The pattern a shortcut stopping at every first block of one reference would miss: r's block 1 is a later
    copy of key 11 (its first copy, block 5, held by s), so s's prefix hit took that copy and then r's own block
    2 - shared behind a block of one reference. The shortcut scans on behind it (the key is in `duplicates`) and
    stops only at block 3, whose key has one copy; the sums equal the full scan's."""
    blocks = [KVBlock(i) for i in range(6)]
    keys = {0: 10, 1: 11, 2: 12, 3: 13, 5: 11}
    for block_id, key in keys.items():
        blocks[block_id].key = key
    r = make_request("r", prompt_len=16, max_tokens=4)
    s = make_request("s", prompt_len=12, max_tokens=4)
    r.num_computed_tokens, s.num_computed_tokens = 16, 12
    tables = {"r": [blocks[0], blocks[1], blocks[2], blocks[3]], "s": [blocks[0], blocks[5], blocks[2]]}
    for table in tables.values():
        for block in table:
            block.ref_cnt += 1
    duplicates = {11: [blocks[1]]}
    full = _table_slots(tables, [r, s], 4, 6)
    assert full == (16 + 4, 16 + 4)  # r's 4 blocks and s's one of its own (block 5): block 2 counted once
    assert _table_slots(tables, [r, s], 4, 6, True, duplicates) == full
    assert _table_slots(tables, [r, s], 4, 6, True, {}) != full  # stopping at r's block 1 misses block 2
