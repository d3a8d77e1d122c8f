"""Block keys: chained, process-stable, and equal across granularities when the trace says so."""

from __future__ import annotations

import subprocess
import sys

import pytest

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
    base (the root's for the first) and the group's hash with the low bits cleared; the private keys chain_mix
    from the last hashed key on."""
    keys = HashBlockKeys([11, 22, 33], 64, 16, prompt_len=150, salt="r7")  # 9 hashed blocks, then private ones
    expected, base = [], ROOT_KEY
    for i in range(14):
        if i < 9:
            if i % 4 == 0:
                base = chain_mix(base, [11, 22, 33][i // 4], 0) & -4  # 4 sub-blocks per group: 2 bits
            expected.append(base + i % 4)
        else:
            expected.append(chain_mix(expected[-1], keys.salt, i))
    order = (1, 3, 0, 6, 8, 9, 13, 5)  # groups begun by one call and finished by a later one
    assert [keys.key(i) for i in order] == [expected[i] for i in order]
    assert keys.keys == expected


def test_request_salts_are_distinct_for_distinct_ids():
    """A request's salt keeps its own blocks apart from every other request's: numbered ids (the simulator's,
    through the int-tuple hash) and any other ids (blake2b) all get distinct salts, leading zeros included."""
    ids = [str(i) for i in range(200_000)] + ["07", "007", "00", "000", "r7", "7#1", "٣", "1" * 19]
    salts = [request_salt(i) for i in ids]
    assert len(set(salts)) == len(ids)
    assert request_salt("r7") == stable_id_hash("r7") and request_salt("٣") == stable_id_hash("٣")
    assert request_salt("7") != stable_id_hash("7")
