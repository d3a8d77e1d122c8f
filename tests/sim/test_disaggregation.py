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

PARTS = ["prefill_ttft_ms", "api_servers_ms", "decode_admission_wait_ms", "transfer_ms", "first_decode_step_ms"]


def pd_run(trace: Trace, fast_path: bool = True, entry_point: str = "openai_server",
           api_server_latency_ms: float | None = None, **pd):
    spec = SimSpec(model="llama-3-8b", hardware="h100-sxm", fast_path=fast_path, entry_point=entry_point,
                   api_server_latency_ms=api_server_latency_ms,
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
    pd = pd_run(trace, entry_point="llm", kv_link_bandwidth=1e30, kv_link_latency_ms=0.0).requests
    assert (pd["api_servers_ms"] == 0).all()
    spec = SimSpec(model="llama-3-8b", hardware="h100-sxm", entry_point="llm")  # the engines' own times
    one_token = simulate(trace.with_columns(output_tokens=np.ones(len(trace), dtype=np.int64)), spec).requests
    colo = simulate(trace, spec).requests
    np.testing.assert_allclose(pd["prefill_ttft_ms"], one_token["ttft_ms"], rtol=1e-9)
    assert (pd["transfer_ms"] < 1e-9).all() and (pd["decode_admission_wait_ms"].abs() < 1e-9).all()
    np.testing.assert_allclose(pd["ttft_ms"], one_token["ttft_ms"] + pd["first_decode_step_ms"], rtol=1e-9)
    many = pd["output_tokens"] > 1
    np.testing.assert_allclose(pd["tpot_ms"][many], colo["tpot_ms"][many], rtol=1e-9)


def test_the_api_servers_add_both_instances_inbound_work_the_hops_and_the_delivery():
    """Reference: each request alone (no API-server queue, decode batch 1), by hand from the constants: the prefill
    instance's hop and inbound work, the one token back to the proxy, the decode instance's hop and inbound work
    (the prompt tokenized again), and the first token's delivery. The engines' times are those without the API
    servers, kept as *_engine columns; every request's parts still sum to its TTFT."""
    from kvplan.sim.frontend import FrontendCost

    trace = sparse_trace()
    bare = pd_run(trace, entry_point="llm").requests
    front = pd_run(trace).requests
    c = FrontendCost()
    inbound = c.request_s + c.prompt_token_s * trace.prompt_tokens
    by_hand = (2 * (c.latency_s + inbound) + 2 * c.output_token_s) * 1e3
    # (the inbound work is slowed by each server's tiny outbound share over the 25 s span: < 1e-4 here)
    np.testing.assert_allclose(front["api_servers_ms"], by_hand, rtol=1e-4)
    np.testing.assert_allclose(front[PARTS].sum(axis=1), front["ttft_ms"], rtol=0, atol=1e-9)
    for part in ("prefill_ttft_ms", "decode_admission_wait_ms", "transfer_ms", "first_decode_step_ms"):
        np.testing.assert_allclose(front[part], bare[part], rtol=1e-9, atol=1e-9)
    # the engines' view: the prefill engine's arrival to the decode engine's token (the hand-off's hop inside)
    np.testing.assert_allclose(front["ttft_engine_ms"],
                               (front["first_token_engine_s"] - front["engine_arrival_s"]) * 1e3, rtol=1e-9)
    np.testing.assert_allclose(front["ttft_ms"] - bare["ttft_ms"], by_hand, rtol=1e-4)
    # a fitted transport latency moves both hops
    slower = pd_run(trace, api_server_latency_ms=c.latency_s * 1e3 + 5.0).requests
    np.testing.assert_allclose(slower["api_servers_ms"] - front["api_servers_ms"], 10.0, rtol=1e-6)


def test_hand_offs_queue_first_come_first_served_at_the_decode_api_server():
    """A burst of hand-offs to one decode instance: each waits for the work of those before it (brute force)."""
    from kvplan.sim.frontend import FrontendCost
    from kvplan.sim.pd_frontend import PDFrontend

    cost = FrontendCost(request_s=1e-3, prompt_token_s=1e-5, output_token_s=0.0, latency_s=2e-3)
    prompts = np.array([100, 2000, 50, 700])
    trace = Trace.build(np.zeros(4), prompts, np.ones(4, dtype=np.int64))
    front = PDFrontend.start(cost, trace, 1, 2)
    assert front.decode_slowdown == 1.0  # (no outbound work at all)
    got = [front.decode_entry(0, 0, 0.010), front.decode_entry(0, 1, 0.010), front.decode_entry(1, 2, 0.010),
           front.decode_entry(0, 3, 0.050)]
    service = 1e-3 + 1e-5 * prompts
    expect, free = [], [0.0, 0.0]
    for index, row, end in ((0, 0, 0.010), (0, 1, 0.010), (1, 2, 0.010), (0, 3, 0.050)):
        free[index] = max(end + 2e-3, free[index]) + service[row]
        expect.append(free[index])
    np.testing.assert_allclose(got, expect, rtol=1e-12)
    assert got[1] > got[0] + service[1] - 1e-12 and got[2] == pytest.approx(0.012 + service[2])


def test_fast_path_and_step_by_step_agree_with_the_api_servers_on():
    trace = random_trace(5, 100, rate=60, prompt=(50, 1500), output=(1, 80))
    stepped = pd_run(trace, False, prefill_replicas=1, decode_replicas=2).requests
    fast = pd_run(trace, True, prefill_replicas=1, decode_replicas=2).requests
    assert stepped.drop(columns=["request_id"]).equals(fast.drop(columns=["request_id"]))
    assert (fast["api_servers_ms"] > 0).all()


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
    (["--replicas", "2"], "--replicas: 2 with --prefill-replicas / --decode-replicas"),
    (["--kv-link-concurrency", "0"], "argument --kv-link-concurrency: '0'; allowed: an integer >= 1"),
])
def test_bad_input_says_what_is_allowed(flags, message, tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 40, "output_length": 5}\n')
    base = ["simulate", "--trace", str(path), "--prefill-replicas", "1", "--decode-replicas", "1"]
    assert main([*base, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) <= 2, err


def test_this_machine_through_its_profile_needs_its_link_given(tmp_path, capsys):
    """cpu-local (a shipped calibrated profile) has no entry in the hardware table: its pools run, its link is
    asked for by name (not an 'unknown hardware' error), and the header names the cost that priced it."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 40, "output_length": 5}\n'
                    '{"timestamp": 1, "input_length": 300, "output_length": 9}\n')
    base = ["simulate", "--trace", str(path), "--model", "smollm2-135m", "--hardware", "cpu-local",
            "--prefill-replicas", "1", "--decode-replicas", "1", "--max-model-len", "2048"]
    assert main(base) == 2
    err = capsys.readouterr().err
    assert "--kv-link-bandwidth: needed with cpu-local" in err and "unknown hardware" not in err
    assert main([*base, "--kv-link-bandwidth", "6e8", "--kv-link-latency-ms", "5", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["transfer_ms"] for r in doc["requests"]] == pytest.approx(
        [5 + r["kv_transfer_bytes"] / 6e8 * 1e3 for r in doc["requests"]])
    assert main([*base, "--kv-link-bandwidth", "6e8"]) == 0
    assert "(calibrated cost," in capsys.readouterr().out


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


def test_each_pool_is_priced_on_its_hardware_and_split_by_its_own_prefill_share():
    from kvplan.sim.dollars import cost_fields, pools_cost_fields
    from kvplan.sim.specs.prices import price_table

    table = price_table(None)
    summary = {"request_throughput": 2.0, "output_throughput": 100.0, "total_token_throughput": 500.0}
    pools = [("h100-sxm", 2, 10.0, 10.0), ("h200", 4, 20.0, 5.0)]  # prefill pool: all prefill; decode: a quarter
    out = pools_cost_fields(table, pools, summary)
    h100, h200 = table.gpu_hour("h100-sxm"), table.gpu_hour("h200")
    assert out["cost_per_hour"] == pytest.approx(2 * h100 + 4 * h200) and out["billed_gpus"] == 6
    input_hour = 2 * h100 + 4 * h200 * 0.25
    assert out["usd_per_m_input_tokens"] == pytest.approx(input_hour / (400 * 3600 / 1e6))
    assert out["usd_per_m_output_tokens"] == pytest.approx(4 * h200 * 0.75 / (100 * 3600 / 1e6))
    assert out["prefill_share"] == pytest.approx(input_hour / out["cost_per_hour"])
    # one pool: exactly the co-located answer
    assert pools_cost_fields(table, [("h200", 4, 20.0, 5.0)], summary) == cost_fields(
        table, "h200", 4, summary, {"busy_s": 20.0, "prefill_busy_s": 5.0})


def test_a_yaml_block_is_checked_key_by_key():
    from kvplan.errors import UserError
    from kvplan.sim.pd_spec import disaggregation_from_mapping

    pd = disaggregation_from_mapping({"prefill_replicas": 2, "decode_replicas": 3, "kv_link": "nvlink"})
    assert (pd.prefill_replicas, pd.decode_replicas, pd.kv_link, pd.kv_link_concurrency) == (2, 3, "nvlink", 1)
    for block, message in [
        ({"prefill_replica": 2, "decode_replicas": 1}, "disaggregation.prefill_replica: unknown key; did you mean"),
        ({"decode_replicas": 1}, "disaggregation.prefill_replicas: missing; allowed: an integer >= 1"),
        ({"prefill_replicas": 0, "decode_replicas": 1}, "disaggregation.prefill_replicas: 0; allowed: an integer >= 1"),
        ({"prefill_replicas": 1, "decode_replicas": 1, "kv_link_bandwidth": -1.0},
         "disaggregation.kv_link_bandwidth: -1.0; allowed: a finite number > 0"),
        ({"prefill_replicas": 1, "decode_replicas": True}, "disaggregation.decode_replicas: True; allowed"),
        ([1, 2], "disaggregation: [1, 2]; allowed: a mapping of"),
    ]:
        with pytest.raises(UserError) as err:
            disaggregation_from_mapping(block)
        assert message in str(err.value), (block, str(err.value))
