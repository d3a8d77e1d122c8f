"""The hybrid KV allocator (sliding-window + full-attention groups over one pool): hand-computed layouts and
block counts, and property tests of its invariants.

Invariants (DESIGN.md, per group):
* no leak: every block's ref count equals the group tables holding it, each group's blocks-in-use count is exact,
  and after every request ends (finish, abort, preemption) every block is free;
* a sliding group never holds more of one request's blocks than vLLM's bound: cdiv(sliding_window - 1 + n, b) + 1
  in a step scheduling n tokens (its `max_admission_blocks_per_request`), so cdiv(sliding_window, b) + 1 decoding;
* a prefix hit is valid for every group (full groups: every block cached, sliding groups: the window's blocks
  before the hit) and is the longest such prefix;
* the full group behaves as the single-group manager: without memory pressure the hybrid scheduler makes the
  uniform scheduler's decisions, and its full group holds the uniform tables' shapes;
* liveness: every accepted request finishes.
"""

from __future__ import annotations

import copy
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvplan.engine.core import CacheConfig, RequestStatus, Scheduler, SchedulerConfig, make_request
from kvplan.engine.core.block_keys import TokenBlockKeys
from kvplan.engine.core.config import HybridCacheConfig
from kvplan.engine.core.kv_groups import HybridKVCacheManager
from kvplan.engine.core.kv_layout import FULL, SLIDING, KVLayout, cdiv
from tests.core.invariants import check_pool

SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
GEMMA3_27B = tuple((SLIDING,) * 5 + (FULL,)) * 10 + (SLIDING,) * 2  # 62 layers: 52 sliding, 10 full


# -- layouts and block counts, by hand ------------------------------------------------------------------------
def test_gemma3_27b_groups_as_vllm():
    layout = KVLayout.from_layer_types(GEMMA3_27B, 1024)
    # 10 full layers is the smallest bucket; 52 sliding layers make cdiv(52, 10) = 6 groups of layers i::6
    assert layout.group_size == 10 and layout.hybrid and layout.num_layers == 62
    assert [(g.kind, g.num_layers) for g in layout.groups] == [(SLIDING, 9)] * 4 + [(SLIDING, 8)] * 2 + [(FULL, 10)]


def test_nearly_balanced_kinds_pad_the_smaller():
    # gpt-oss-20b: 12 sliding + 12 full -> one group each; 12 + 13 (with a drafter): 13 < 1.5 * 12, one group each
    assert KVLayout.from_layer_types((SLIDING, FULL) * 12, 128).group_size == 12
    layout = KVLayout.from_layer_types((SLIDING, FULL) * 12 + (FULL,), 128)
    assert layout.group_size == 13 and [g.num_layers for g in layout.groups] == [12, 13]
    # 20 full + 30 sliding: 30 is not under 1.5 * 20, so groups of 20: one full, two sliding of 15
    layout = KVLayout.from_layer_types((FULL,) * 20 + (SLIDING,) * 30, 512)
    assert layout.group_size == 20 and [(g.kind, g.num_layers) for g in layout.groups] == [
        (FULL, 20), (SLIDING, 15), (SLIDING, 15)]
    assert not KVLayout.from_layer_types((FULL,) * 4, None).hybrid


def test_block_count_is_memory_over_group_size_pages():
    layout = KVLayout.from_layer_types(GEMMA3_27B, 1024)
    page = 2 * 16 * 128 * 2 * 16  # K and V, 16 KV heads of 128 dims, fp16, 16 tokens: 128 KiB per layer
    memory = 10 * 2**30
    assert layout.num_blocks(memory, page) == 8192  # 10 GiB / (10 layers x 128 KiB)
    assert memory // (62 * page) == 1321  # the uniform layout: every block id holds all 62 layers
    assert layout.blocks_from_uniform(1321) == 1321 * 62 // 10 == 8190


def test_layer_kinds_are_checked():
    for kinds, window in (((SLIDING, "linear_attention"), 8), ((SLIDING, FULL), None), ((SLIDING, FULL), 1)):
        try:
            KVLayout.from_layer_types(kinds, window)
        except ValueError as exc:
            assert "model." in str(exc)
        else:
            raise AssertionError(f"{kinds} with window {window} accepted")


def small_layout(window: int, sliding: int = 2) -> KVLayout:
    return KVLayout.from_layer_types((SLIDING,) * sliding + (FULL,), window)


def test_decode_holds_the_window_and_the_full_history():
    # block 4, window 10: while computing token c the sliding group keeps tokens c - 9 .. c
    cache = HybridCacheConfig(block_size=4, num_blocks=200, max_model_len=100, kv_layout=small_layout(10))
    sched = Scheduler(cache, SchedulerConfig(max_num_batched_tokens=64))
    sched.add_request(make_request("a", prompt_token_ids=list(range(30)), max_tokens=40))
    kv = sched.kv
    while sched.has_unfinished():
        out = sched.schedule()
        request = sched.requests["a"]
        c = request.num_computed_tokens  # before the step: the step writes c .. c + n - 1
        n = out.scheduled[0].num_new_tokens
        full, s1, s2 = (kv.managers[g].tables["a"] for g in (2, 0, 1))
        assert len(full) == cdiv(c + n, 4) and None not in full
        for table in (s1, s2):
            gone = max(0, c - 9) // 4
            assert table[:gone] == [None] * gone and None not in table[gone:]
            assert len(table) - gone == (cdiv(c + n, 4) - gone)
            if n == 1:
                assert len(table) - gone <= cdiv(10, 4) + 1  # 4 blocks: a 10-token window straddles block edges
        sched.update(out)
    assert kv.pool.num_used == 0 and kv.group_used == [0, 0, 0]


def test_admission_needs_every_groups_peak():
    # 2 sliding groups (window 8: 7 tokens kept) + 1 full, block 4, steps of 16. Writing positions 0..38, the peak
    # is a step [21, 37): full cdiv(37, 4) = 10 blocks, each sliding group 10 - (21 - 7) // 4 = 7: 24 in all.
    # Positions 0..62 peak at [45, 61): 16 + 2 * (16 - 38 // 4) = 30.
    cache = HybridCacheConfig(block_size=4, num_blocks=24, max_model_len=64, kv_layout=small_layout(8))
    assert cache.peak_blocks(39, 16) == 24 and cache.peak_blocks(63, 16) == 30
    for n in (1, 5, 17, 39, 63):  # the candidate starts find what every start gives
        brute = max(sum(cdiv(min(s + 16, n), 4) - (max(0, s - k) // 4 if k else 0) for k in (7, 7, 0))
                    for s in range(n))
        assert cache.peak_blocks(n, 16) == brute
    sched = Scheduler(cache, SchedulerConfig(max_num_batched_tokens=16))
    assert sched.rejection_reason(make_request("ok", prompt_len=20, max_tokens=20)) is None
    reason = sched.rejection_reason(make_request("huge", prompt_len=60, max_tokens=4))
    assert reason.startswith("needs 30 KV blocks at its peak over 3 KV cache groups")


def test_hybrid_refuses_swap_and_streaming_windows():
    for extra in ({"num_cpu_blocks": 8}, {"window_tokens": 16}):
        try:
            HybridCacheConfig(block_size=4, num_blocks=64, max_model_len=32, kv_layout=small_layout(8), **extra)
        except ValueError as exc:
            assert str(exc).startswith("cache.")
        else:
            raise AssertionError(f"{extra} accepted")


# -- prefix hits: the longest valid for every group ------------------------------------------------------------
@settings(max_examples=100, **SETTINGS)
@given(bs=st.sampled_from([2, 4]), window=st.integers(2, 12), blocks=st.integers(1, 12),
       cached=st.lists(st.lists(st.booleans(), min_size=12, max_size=12), min_size=3, max_size=3))
def test_hit_is_the_longest_valid_for_every_group(bs, window, blocks, cached):
    cache = HybridCacheConfig(block_size=bs, num_blocks=64, max_model_len=64, kv_layout=small_layout(window))
    kv = HybridKVCacheManager(cache, 16)
    request = make_request("r", prompt_token_ids=list(range(blocks * bs + 1)), max_tokens=1)
    request.block_keys = TokenBlockKeys(request.token_ids, bs)
    request.block_keys.key(blocks - 1)
    keys = request.block_keys.keys
    for g, m in enumerate(kv.managers):  # a cached free block under the group's key wherever `cached` says
        for i in range(blocks):
            if cached[g][i]:
                block = kv.pool.allocate()
                kv.pool.register(block, keys[i] ^ m.key_salt)
                kv.pool.release(block)
    hits = kv.find_cached_prefix(request)
    need = cdiv(window - 1, bs)

    def valid(n: int) -> bool:
        full = all(cached[2][:n])
        return full and all(all(cached[g][max(0, n - need):n]) for g in (0, 1))

    assert len(hits) == max(n for n in range(blocks + 1) if valid(n))
    for g, m in enumerate(kv.managers):
        assert len(hits.blocks[g]) == len(hits)
        for i, block in enumerate(hits.blocks[g]):
            if block is None:
                assert m.config.windowed and i < len(hits) - need  # only outside a sliding window
            else:
                assert block.key == keys[i] ^ m.key_salt


# -- the scheduler over random streams ----------------------------------------------------------------------------
def check_hybrid(sched: Scheduler, step_tokens: dict[str, int]) -> None:
    kv = sched.kv
    tables = {(g, rid): t for g, m in enumerate(kv.managers) for rid, t in m.tables.items()}
    check_pool(kv.pool, tables)
    for g, m in enumerate(kv.managers):
        held = {b.block_id for t in m.tables.values() for b in t if b is not None}
        assert len(held) == kv.group_used[g], f"group {g}: {len(held)} blocks held, counted {kv.group_used[g]}"
        assert set(m.tables) == set(kv.managers[0].tables) <= set(sched.requests)
        window = kv.layout.groups[g].sliding_window
        for rid, table in m.tables.items():
            blocks = sum(1 for b in table if b is not None)
            if m.config.windowed:
                n = step_tokens.get(rid, 1)  # its last step's tokens: what it holds until it next allocates
                bound = cdiv(window - 1 + n, kv.block_size) + 1
                assert blocks <= bound, f"{rid}: sliding group {g} holds {blocks} > {bound} blocks"
                assert blocks <= kv.sliding_cap
            else:
                assert blocks == len(table), "a full group never has holes"
    for request in sched.running:
        assert request.request_id in kv.managers[0].tables


def random_prompts(rng: random.Random, count: int, bs: int) -> list[list[int]]:
    stems = [[rng.randrange(50) for _ in range(rng.randrange(bs, 8 * bs))] for _ in range(3)]
    return [rng.choice(stems)[:rng.randrange(0, 8 * bs)] + [rng.randrange(50) for _ in range(rng.randrange(1, 6 * bs))]
            for _ in range(count)]


@settings(max_examples=40, **SETTINGS)
@given(seed=st.integers(0, 10**6), bs=st.sampled_from([2, 4, 8]), window=st.integers(2, 40),
       sliding=st.integers(1, 3), budget=st.sampled_from([8, 16, 64]), spare=st.integers(0, 40),
       full_isl=st.booleans(), caching=st.booleans())
def test_random_streams_keep_every_invariant(seed, bs, window, sliding, budget, spare, full_isl, caching):
    rng = random.Random(seed)
    layout = small_layout(window, sliding)
    max_len = 24 * bs
    probe = HybridCacheConfig(block_size=bs, num_blocks=10**6, max_model_len=max_len, kv_layout=layout)
    floor = probe.peak_blocks(max_len - 1, budget)  # the smallest cache every request fits alone
    cache = HybridCacheConfig(block_size=bs, num_blocks=floor + spare, max_model_len=max_len, kv_layout=layout,
                              enable_prefix_caching=caching)
    sched = Scheduler(cache, SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=6,
                                             scheduler_reserve_full_isl=full_isl))
    prompts = random_prompts(rng, 14, bs)
    arrivals = sorted(rng.randrange(0, 30) for _ in prompts)
    accepted, finished, step = set(), set(), 0
    last: dict[str, int] = {}  # request id -> tokens of its latest scheduled step
    probes = 0
    while step < 5000 and (arrivals or sched.has_unfinished()):
        while arrivals and arrivals[0] <= step:
            arrivals.pop(0)
            i = len(accepted) + 100 * step
            prompt = prompts.pop()
            tokens = rng.randrange(1, max(2, max_len - len(prompt)))
            request = make_request(f"r{i}", prompt_token_ids=prompt, max_tokens=tokens)
            if sched.add_request(request):
                accepted.add(request.request_id)
        if rng.random() < 0.03 and sched.requests:
            rid = rng.choice(sorted(sched.requests))
            sched.abort(rid)
            accepted.discard(rid)
        if not sched.has_unfinished():
            step += 1
            continue
        if len(sched.waiting) and step % 10 == 0 and probes < 4:  # a few per stream: a copy is not cheap
            check_can_allocate(sched)
            probes += 1
        out = sched.schedule()
        last.update({item.request.request_id: item.num_new_tokens for item in out.scheduled})
        check_hybrid(sched, last)
        for item in out.scheduled:
            if item.num_cached_tokens:  # an admission's hit: valid for every group
                check_hit(sched.kv, item.request, item.num_cached_tokens // bs)
        result = sched.update(out, [rng.randrange(50) for _ in out.scheduled])
        finished.update(r.request_id for r in result.finished)
        check_hybrid(sched, last)
        step += 1
    assert not sched.has_unfinished(), "not every accepted request finished"
    assert accepted <= finished | {r for r in accepted if sched.requests.get(r) is None}
    assert accepted == finished & accepted
    pool = sched.kv.pool
    assert all(b.ref_cnt == 0 for b in pool.blocks) and pool.num_free == pool.num_blocks
    assert sched.kv.group_used == [0] * len(layout.groups)
    sched.reset_prefix_cache()
    assert pool.num_empty == pool.num_blocks and not pool.cached


def check_can_allocate(sched: Scheduler) -> None:
    """`can_allocate` (which changes nothing) answers what `allocate` does, for the waiting head and for every
    running request's next step, a window's release included."""
    kv = sched.kv
    head = sched.waiting.peek()
    hits = kv.find_cached_prefix(head)
    cases = [(head, max(1, min(8, head.num_tokens - len(hits) * kv.block_size)), hits)]
    cases += [(r, 1, None) for r in sched.running[:3]]
    for request, n, group_hits in cases:
        for reserve in (0, 3):
            said = kv.can_allocate(request, n, group_hits, reserve)
            trial = copy.deepcopy(sched)  # allocate on a copy: the real state stays as it is
            twin = trial.requests[request.request_id]
            twin_hits = trial.kv.find_cached_prefix(twin) if group_hits is not None else None
            assert said == (trial.kv.allocate(twin, n, twin_hits, reserve) is not None)


def check_hit(kv: HybridKVCacheManager, request, blocks: int) -> None:
    keys = request.block_keys.keys
    need = cdiv(kv.window - 1, kv.block_size)
    for m in kv.managers:
        table = m.tables[request.request_id]
        start = max(0, blocks - need) if m.config.windowed else 0
        for i in range(start, blocks):  # every block a group must read at the hit's end is the cached one
            assert table[i] is not None and table[i].key == keys[i] ^ m.key_salt


@settings(max_examples=25, **SETTINGS)
@given(seed=st.integers(0, 10**6), bs=st.sampled_from([2, 4]), window=st.integers(2, 30),
       budget=st.sampled_from([8, 32]))
def test_full_group_behaves_as_the_single_group_manager(seed, bs, window, budget):
    """Without memory pressure (nothing evicted, nobody preempted) the hybrid scheduler schedules exactly as the
    uniform one, hits included (a freed sliding block stays cached), and its full group's tables have the uniform
    tables' shapes."""
    rng = random.Random(seed)
    prompts = random_prompts(rng, 10, bs)
    outputs = [rng.randrange(1, 30) for _ in prompts]
    layout = small_layout(window)
    uniform = Scheduler(CacheConfig(block_size=bs, num_blocks=4000, max_model_len=256),
                        SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=4))
    hybrid = Scheduler(HybridCacheConfig(block_size=bs, num_blocks=12000, max_model_len=256, kv_layout=layout),
                       SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=4))
    for step in range(400):
        for sched in (uniform, hybrid):
            if step < len(prompts):
                sched.add_request(make_request(f"r{step}", prompt_token_ids=list(prompts[step]),
                                               max_tokens=outputs[step]))
        if not uniform.has_unfinished():
            break
        a, b = uniform.schedule(), hybrid.schedule()
        assert [(i.request.request_id, i.num_new_tokens, i.start_pos, i.num_cached_tokens) for i in a.scheduled] == \
               [(i.request.request_id, i.num_new_tokens, i.start_pos, i.num_cached_tokens) for i in b.scheduled]
        full = hybrid.kv.managers[2]
        for rid, table in uniform.kv.tables.items():
            assert len(full.tables[rid]) == len(table)
            assert hybrid.requests[rid].num_hashed_blocks == uniform.requests[rid].num_hashed_blocks
        tokens = [7] * len(a.scheduled)
        fa, fb = uniform.update(a, tokens), hybrid.update(b, tokens)
        assert [r.request_id for r in fa.finished] == [r.request_id for r in fb.finished]
    assert not hybrid.has_unfinished() and hybrid.stats.num_preemptions == 0
    assert hybrid.kv.prefix_hits == uniform.kv.prefix_hits
    assert all(r.status is not RequestStatus.RUNNING for r in hybrid.requests.values())
