"""Prefix hits, copy-on-write, swap and sink+window on the paged KV manager."""

from __future__ import annotations

from kvplan.engine.core import CacheConfig, make_request
from kvplan.engine.core.kv_manager import KVCacheManager
from kvplan.engine.core.request import attach_block_keys
from tests.core.helpers import make_scheduler, run_to_completion, step


def computed_request(kv: KVCacheManager, rid: str, tokens: list[int]):
    """A request whose whole prompt is computed and registered."""
    request = make_request(rid, prompt_token_ids=tokens, max_tokens=4)
    attach_block_keys(request, kv.block_size)
    assert kv.allocate(request, len(tokens)) == ()
    request.num_computed_tokens = len(tokens)
    kv.commit(request, len(tokens))
    return request


def test_prefix_hit_covers_full_blocks_only_and_never_the_last_token():
    sched = make_scheduler(block_size=4)
    tokens = list(range(10))
    sched.add_request(make_request("a", prompt_token_ids=tokens, max_tokens=1))
    run_to_completion(sched)  # a's blocks [0..3], [4..7] are cached; [8, 9, x] is partial
    cases = {"same": (tokens, 8), "exactly_two_blocks": (tokens[:8], 4), "one_block_then_diverge":
             (tokens[:4] + [99] * 6, 4), "first_block_differs": ([99, *tokens[1:]], 0), "short": (tokens[:4], 0)}
    for name, (prompt, expected) in cases.items():
        sched.add_request(make_request(name, prompt_token_ids=prompt, max_tokens=1))
        out, _ = step(sched)
        (item,) = out.scheduled
        assert item.num_cached_tokens == expected, name
        assert item.start_pos == expected and item.num_new_tokens == len(prompt) - expected
    queries = 10 + 10 + 8 + 10 + 10 + 4
    assert sched.kv.prefix_queries == queries and sched.kv.prefix_hits == 8 + 4 + 4


def test_fork_shares_all_blocks_and_copy_on_write_copies_the_partial_tail_once():
    kv = KVCacheManager(CacheConfig(block_size=4, num_blocks=8, max_model_len=32))
    parent = computed_request(kv, "p", list(range(10)))  # 3 blocks, the last one holds 2 tokens
    child = parent.spawn("c")
    kv.fork(parent, child)
    assert [b.ref_cnt for b in kv.tables["p"]] == [2, 2, 2]
    assert kv.pool.num_used == 3
    copies = kv.allocate(child, 1)  # the child writes position 10, inside the shared partial block
    assert copies == ((kv.tables["p"][2].block_id, kv.tables["c"][2].block_id),)
    assert kv.tables["c"][:2] == kv.tables["p"][:2] and kv.tables["c"][2] is not kv.tables["p"][2]
    assert kv.allocate(parent, 1) == ()  # the parent is now the only holder: it writes in place
    kv.free(child)
    kv.free(parent)
    assert kv.pool.num_used == 0


def test_freeing_is_tail_first():
    kv = KVCacheManager(CacheConfig(block_size=2, num_blocks=8, max_model_len=16, enable_prefix_caching=True))
    request = computed_request(kv, "r", list(range(6)))
    ids = [b.block_id for b in kv.tables["r"]]
    kv.free(request)
    policy = kv.pool.policy
    assert [policy.evict().block_id for _ in range(len(policy))] == ids[::-1]  # the eviction order


def test_swap_out_and_in_move_every_block():
    kv = KVCacheManager(CacheConfig(block_size=4, num_blocks=8, num_cpu_blocks=4, max_model_len=32))
    request = computed_request(kv, "r", list(range(10)))
    gpu_ids = list(kv.block_ids["r"])
    out = kv.swap_out([request])
    assert [g for g, _ in out] == gpu_ids and kv.cpu_pool.num_used == 3 and "r" not in kv.tables
    assert kv.swap_in_cost([request], [1]) == 3  # position 10 still fits in the last block
    back = kv.swap_in([request])
    assert [c for c, _ in back] == [c for _, c in out] and kv.cpu_pool.num_used == 0
    assert kv.block_ids["r"] == [g for _, g in back]


def test_a_group_swaps_its_shared_blocks_once_and_shares_them_again():
    kv = KVCacheManager(CacheConfig(block_size=4, num_blocks=8, num_cpu_blocks=4, max_model_len=32))
    parent = computed_request(kv, "p", list(range(10)))  # 3 blocks; both siblings still share all three
    child = parent.spawn("c")
    kv.fork(parent, child)
    out = kv.swap_out([parent, child])
    assert len(out) == 3 and kv.cpu_pool.num_used == 3 and kv.pool.num_used == 0
    assert kv.cpu_tables["p"] == kv.cpu_tables["c"] and all(b.ref_cnt == 2 for b in kv.cpu_tables["p"])
    # Swap-in: the 3 shared blocks, plus one copy-on-write copy of the partial tail for the first writer.
    assert kv.swap_in_cost([parent, child], [1, 1]) == 4
    assert kv.swap_in_cost([parent, child], [1, 0]) == 4 and kv.swap_in_cost([parent, child], [0, 0]) == 3
    back = kv.swap_in([parent, child])
    assert len(back) == 3 and kv.cpu_pool.num_used == 0 and kv.pool.num_used == 3
    assert kv.tables["p"] == kv.tables["c"] and all(b.ref_cnt == 2 for b in kv.tables["p"])
    assert len(kv.allocate(parent, 1)) == 1 and kv.allocate(child, 1) == ()
    assert kv.pool.num_used == 4


def test_swap_out_fails_cleanly_when_the_cpu_pool_is_full():
    kv = KVCacheManager(CacheConfig(block_size=4, num_blocks=8, num_cpu_blocks=2, max_model_len=32))
    request = computed_request(kv, "r", list(range(10)))
    assert kv.swap_out([request]) is None and len(kv.tables["r"]) == 3


def retained_positions(table: list, num_computed: int, block_size: int) -> list[tuple[int, int]]:
    """The token ranges [start, end) whose KV a table still holds: its runs of blocks, clipped at the computed
    tokens."""
    ranges, i = [], 0
    while i < len(table):
        j = i
        while j < len(table) and table[j] is not None:
            j += 1
        if j > i and i * block_size < min(j * block_size, num_computed):
            ranges.append((i * block_size, min(j * block_size, num_computed)))
        i = max(j, i + 1)
    return ranges


def test_sink_and_window_keep_only_sink_and_recent_blocks():
    sched = make_scheduler(block_size=4, num_blocks=16, budget=64, sink_tokens=2, window_tokens=8,
                           max_model_len=200)
    sched.add_request(make_request("r", prompt_token_ids=list(range(30)), max_tokens=20))
    _, result = step(sched)
    table = sched.kv.tables["r"]
    held = [i for i, b in enumerate(table) if b is not None]
    assert held == [0, 5, 6, 7]  # sink block 0 and the blocks of tokens 22..29
    assert len(result.released["r"]) == 4
    assert retained_positions(table, sched.requests["r"].num_computed_tokens, 4) == [(0, 4), (20, 30)]
    for _ in range(19):
        step(sched)
        held = sum(1 for b in sched.kv.tables.get("r", []) if b is not None)
        assert held <= 1 + 2 + 1
