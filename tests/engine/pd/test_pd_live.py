"""A prefill and a decode instance as two real `kvplan serve` processes on a tiny random model, and the P/D proxy
in front of them:

* the KV the prefill process exposes equals what a co-located engine computed for the same prompt;
* greedy output through the proxy (prefill -> KV pull -> decode) equals the co-located engine's token for token,
  streamed and whole, a dead decode instance in the pool is skipped, and the idle prefill instance frees the
  blocks it held once they have been read;
* `kvplan replay --endpoint PROXY` replays a trace through the pair end to end, greedy tokens as co-located;
* params an instance cannot honour (its role, a prefill TP above the decode TP) are 400s naming the key;
* killing the decode process mid-stream ends the client's stream with an error event, and a request after that
  gets 503 naming the unreachable instance: nothing hangs (the module's last test: it ends the decode process).

The two server processes start together once for the module (each start loads torch: ~2 s)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from kvplan.endpoint.local_server import free_port, wait_healthy
from kvplan.engine.kv_cache import PagedKVCache
from kvplan.engine.kv_transfer.config import parse_kv_transfer_config
from kvplan.engine.kv_transfer.transport import pull, scatter
from kvplan.engine.llm import LLM
from kvplan.engine.sampling import SamplingParams

TINY = ["--served-model-name", "tiny", "--dtype", "float32", "--block-size", "8", "--num-blocks", "64",
        "--max-num-batched-tokens", "64", "--max-model-len", "320"]
OPTIONS = dict(dtype="float32", block_size=8, num_gpu_blocks_override=64, max_num_batched_tokens=64, max_model_len=320)
DEADLINE_S = 20  # every wait in this module is bounded by this


def transfer_config(role: str, port: int) -> str:
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": role, "kv_port": port,
                       "kv_connector_extra_config": {"kv_lease_duration": 120, "transfer_timeout": 5}})


@pytest.fixture(scope="module")
def instances(tiny_models):
    """{"prefill": url, "decode": url, "processes": {name: process}, "kv_port": port, "model": path}."""
    model = tiny_models["tiny-llama"]
    kv_port = free_port()
    roles = {"prefill": transfer_config("kv_producer", kv_port), "decode": transfer_config("kv_consumer", 1)}
    with tempfile.TemporaryDirectory(prefix="kvplan-pd-") as folder:
        started = {}
        for name, config in roles.items():
            port, log = free_port(), Path(folder) / f"{name}.log"
            with log.open("wb") as sink:
                process = subprocess.Popen(
                    [sys.executable, "-m", "kvplan", "serve", "--model", model, "--port", str(port), "--log-level",
                     "warning", "--kv-transfer-config", config, *TINY], stdout=sink, stderr=subprocess.STDOUT,
                    env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
            started[name] = (f"http://127.0.0.1:{port}", process, log)
        try:
            for url, process, log in started.values():
                wait_healthy(url, process, 120, log)
            yield {**{name: url for name, (url, _, _) in started.items()}, "kv_port": kv_port, "model": model,
                   "processes": {name: process for name, (_, process, _) in started.items()}}
        finally:
            for _, process, _ in started.values():
                process.kill()
                process.wait(timeout=DEADLINE_S)


@contextlib.contextmanager
def proxy(prefill: list[str], decode: list[str], timeout_s: float = 5):
    """The P/D proxy on a thread (the command's own app), on a free port."""
    import uvicorn

    from kvplan.engine.kv_transfer.proxy import PDProxy, build_proxy_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_proxy_app(PDProxy(prefill, decode, timeout_s)), host="127.0.0.1",
                                           port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout_s=DEADLINE_S)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=DEADLINE_S)


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, 512, (n,), generator=g).tolist() for n in (3, 8, 21, 50)]


def test_the_exposed_kv_equals_a_co_located_prefill(instances):
    prompt = prompts()[2]
    config = parse_kv_transfer_config(transfer_config("kv_producer", free_port()))
    with LLM(instances["model"], kv_transfer=config, **OPTIONS) as co_located:  # loaded before the prefill's lease
        answer = httpx.post(f"{instances['prefill']}/v1/completions", timeout=DEADLINE_S, json={
            "prompt": prompt, "max_tokens": 1, "temperature": 0, "kv_transfer_params": {"do_remote_decode": True}})
        assert answer.status_code == 200, answer.text
        params = answer.json()["kv_transfer_params"]
        assert params["do_remote_prefill"] is True and params["remote_port"] == instances["kv_port"]
        assert params["remote_num_tokens"] == 21 and len(params["remote_block_ids"]) == 3  # 21 tokens, blocks of 8
        cache = co_located.kv_cache
        received = PagedKVCache(cache.layout, 16, 0, torch.device("cpu"))
        mine = [11, 4, 7]  # blocks this reader allocated: any ids
        scatter(received, mine, pull("127.0.0.1", params["remote_port"], params["remote_request_id"], cache.layout,
                                     timeout_s=DEADLINE_S))

        co_located.add_request(prompt, SamplingParams(temperature=0, max_tokens=1),
                               kv_transfer_params={"do_remote_decode": True})
        while not (done := co_located.step()):
            pass
        held = done[0].kv_transfer_params["remote_block_ids"]
        for theirs, ours in zip(cache.layers, received.layers, strict=True):
            for a, b in zip(theirs.tensors(), ours.tensors(), strict=True):
                a, b = a[held].flatten(1), b[mine].flatten(1)
                assert torch.allclose(a[:, :a.shape[1] * 21 // 24], b[:, :b.shape[1] * 21 // 24])  # 21 of 24 slots
                assert a.abs().sum() > 0


def test_greedy_output_through_the_proxy_equals_the_co_located_engine(instances):
    with LLM(instances["model"], **OPTIONS) as co_located:
        expected = [o.outputs[0].token_ids for o in co_located.generate(
            prompts(), SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))]
    dead = f"http://127.0.0.1:{free_port()}"  # nobody listens: the proxy skips it
    with proxy([instances["prefill"]], [dead, instances["decode"]]) as url:
        for i, prompt in enumerate(prompts()):
            body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "return_token_ids": True,
                    "stream": i % 2 == 1}
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=DEADLINE_S) as reply:
                assert reply.status_code == 200, reply.read()
                if not body["stream"]:
                    tokens = json.loads(reply.read())["choices"][0]["token_ids"]
                else:
                    events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
                    assert events[-1] == "[DONE]"
                    tokens = [t for e in events[:-1] for t in json.loads(e)["choices"][0]["token_ids"]]
            assert tokens == expected[i]
    assert poll(lambda: kv_usage(instances["prefill"]) == 0)  # every held block read and freed while idle


def kv_usage(url: str) -> float:
    from kvplan.endpoint import scrape

    samples = scrape.parse(httpx.get(f"{url}/metrics", timeout=DEADLINE_S).text)
    return sum(v for name, _, v in samples if name == "vllm:kv_cache_usage_perc")


def poll(condition) -> bool:
    end = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize(("where", "params", "message"), [
    ("decode", {"do_remote_prefill": True, "remote_request_id": "x", "remote_host": "127.0.0.1", "remote_port": 1,
                "tp_size": 2}, "kv_transfer_params.tp_size: decode tensor_parallel_size 1 with prefill "
                               "tensor_parallel_size 2; allowed: a decode TP that is a multiple of the prefill TP"),
    ("decode", {"do_remote_prefill": True, "remote_request_id": "x", "remote_host": "127.0.0.1", "tp_size": 1},
     "kv_transfer_params.remote_port: None; allowed: the int the prefill instance returned"),
    ("decode", {"do_remote_decode": True}, "do_remote_decode: this instance has kv_role kv_consumer; allowed on an "
                                           "instance started with kv_role kv_producer or kv_both"),
    ("prefill", {"do_remote_prefill": True}, "do_remote_prefill: this instance has kv_role kv_producer"),
    ("prefill", {"do_remote_decode": True, "stream": True}, "do_remote_decode: the answer carrying the params is a "
                                                            "whole one; allowed: stream false"),
])
def test_params_an_instance_cannot_honour_are_400s_naming_the_key(instances, where, params, message):
    params = dict(params)
    stream = params.pop("stream", False)  # a field of the request beside the params
    answer = httpx.post(f"{instances[where]}/v1/completions", timeout=DEADLINE_S,
                        json={"prompt": [1, 2, 3], "max_tokens": 2, "stream": stream, "kv_transfer_params": params})
    assert answer.status_code == 400 and message in answer.json()["error"]["message"], answer.text


def test_a_trace_replayed_through_the_proxy(instances, tmp_path, capsys):
    from kvplan import traces
    from kvplan.cli import main
    from kvplan.endpoint.prompts import endpoint_requests
    from kvplan.traces.io import render
    from kvplan.traces.synth import synthesize

    spec = {"seed": 4, "requests": 12, "arrivals": {"process": "poisson", "rate": 40},
            "lengths": {"prompt": {"dist": "lognormal", "median": 30, "sigma": 0.7, "max": 120},
                        "output": {"dist": "lognormal", "median": 10, "sigma": 0.5, "max": 40}}}
    path = tmp_path / "trace.jsonl"
    path.write_bytes(render(synthesize(spec), "jsonl"))
    with proxy([instances["prefill"]], [instances["decode"]]) as url:
        models = httpx.get(f"{url}/v1/models", timeout=DEADLINE_S).json()["data"][0]  # the decode instance's
        assert (models["id"], models["max_model_len"], models["vocab_size"]) == ("tiny", 320, 512)
        assert main(["replay", "--endpoint", url, "--model", "tiny", "--vocab-size", "512", "--trace", str(path),
                     "--temperature", "0", "--out", str(tmp_path / "r")]) == 0, capsys.readouterr().err
    assert "12 completed, 0 failed" in capsys.readouterr().out
    lines = (tmp_path / "r" / "tokens.jsonl").read_text().splitlines()
    streamed = {d["row"]: d["token_ids"] for d in map(json.loads, lines)}
    requests = endpoint_requests(traces.load(path), vocab_size=512, seed=0)
    with LLM(instances["model"], **OPTIONS) as co_located:
        outputs = co_located.generate([r.prompt for r in requests], [
            SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True) for r in requests])
    assert [streamed[r.row] for r in requests] == [o.outputs[0].token_ids for o in outputs]


def test_a_killed_decode_instance_fails_its_requests_and_nothing_hangs(instances):
    doomed_url, doomed = instances["decode"], instances["processes"]["decode"]
    with proxy([instances["prefill"]], [doomed_url], timeout_s=5) as url:
        body = {"prompt": prompts()[0], "max_tokens": 300, "temperature": 0, "stream": True}
        start = time.monotonic()
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=DEADLINE_S) as reply:
            assert reply.status_code == 200
            events = []
            for line in reply.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if len(events) == 1:
                        doomed.kill()  # mid-stream: the first chunk has arrived, 299 tokens to go
        assert time.monotonic() - start < DEADLINE_S
        assert events[-1] != "[DONE]"
        error = json.loads(events[-1])["error"]
        assert error["code"] == 502 and f"decode instance {doomed_url} broke off the stream" in error["message"]

        again = httpx.post(f"{url}/v1/completions", json={**body, "stream": False}, timeout=DEADLINE_S)
        assert again.status_code == 503
        assert f"no decode instance could be reached: {doomed_url}" in again.json()["error"]["message"]



