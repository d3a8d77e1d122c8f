"""Block keys: chained, process-stable, and equal across granularities when the trace says so."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.engine.core.block_keys import (
    ROOT_KEY,
    HashBlockKeys,
    TokenBlockKeys,
    chain_mix,
    request_salt,
    stable_id_hash,
)


def test_token_keys_are_chained_and_only_for_full_blocks():
    a = TokenBlockKeys([1, 2, 3, 4, 5, 6, 7], 3)
    b = TokenBlockKeys([9, 2, 3, 4, 5, 6], 3)
    assert a.key(2) is None  # tokens 6..8 are not all there
    assert a.key(0) != b.key(0)
    assert a.key(1) != b.key(1)  # same tokens [4, 5, 6], different parents


def test_keys_are_stable_across_processes():
    code = ("from kvplan.engine.core.block_keys import TokenBlockKeys, HashBlockKeys;"
            "print(TokenBlockKeys([5, 6, 7, 8], 2).key(1), HashBlockKeys([3, 4], 512, 16, 1000, 'x').key(40),"
            "HashBlockKeys([3], 512, 16, 1000, '12').key(40))")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": str(seed)}).stdout for seed in (1, 2)}
    assert len(runs) == 1
    local = (f"{TokenBlockKeys([5, 6, 7, 8], 2).key(1)} {HashBlockKeys([3, 4], 512, 16, 1000, 'x').key(40)} "
             f"{HashBlockKeys([3], 512, 16, 1000, '12').key(40)}\n")
    assert runs == {local}


def test_hash_granularity_expands_exactly_to_the_block_size():
    # Two requests sharing the first 512-token hash share exactly the first 32 blocks of 16 tokens.
    a = HashBlockKeys([10, 11], 512, 16, prompt_len=1024, salt="a")
    b = HashBlockKeys([10, 12], 512, 16, prompt_len=1024, salt="b")
    assert [a.key(i) for i in range(32)] == [b.key(i) for i in range(32)]
    assert a.key(32) != b.key(32)


def test_blocks_past_the_hashed_prompt_are_private_to_the_request():
    a = HashBlockKeys([10], 512, 16, prompt_len=100, salt="a")  # 6 full blocks inside the prompt
    b = HashBlockKeys([10], 512, 16, prompt_len=100, salt="b")
    assert a.key(5) == b.key(5)
    assert a.key(6) != b.key(6)  # block 6 holds prompt tail and generated tokens


def test_granularity_must_be_a_multiple_or_a_divisor_of_the_block_size():
    with pytest.raises(ValueError, match="granularity 512 is neither a multiple nor a divisor of block size 24"):
        HashBlockKeys([1], 512, 24, 100, "a")
    with pytest.raises(ValueError, match="granularity 16 is neither a multiple nor a divisor of block size 24"):
        HashBlockKeys([1], 16, 24, 100, "a")


def test_a_block_larger_than_the_granularity_is_shared_when_all_its_groups_are():
    """Blocks of 64 tokens over 16-token hashes (vLLM 0.34's default block on a 16-granular trace): a block is
    shared exactly when every group it covers is, whatever the groups hold - checked against a brute force over
    random pairs of hash lists."""
    import random

    rng = random.Random(3)
    for _ in range(200):
        a = [rng.randrange(4) for _ in range(rng.randint(1, 12))]
        b = a[:rng.randint(0, len(a))] + [rng.randrange(4) for _ in range(rng.randint(0, 6))]
        ka, kb = HashBlockKeys(a, 16, 64, 16 * len(a), "a"), HashBlockKeys(b, 16, 64, 16 * len(b), "b")
        blocks = min(len(a), len(b)) // 4
        expected = 0
        for i in range(blocks):
            if a[:4 * (i + 1)] != b[:4 * (i + 1)]:
                break
            expected += 1
        got = 0
        for i in range(blocks):
            if ka.key(i) != kb.key(i):
                break
            got += 1
        assert got == expected, (a, b)


def test_hash_keys_are_the_chain_mix_chain_whatever_order_they_are_asked_in():
    """A group's sub-blocks are its base and the keys after it, the base the chain_mix of the previous group's
    base (the root's for the first) and the group's hash with the low bits cleared; the private keys are one run
    from the chain_mix of the last hashed key, the salt and the run's first block, halved."""
    keys = HashBlockKeys([11, 22, 33], 64, 16, prompt_len=150, salt="r7")  # 9 hashed blocks, then private ones
    expected, base = [], ROOT_KEY
    for i in range(14):
        if i < 9:
            if i % 4 == 0:
                base = chain_mix(base, [11, 22, 33][i // 4], 0) & -4  # 4 sub-blocks per group: 2 bits
            expected.append(base + i % 4)
        else:
            expected.append((chain_mix(expected[8], keys.salt, 9) >> 1) + i - 9)
    order = (1, 3, 0, 6, 8, 9, 13, 5)  # groups begun by one call and finished by a later one
    assert [keys.key(i) for i in order] == [expected[i] for i in order]
    assert keys.keys == expected


def test_ids_that_name_their_prefixes_are_the_keys_under_the_plain_root_only():
    """Named ids key a block of one group by its id and a block of several by its last group's; an adapter's root,
    or a block smaller than a group, keeps the chained keys (which never equal the base model's)."""
    ids = [5, 9, 14, 20]  # 4 groups of 16 tokens
    assert [HashBlockKeys(ids, 16, 16, 64, "a", named=True).key(i) for i in range(4)] == ids
    assert [HashBlockKeys(ids, 16, 32, 64, "a", named=True).key(i) for i in range(2)] == [9, 20]
    chained = [HashBlockKeys(ids, 16, 16, 64, "a").key(i) for i in range(4)]
    adapter = HashBlockKeys(ids, 16, 16, 64, "a", root=ROOT_KEY + 1, named=True)
    assert not adapter.named and not set(adapter.key(i) for i in range(4)) & set(ids + chained)
    assert not HashBlockKeys(ids, 32, 16, 128, "a", named=True).named
    forked = HashBlockKeys(ids, 16, 16, 64, "a", named=True).fork(None, "a#1", 2)
    assert forked.named and forked.key(3) == 20


def test_request_salts_are_distinct_for_distinct_ids():
    """A request's salt keeps its own blocks apart from every other request's: numbered ids (the simulator's,
    through the int-tuple hash) and any other ids (blake2b) all get distinct salts, leading zeros included."""
    ids = [str(i) for i in range(200_000)] + ["07", "007", "00", "000", "r7", "7#1", "٣", "1" * 19]
    salts = [request_salt(i) for i in ids]
    assert len(set(salts)) == len(ids)
    assert request_salt("r7") == stable_id_hash("r7") and request_salt("٣") == stable_id_hash("٣")
    assert request_salt("7") != stable_id_hash("7")


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_requests_share_exactly_their_agreeing_trace_prefix_whatever_the_order_of_asking(data):
    """Against a brute force over random requests (hash lists over a small alphabet, prompts shorter or longer
    than their hashed span) and forks of them at random points: two requests' block i keys agree exactly when
    both blocks lie in the hashed span and the hash lists agree up to it - or when one is a fork that inherited
    block i's key from the other; a request's keys do not depend on the order it is asked for them in."""
    block_size = data.draw(st.sampled_from([4, 16]), label="block_size")
    granularity = data.draw(st.sampled_from([block_size, 4 * block_size, block_size // 2]), label="granularity")
    # Ids that name their prefixes (each distinct prefix of a hash list numbered, Mooncake's way): the same
    # sharing, keyed by id where a block holds whole groups (`named`)
    named = data.draw(st.booleans(), label="named")
    prefix_ids: dict[tuple[int, ...], int] = {}

    def ids_of(hashes: list[int]) -> list[int]:
        return [prefix_ids.setdefault(tuple(hashes[:j + 1]), len(prefix_ids)) for j in range(len(hashes))]

    requests = []  # (keys, hash_ids, hashed blocks, (parent index, inherited blocks) or None)
    for r in range(data.draw(st.integers(2, 6), label="requests")):
        if requests and data.draw(st.booleans(), label=f"fork {r}"):
            p = data.draw(st.integers(0, len(requests) - 1), label=f"parent {r}")
            parent, hash_ids, hashed, _ = requests[p]
            parent.key(data.draw(st.integers(0, 20), label=f"parent asked {r}"))
            keep = data.draw(st.integers(0, len(parent.keys)), label=f"kept {r}")
            child = parent.fork(None, f"{r}#1", keep)
            requests.append((child, hash_ids, hashed, (p, keep)))
            continue
        hash_ids = data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=6), label=f"hashes {r}")
        prompt = data.draw(st.integers(1, len(hash_ids) * granularity + 3 * block_size), label=f"prompt {r}")
        keys = HashBlockKeys(ids_of(hash_ids) if named else hash_ids, granularity, block_size, prompt, str(r),
                             named=named)
        assert keys.named == (named and granularity <= block_size)
        requests.append((keys, hash_ids, keys.num_hashed_blocks, None))
    blocks = 24
    for keys, *_ in requests:  # each asked in its own random order, then up to the last block
        for i in data.draw(st.lists(st.integers(0, blocks - 1), max_size=5), label="order"):
            keys.key(i)
        keys.key(blocks - 1)
    fresh = [HashBlockKeys(ids_of(h) if named else h, granularity, block_size, n * block_size, "x", named=named)
             for _, h, n, _ in requests]

    def origin(r: int, i: int) -> int:  # who computed r's block i key: r, or the fork ancestor it came from
        while requests[r][3] is not None and i < requests[r][3][1]:
            r = requests[r][3][0]
        return r

    def agree(a: int, b: int, i: int) -> bool:
        (_, ha, na, _), (_, hb, nb, _) = requests[a], requests[b]
        groups = -(-(i + 1) * block_size // granularity)  # the hash groups block i's contents depend on
        return (i < na and i < nb and ha[:groups] == hb[:groups]) or origin(a, i) == origin(b, i)

    for a in range(len(requests)):
        for i in range(min(requests[a][2], blocks)):  # the trace's keys are those of a fresh request's
            assert requests[a][0].keys[i] == fresh[a].key(i)
        for b in range(a + 1, len(requests)):
            for i in range(blocks):
                assert (requests[a][0].keys[i] == requests[b][0].keys[i]) == agree(a, b, i), (a, b, i)
    own = {k for keys, *_ in requests for k in keys.keys[keys.own_from:]}
    assert len(own) == sum(len(keys.keys) - keys.own_from for keys, *_ in requests)  # no run meets another
    assert not own & {k for keys, _, hashed, _ in requests for k in keys.keys[:hashed]}  # nor a trace key
