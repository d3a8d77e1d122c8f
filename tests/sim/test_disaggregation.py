"""Prefill/decode disaggregation in the simulator (`sim.disagg`, `pd_run`, `pd_transfer`, `pd_spec`): bytes by the
model's layout, transfer time by the link, the TTFT parts, a reference run, and bad input."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from kvplan.cli import main
from kvplan.sim.pd_spec import Disaggregation
from kvplan.sim.pd_transfer import rank_bytes_per_token
from kvplan.sim.run import simulate
from kvplan.sim.spec import SimSpec
from kvplan.sim.specs.models import get_model
from kvplan.traces import Trace
from tests.sim.helpers import random_trace

PARTS = ["prefill_ttft_ms", "decode_admission_wait_ms", "transfer_ms", "first_decode_step_ms"]


def pd_run(trace: Trace, fast_path: bool = True, **pd):
    spec = SimSpec(model="llama-3-8b", hardware="h100-sxm", fast_path=fast_path,
                   disaggregation=Disaggregation(pd.pop("prefill_replicas", 1), pd.pop("decode_replicas", 1), **pd))
    return simulate(trace, spec)


def sparse_trace(count: int = 6) -> Trace:
    """Requests 5 s apart: each is alone in the deployment (no queueing anywhere)."""
    prompts = np.array([37, 300, 1000, 64, 513, 2000][:count])
    return Trace.build(np.arange(count) * 5.0, prompts, np.array([4, 9, 1, 30, 12, 7][:count]))


def test_mla_moves_fewer_bytes_than_the_same_model_with_gqa():
    gqa = get_model("llama-3-8b")  # 32 layers, 8 KV heads of 128: 2 x 8 x 128 x 32 x 2 B = 131,072 B per token
    mla = replace(gqa, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)
    assert rank_bytes_per_token(gqa, None, 1, 1) == (131072, 131072)
    assert rank_bytes_per_token(mla, None, 1, 1) == (576 * 32 * 2, 576 * 32 * 2)  # the latent: 36,864 B
    # prefill TP 1 -> decode TP 2: GQA splits its heads (the prefill rank sends all of them once), the MLA latent is
    # whole on each decode rank (the prefill rank sends it twice) - still fewer bytes
    assert rank_bytes_per_token(gqa, None, 1, 2) == (65536, 131072)
    assert rank_bytes_per_token(mla, None, 1, 2) == (36864, 73728)
    assert rank_bytes_per_token(gqa, 1.0, 2, 4) == (16384, 32768)  # fp8 KV: half the bytes


def test_a_run_reports_each_requests_bytes_by_its_blocks():
    result = pd_run(sparse_trace())
    table = result.requests
    bs = result.info["block_size"]
    blocks = -(-table["prompt_tokens"] // bs)  # NIXL reads whole blocks
    assert (table["kv_transfer_bytes"] == blocks * bs * 131072).all()
    assert result.info["disaggregation"]["kv_bytes_per_token_per_decode_rank"] == 131072


def test_transfer_time_scales_with_link_bandwidth():
    trace = sparse_trace()
    slow = pd_run(trace, kv_link_bandwidth=10e9, kv_link_latency_ms=0.0).requests
    fast = pd_run(trace, kv_link_bandwidth=40e9, kv_link_latency_ms=0.0).requests
    # (times are differences of clock readings up to 25 s: equal to ~1e-12 ms)
    np.testing.assert_allclose(slow["transfer_ms"], 4 * fast["transfer_ms"], rtol=1e-9)
    np.testing.assert_allclose(slow["transfer_ms"], slow["kv_transfer_bytes"] / 10e9 * 1e3, rtol=1e-9)
    latency = pd_run(trace, kv_link_bandwidth=40e9, kv_link_latency_ms=2.0).requests
    np.testing.assert_allclose(latency["transfer_ms"], fast["transfer_ms"] + 2.0, rtol=1e-9)


def test_ttft_is_the_sum_of_its_parts_and_the_fast_path_changes_nothing():
    trace = random_trace(3, 120, rate=40, prompt=(50, 1500), output=(1, 120))
    stepped = pd_run(trace, False, prefill_replicas=2, decode_replicas=1, kv_link_concurrency=2)
    result = pd_run(trace, True, prefill_replicas=2, decode_replicas=1, kv_link_concurrency=2)
    table = result.requests
    assert len(table) == 120 and result.info["fast_steps"] > 0
    np.testing.assert_allclose(table[PARTS].sum(axis=1), table["ttft_ms"], rtol=0, atol=1e-9)
    assert (table[PARTS] >= 0).all().all() and table["decode_admission_wait_ms"].max() > 0
    assert stepped.requests.drop(columns=["request_id"]).equals(table.drop(columns=["request_id"]))
    assert result.summary["mean_transfer_ms"] == pytest.approx(table["transfer_ms"].mean())
    assert set(table["prefill_replica"]) == {0, 1} and set(table["replica"]) == {2}


def test_an_instant_link_matches_co_located_replicas_for_requests_alone():
    """Reference: with an instant link and each request alone, the prefill replica is a co-located replica
    serving the prompt for one token, the transfer and admission wait are nothing, and the decode replica's
    tokens come as a co-located replica's: TTFT = the one-token TTFT + one step, TPOT the same."""
    trace = sparse_trace()
    pd = pd_run(trace, kv_link_bandwidth=1e30, kv_link_latency_ms=0.0).requests
    spec = SimSpec(model="llama-3-8b", hardware="h100-sxm", entry_point="llm")  # P/D models no API server yet
    one_token = simulate(trace.with_columns(output_tokens=np.ones(len(trace), dtype=np.int64)), spec).requests
    colo = simulate(trace, spec).requests
    np.testing.assert_allclose(pd["prefill_ttft_ms"], one_token["ttft_ms"], rtol=1e-9)
    assert (pd["transfer_ms"] < 1e-9).all() and (pd["decode_admission_wait_ms"].abs() < 1e-9).all()
    np.testing.assert_allclose(pd["ttft_ms"], one_token["ttft_ms"] + pd["first_decode_step_ms"], rtol=1e-9)
    many = pd["output_tokens"] > 1
    np.testing.assert_allclose(pd["tpot_ms"][many], colo["tpot_ms"][many], rtol=1e-9)


def test_json_reports_each_requests_transfer_and_admission_wait(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 40, "output_length": 5, "hash_ids": [1]}\n'
                    '{"timestamp": 100, "input_length": 600, "output_length": 9, "hash_ids": [1, 2]}\n')
    assert main(["simulate", "--trace", str(path), "--prefill-replicas", "1", "--decode-replicas", "1",
                 "--decode-tensor-parallel-size", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (first, second) = doc["requests"]
    assert {"transfer_ms", "decode_admission_wait_ms", "prefill_ttft_ms", "ttft_ms"} <= set(first)
    assert second["kv_transfer_bytes"] > first["kv_transfer_bytes"] > 0
    assert doc["info"]["disaggregation"]["decode_tp"] == 2 and doc["summary"]["mean_transfer_ms"] > 0


@pytest.mark.parametrize("flags,message", [
    (["--prefill-tensor-parallel-size", "2", "--decode-tensor-parallel-size", "1"],
     "--decode-tensor-parallel-size: 1 with a prefill TP of 2"),
    (["--decode-replicas", "0"], "argument --decode-replicas: '0'; allowed: an integer >= 1"),
    (["--kv-link-bandwidth", "0"], "argument --kv-link-bandwidth: '0'; allowed: a finite number > 0"),
    (["--kv-link-bandwidth=-5e9"], "argument --kv-link-bandwidth: '-5e9'; allowed: a finite number > 0"),
    (["--kv-link", "pcie"], "argument --kv-link: invalid choice: 'pcie'"),
    (["--kv-link", "nvlink", "--decode-hardware", "a100-80gb"], "--kv-link: nvlink joins GPUs of one node"),
])
def test_bad_input_says_what_is_allowed(flags, message, tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 40, "output_length": 5}\n')
    base = ["simulate", "--trace", str(path), "--prefill-replicas", "1", "--decode-replicas", "1"]
    assert main([*base, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) <= 2, err


def test_one_replica_count_alone_is_refused(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 40, "output_length": 5}\n')
    assert main(["simulate", "--trace", str(path), "--prefill-replicas", "2"]) == 2
    assert "--decode-replicas: missing" in capsys.readouterr().err


def test_the_text_answer_states_the_ttft_parts(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 40, "output_length": 5}\n'
                    '{"timestamp": 1, "input_length": 9000, "output_length": 5}\n')  # too long: rejected, counted
    assert main(["simulate", "--trace", str(path), "--prefill-replicas", "2", "--decode-replicas", "1",
                 "--max-model-len", "4096"]) == 0
    captured = capsys.readouterr()
    assert "disaggregated: 2 prefill (h100-sxm, TP 1) + 1 decode (h100-sxm, TP 1) over rdma" in captured.out
    assert "TTFT parts, mean ms: prefill_ttft " in captured.out and "1 longer than max_model_len" in captured.err
