"""Prefill/decode disaggregation in the core (`remote_kv`): the decode side's WAITING_FOR_REMOTE_KVS admission and
the prefill side's held blocks, step by step against hand-checked sequences (vLLM 0.34's rules)."""

from __future__ import annotations

import random

import pytest

from kvplan.engine.core import RequestStatus, make_request
from tests.core.helpers import make_scheduler, run_to_completion, step

RECEIVING = RequestStatus.WAITING_FOR_REMOTE_KVS


def remote(rid: str, prompt_len: int, max_tokens: int = 3, **kw):
    return make_request(rid, prompt_len=prompt_len, max_tokens=max_tokens,
                        kv_transfer_params={"do_remote_prefill": True, "remote_engine_id": "p0"}, **kw)


def test_decode_side_parks_with_its_prompt_blocks_then_recomputes_the_last_token():
    sched = make_scheduler(block_size=4, num_blocks=16, budget=8)
    sched.add_request(remote("d", prompt_len=10))
    out, _ = step(sched)
    # parked: no compute, blocks for all 10 prompt tokens (3 blocks), one load of tokens [0, 10)
    assert out.scheduled == [] and out.num_batched_tokens == 0
    assert [(ld.request_id, ld.first_token, ld.num_tokens, len(ld.block_ids)) for ld in out.kv_loads] == [
        ("d", 0, 10, 3)]
    request = sched.requests["d"]
    assert request.status is RECEIVING and sched.kv.num_free_blocks == 13
    assert sched.has_unfinished() and sched.num_unfinished == 1
    assert request.kv_transfer_params == {"do_remote_prefill": False, "remote_engine_id": "p0"}
    for _ in range(3):  # nothing to do until the transfer is reported: empty steps, no scheduler error
        out, _ = step(sched)
        assert out.is_empty and not out.kv_loads
    sched.finished_recving(["d"])
    out, _ = step(sched)
    # admitted with the last prompt token only, which samples the first output token
    assert [(i.request_id, i.start_pos, i.num_new_tokens, i.samples, i.is_decode) for i in out.scheduled] == [
        ("d", 9, 1, True, False)]
    assert request.num_output_tokens == 1 and sched.kv.num_free_blocks == 13
    assert [r.request_id for r in run_to_completion(sched)] == ["d"]
    assert sched.kv.num_free_blocks == 16


def test_local_prefix_hits_shrink_the_load_and_received_blocks_are_keyed_only_after_arrival():
    sched = make_scheduler(block_size=4, num_blocks=32, budget=64, enable_prefix_caching=True)
    hashes = [11, 12, 13, 14]
    sched.add_request(make_request("warm", prompt_len=12, max_tokens=1, prefix_hashes=hashes[:3],
                                   hash_granularity=4))
    run_to_completion(sched)  # blocks 11, 12, 13 now cached
    sched.add_request(remote("d", prompt_len=16, prefix_hashes=hashes, hash_granularity=4))
    out, _ = step(sched)
    (load,) = out.kv_loads
    assert (load.first_token, load.num_tokens, len(load.block_ids)) == (12, 4, 1)
    assert sched.requests["d"].num_cached_tokens == 12
    # a second request over the same prefix sees only the local hits while the fourth block is in flight
    probe = make_request("probe", prompt_len=17, max_tokens=1, prefix_hashes=hashes, hash_granularity=4)
    sched.add_request(probe)
    assert len(sched.kv.find_cached_prefix(probe)) == 3
    sched.abort("probe")
    sched.finished_recving({"d"})
    step(sched)
    assert len(sched.kv.find_cached_prefix(probe)) == 4


def test_holders_go_first_in_load_order_and_a_refused_holder_ends_admissions():
    sched = make_scheduler(block_size=4, num_blocks=64, budget=64, max_seqs=2)
    for rid in ("a", "b", "c"):
        sched.add_request(remote(rid, prompt_len=8, max_tokens=5))
    out, _ = step(sched)
    assert [ld.request_id for ld in out.kv_loads] == ["a", "b", "c"]  # parking takes no sequence slot
    sched.add_request(make_request("plain", prompt_len=4, max_tokens=5))
    sched.finished_recving(["c", "a"])
    out, _ = step(sched)
    # a and c (load order), b still receiving is skipped; the two slots are then full: plain waits
    assert [i.request_id for i in out.scheduled] == ["a", "c"]
    sched.finished_recving(["b"])
    out, _ = step(sched)
    assert [i.request_id for i in out.scheduled] == ["a", "c"]  # b received, refused (no slot): plain waits too
    # (not even promoted: vLLM looks at a holder only while there is room to admit it)
    assert sched.requests["b"].status is RECEIVING and sched.num_unfinished == 4
    done = [r.request_id for r in run_to_completion(sched)]
    assert sorted(done) == ["a", "b", "c", "plain"] and done.index("b") < done.index("plain")


def test_a_load_that_does_not_fit_waits_at_the_head():
    sched = make_scheduler(block_size=4, num_blocks=4, budget=64)
    sched.add_request(remote("big", prompt_len=12, max_tokens=2))
    sched.add_request(remote("next", prompt_len=8, max_tokens=2))
    out, _ = step(sched)
    assert [ld.request_id for ld in out.kv_loads] == ["big"]  # 3 of 4 blocks: "next" needs 2
    sched.finished_recving(["big"])
    out, _ = step(sched)
    assert [i.request_id for i in out.scheduled] == ["big"] and out.kv_loads == []
    out, result = step(sched)  # big's second token finishes it; its blocks are freed after the step's admissions
    assert [r.request_id for r in result.finished] == ["big"] and not out.kv_loads
    out, _ = step(sched)
    assert [ld.request_id for ld in out.kv_loads] == ["next"] and sched.requests["next"].status is RECEIVING
    sched.finished_recving(["next"])
    assert [r.request_id for r in run_to_completion(sched)] == ["next"]


def test_prefill_side_holds_its_blocks_until_finished_sending():
    sched = make_scheduler(block_size=4, num_blocks=16, budget=64)
    sched.add_request(make_request("p", prompt_len=10, max_tokens=1,
                                   kv_transfer_params={"do_remote_decode": True}))
    sched.add_request(make_request("q", prompt_len=10, max_tokens=1))
    _, result = step(sched)
    assert sorted(r.request_id for r in result.finished) == ["p", "q"]
    assert list(result.kv_sends) == ["p"] and len(result.kv_sends["p"]) == 3
    assert not sched.has_unfinished() and sched.kv.num_free_blocks == 13  # q's freed, p's held
    assert sched.requests.get("p") is None
    sched.finished_sending(["p"])
    assert sched.kv.num_free_blocks == 16
    with pytest.raises(ValueError, match="holds no blocks"):
        sched.finished_sending(["p"])


def test_abort_while_receiving_frees_only_when_the_transfer_is_over():
    sched = make_scheduler(block_size=4, num_blocks=16, budget=64)
    sched.add_request(remote("d", prompt_len=8))
    step(sched)
    assert sched.abort("d") and sched.kv.num_free_blocks == 14 and not sched.has_unfinished()
    sched.finished_recving(["d"])
    assert sched.kv.num_free_blocks == 16
    with pytest.raises(ValueError, match="not waiting for remote KV"):
        sched.finished_recving(["d"])


def test_n_above_one_is_rejected():
    sched = make_scheduler()
    assert not sched.add_request(remote("d", prompt_len=8, n=2))
    out, _ = step(sched)
    assert out.rejected and "kv_transfer_params" in out.rejected[0][1]


def test_brute_force_decode_side_against_a_reference_model():
    """Random arrivals and transfer completions on a cache that is never short of blocks or slots: each request's
    first token comes exactly one step after the step its transfer is reported in (or its parking step, if
    later), and it then decodes one token per step - the reference timing of vLLM's WAITING_FOR_REMOTE_KVS."""
    rng = random.Random(7)
    for _ in range(20):
        sched = make_scheduler(block_size=4, num_blocks=512, budget=256, max_seqs=64)
        arrive = {f"r{i}": rng.randrange(0, 10) for i in range(12)}
        delay = {rid: rng.randrange(0, 4) for rid in arrive}
        outputs = {rid: rng.randrange(1, 6) for rid in arrive}
        parked_at: dict[str, int] = {}
        first_token: dict[str, int] = {}
        finished: dict[str, int] = {}
        for t in range(60):
            for rid, at in arrive.items():
                if at == t:
                    sched.add_request(remote(rid, prompt_len=rng.randrange(1, 30), max_tokens=outputs[rid]))
            done = [rid for rid, at in parked_at.items() if at + delay[rid] == t - 1]
            sched.finished_recving(done)  # reported between step t-1 and step t
            out, result = step(sched)
            for load in out.kv_loads:
                parked_at[load.request_id] = t
            for item in out.scheduled:
                first_token.setdefault(item.request_id, t)
            for request in result.finished:
                finished[request.request_id] = t
        for rid, at in arrive.items():
            assert parked_at[rid] == at
            assert first_token[rid] == at + delay[rid] + 1
            assert finished[rid] == first_token[rid] + outputs[rid] - 1
        assert sched.kv.num_free_blocks == 512
