"""`kvplan serve` end to end: a trace replayed with `kvplan replay --endpoint` (every request completes, greedy
tokens equal the in-process engine's, the simulator's per-request columns, /metrics agreeing with the replay),
the official `openai` client, aborted streams freeing their blocks, 400s and 503s."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
import pandas as pd
import pytest

from kvplan import traces
from kvplan.cli import main
from kvplan.endpoint import scrape
from kvplan.endpoint.prompts import endpoint_requests
from kvplan.engine.llm import LLM
from kvplan.engine.sampling import SamplingParams
from kvplan.output import verify_result_set
from kvplan.results.request_table import RequestLog
from kvplan.traces.io import render
from kvplan.traces.synth import synthesize
from tests.engine.serving.servers import thread_server

SPEC = {"seed": 3, "requests": 50, "arrivals": {"process": "poisson", "rate": 40},
        "lengths": {"prompt": {"dist": "lognormal", "median": 40, "sigma": 0.7, "max": 160},
                    "output": {"dist": "lognormal", "median": 14, "sigma": 0.6, "max": 60}},
        "prefix": {"granularity": 16, "system_prompts": {"count": 3, "tokens": {"dist": "uniform", "min": 32,
                                                                                 "max": 80}, "zipf": 1.0}}}
VOCAB = 512  # the tiny models' vocabulary


def metrics(url: str) -> list:
    return scrape.parse(httpx.get(f"{url}/metrics").text)


def value(samples: list, name: str, **labels: str) -> float:
    return sum(v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items()))


def tiny_llm(model: str, **overrides) -> LLM:
    """The in-process engine as the `served` fixture's server runs (servers.TINY on its command line)."""
    options = dict(dtype="float32", block_size=8, num_gpu_blocks_override=64, max_num_batched_tokens=64,
                   max_model_len=320)
    return LLM(model, **{**options, **overrides})


def test_a_trace_replayed_against_kvplan_serve(served, tmp_path, capsys):
    url, name, model = served
    trace = synthesize(SPEC)
    path = tmp_path / "trace.jsonl"
    path.write_bytes(render(trace, "jsonl"))
    before = metrics(url)
    out = tmp_path / "replay"
    assert main(["replay", "--endpoint", url, "--model", name, "--vocab-size", str(VOCAB), "--trace", str(path),
                 "--temperature", "0", "--out", str(out)]) == 0
    assert "50 completed, 0 failed" in capsys.readouterr().out
    verify_result_set(out)
    table = pd.read_parquet(out / "requests.parquet")
    # the simulator's columns, and `rejected` (the reason a request was never served; "" for every one here)
    assert list(table.columns) == [*RequestLog().to_frame(np.array([], dtype=object)).columns, "rejected"]
    assert (table["rejected"] == "").all()
    assert len(table) == 50 and (table["output_tokens"].to_numpy() == trace.output_tokens).all()
    assert (table["ttft_ms"] > 0).all() and (table["e2el_ms"] >= table["ttft_ms"]).all()
    assert (out / "failed.jsonl").read_text() == ""

    # greedy tokens: the in-process engine on the same prompts
    lines = (out / "tokens.jsonl").read_text().splitlines()
    streamed = {(d["row"], d["sample"]): d["token_ids"] for d in map(json.loads, lines)}
    requests = endpoint_requests(traces.load(path), vocab_size=VOCAB, seed=0)
    llm = tiny_llm(model)
    outputs = llm.generate([r.prompt for r in requests],
                           [SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True) for r in requests])
    assert [streamed[(r.row, 0)] for r in requests] == [o.outputs[0].token_ids for o in outputs]

    # the server's counters over the replay agree with what the client saw
    after = metrics(url)
    delta = {key: value(after, key) - value(before, key) for key in (
        "vllm:request_success_total", "vllm:generation_tokens_total", "vllm:prompt_tokens_total",
        "vllm:time_to_first_token_seconds_count", "vllm:prefix_cache_hits_total")}
    assert delta["vllm:request_success_total"] == 50 == delta["vllm:time_to_first_token_seconds_count"]
    assert delta["vllm:generation_tokens_total"] == table["output_tokens"].sum()
    assert delta["vllm:prompt_tokens_total"] == table["prompt_tokens"].sum() == trace.prompt_tokens.sum()
    assert delta["vllm:prefix_cache_hits_total"] > 0  # the trace's system prompts are shared
    summary = json.loads((out / "summary.json").read_text())["summary"]
    assert summary["prefix_cache_hits"] == delta["vllm:prefix_cache_hits_total"]
    assert summary["completed"] == 50 and summary["num_rejected"] == 0
    # per request, the prompt tokens the server's prefix cache served (usage.prompt_tokens_details)
    # (hits at each request's first admission; a recompute after preemption looks the prefix up again)
    assert 0 < table["cached_prompt_tokens"].sum() <= delta["vllm:prefix_cache_hits_total"]
    assert summary["num_evicted_blocks"] is None  # not exposed by the server: unknown, not 0
    assert value(after, "vllm:num_requests_running") == 0 and value(after, "vllm:kv_cache_usage_perc") == 0


def test_the_openai_client_streams_a_completion(served):
    import openai

    url, name, _ = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == [name]
    whole = client.completions.create(model=name, prompt=[5, 6, 7, 8], max_tokens=6, temperature=0,
                                      extra_body={"return_token_ids": True, "ignore_eos": True})
    chunks = list(client.completions.create(model=name, prompt=[5, 6, 7, 8], max_tokens=6, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"return_token_ids": True, "ignore_eos": True}))
    streamed = [t for c in chunks for choice in c.choices for t in choice.model_extra["token_ids"]]
    assert streamed == whole.choices[0].model_extra["token_ids"] and len(streamed) == 6
    assert chunks[-2].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 6
    assert whole.usage.prompt_tokens == 4
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=name, prompt=[1, 2], max_tokens=10_000)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt=[1, 2], max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="chat template"):
        client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}])


def slowed(llm: LLM, seconds: float) -> LLM:
    """Each engine step takes at least `seconds`: a tiny model on a server as slow as a real one."""
    step = llm.step

    def slow_step():
        time.sleep(seconds)
        return step()

    llm.step = slow_step
    return llm


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_a_client_that_disconnects_aborts_its_request_and_frees_its_blocks(tiny_models, stream):
    llm = slowed(tiny_llm(tiny_models["tiny-llama"]), 0.02)
    body = {"prompt": list(range(1, 100)), "max_tokens": 200, "ignore_eos": True, "stream": stream}
    with thread_server(llm) as (url, _engine):
        if stream:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as response:
                lines = response.iter_lines()  # kept open: leaving the iterator would close the connection
                events = (line for line in lines if line.startswith("data:"))
                for _ in range(3):
                    next(events)
                assert value(metrics(url), "vllm:kv_cache_usage_perc") > 0  # it holds blocks mid-stream
        else:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{url}/v1/completions", json=body, timeout=0.5)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (llm.has_unfinished_requests() or llm.scheduler.kv.usage() > 0):
            time.sleep(0.05)
        samples = metrics(url)
    assert not llm.has_unfinished_requests() and llm.scheduler.kv.usage() == 0
    assert value(samples, "vllm:request_success_total", finished_reason="abort") == 1
    assert value(samples, "vllm:generation_tokens_total") < 200
    assert value(samples, "vllm:kv_cache_usage_perc") == 0


@pytest.mark.parametrize("body,field", [
    ({"prompt": []}, "prompt"), ({"prompt": [1, 512]}, "prompt"), ({"prompt": "hi"}, "prompt"),
    ({"prompt": [1], "n": 0}, "n"), ({"prompt": [1], "temperature": -1}, "temperature"),
    ({"prompt": [1], "logprobs": 3}, "logprobs"), ({"prompt": [1], "echo": True}, "echo"),
    ({"prompt": [1], "best_of": 3}, "best_of"), ({"prompt": [1] * 315, "max_tokens": 10}, "prompt"),
    ({"prompt": [1], "stop": [""]}, "stop"), ({"prompt": [1], "stream": "yes"}, "stream"),
])
def test_bad_requests_get_400_with_an_openai_error_body(served, body, field):
    url, _, _ = served
    response = httpx.post(f"{url}/v1/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and error["type"] == "invalid_request_error" and error["message"]
    assert httpx.post(f"{url}/v1/completions", content=b"{not json").status_code == 400


def test_a_full_queue_answers_503_with_retry_after(tiny_models):
    llm = tiny_llm(tiny_models["tiny-llama"], max_num_seqs=1)
    with thread_server(llm, max_queue_len=2) as (url, _engine):
        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=60) as client:
                body = {"prompt": [1, 2, 3], "max_tokens": 40, "ignore_eos": True}
                return await asyncio.gather(*(client.post(f"{url}/v1/completions", json=body) for _ in range(8)))

        responses = asyncio.run(burst())
        codes = sorted(r.status_code for r in responses)
        assert 200 in codes and 503 in codes and set(codes) == {200, 503}, codes
        refused = next(r for r in responses if r.status_code == 503)
        assert refused.headers["retry-after"] == "1" and "capacity" in refused.json()["error"]["message"]
        assert llm.scheduler.kv.usage() == 0 and not llm.has_unfinished_requests()


def test_parallel_samples_and_batched_prompts_each_get_a_choice(served):
    url, name, model = served
    response = httpx.post(f"{url}/v1/completions", json={
        "model": name, "prompt": [[3, 4, 5], [6, 7]], "n": 2, "max_tokens": 5, "temperature": 0.8, "seed": 11,
        "ignore_eos": True, "return_token_ids": True}, timeout=60).json()
    assert [c["index"] for c in response["choices"]] == [0, 1, 2, 3]
    assert all(len(c["token_ids"]) == 5 for c in response["choices"])
    llm = tiny_llm(model)
    expected = llm.generate([[3, 4, 5], [6, 7]], SamplingParams(n=2, temperature=0.8, seed=11, max_tokens=5,
                                                                ignore_eos=True))
    assert [c["token_ids"] for c in response["choices"]] == [c.token_ids for o in expected for c in o.outputs]
    assert response["usage"] == {"prompt_tokens": 5, "completion_tokens": 20, "total_tokens": 25,
                                 "prompt_tokens_details": {"cached_tokens": 0}}


def test_engine_options_with_an_endpoint_are_refused(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_bytes(render(synthesize({**SPEC, "requests": 3}), "jsonl"))
    assert main(["replay", "--endpoint", "http://127.0.0.1:9", "--trace", str(path), "--block-size", "32",
                 "--vocab-size", "512", "--out", str(tmp_path / "o")]) == 2
    assert "engine options (block_size)" in capsys.readouterr().err
    assert main(["replay", "--endpoint", "http://127.0.0.1:9", "--trace", str(path), "--vocab-size", "512",
                 "--out", str(tmp_path / "o"), "--timeout", "5"]) == 2
    err = capsys.readouterr().err  # no server at all: one line before the replay, not a trace of failures
    assert "--endpoint: http://127.0.0.1:9: no server answers (ConnectError" in err
    assert not (tmp_path / "o").exists()



def test_validate_against_the_endpoint(served, tmp_path, capsys):
    from kvplan.sim.cost.calibrated import CalibratedCost, save_profile

    url, name, model = served
    path = tmp_path / "trace.jsonl"
    path.write_bytes(render(synthesize({**SPEC, "requests": 20}), "jsonl"))
    profile = tmp_path / "profile.yaml"
    save_profile(CalibratedCost({"step": 0.004, "prefill_tokens": 2e-5, "decode_requests": 2e-4},
                                meta={"model": "tiny", "device": "cpu-local", "dtype": "float32", "block_size": 8}),
                 profile)
    common = ["--endpoint", url, "--served-model", name, "--model", model, "--vocab-size", str(VOCAB), "--trace",
              str(path), "--profile", str(profile), "--temperature", "0"]
    assert main(["validate", *common, "--repeats", "2", "--out", str(tmp_path / "val"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (config,) = doc["configs"]
    assert doc["mode"] == "timing" and config["num_blocks"] == 64  # the server's KV capacity, from /metrics
    assert config["options"]["block_size"] == 8
    assert {m["metric"] for m in config["timing"]} >= {"median_e2el_ms", "p99_ttft_ms", "median_tpot_ms"}
    # each live run starts from a cold prefix cache, as the simulation does
    for run in ("live-1", "live-2"):
        assert json.loads((tmp_path / "val" / "default" / run / "endpoint.json").read_text())[
            "prefix_cache_reset"] == "reset"
    assert all(c["prefix_cache_hits"] > 0 for c in config["live_counters"])
    assert config["live_counters"][0]["num_evicted_blocks"] is None  # not exposed: unknown, not 0
    assert (tmp_path / "val" / "report.md").is_file() and (tmp_path / "val" / "default" / "cdf.png").is_file()
    assert main(["validate", *common, "--mode", "policy", "--out", str(tmp_path / "bad")]) == 2
    assert "--mode policy: needs the in-process engine" in capsys.readouterr().err


def test_an_engine_crash_ends_open_streams_with_an_error_and_fails_health(tiny_models):
    llm = tiny_llm(tiny_models["tiny-llama"])
    step = llm.step

    def failing_step():
        if llm.scheduler.stats.num_steps >= 2:
            raise RuntimeError("injected engine bug")
        return step()

    llm.step = failing_step
    with thread_server(llm) as (url, _engine):
        body = {"prompt": [1, 2, 3], "max_tokens": 50, "ignore_eos": True}
        with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=30) as response:
            events = [line for line in response.iter_lines() if line.startswith("data:")]
        assert "injected engine bug" in events[-1] and '"code":500' in events[-1]
        assert httpx.get(f"{url}/health").status_code == 503
        refused = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
        assert refused.status_code == 503 and "engine loop has stopped" in refused.json()["error"]["message"]
