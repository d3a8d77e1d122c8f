"""Issue 34 on the HTTP side: bodies nested 100,000 deep or holding NaN, fields the engine cannot honour (vLLM's
min_p, beam search, guided decoding, ...) and fields it does not know get a 400 naming them, never a 500 or a
silently ignored setting; a client leaving mid-body leaves no traceback in the log; `serve X` + `replay
--endpoint --model X` works for a bundled model; and a server that streams garbage fails its requests one by one
(each with its reason), never the whole replay, and counters that go backwards are unknown, not negative."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from pathlib import Path

import httpx
import pandas as pd
import pytest

from kvplan.cli import main
from kvplan.endpoint.local_server import server_process
from kvplan.output import verify_result_set
from tests.endpoint.fakes import QuietHandler
from tests.engine.serving.servers import TINY, thread_server
from tests.engine.serving.test_serve import tiny_llm
from tests.loopback_server import LoopbackServer


def _trace(tmp_path: Path, rows: int, output_tokens: int = 2) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"request_id": i, "arrival_s": i * 0.05, "prompt_tokens": 6,
                                        "output_tokens": output_tokens}) + "\n" for i in range(rows)))
    return str(path)


@pytest.mark.parametrize(("body", "field"), [
    ({"prompt": [1], "min_p": 0.1}, "min_p"), ({"prompt": [1], "use_beam_search": True}, "use_beam_search"),
    ({"prompt": [1], "length_penalty": 2.0}, "length_penalty"),
    ({"prompt": [1], "guided_json": {"type": "object"}}, "guided_json"),
    ({"prompt": [1], "include_stop_str_in_output": True}, "include_stop_str_in_output"),
    ({"prompt": [1], "frobnicate": 1}, "frobnicate"), ({"prompt": [1], "length_penalty": True}, "length_penalty"),
])
def test_fields_the_engine_cannot_honour_get_400(served, body, field):
    url, _, _ = served
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field


def test_their_neutral_values_are_served(served):
    url, _, _ = served
    body = {"prompt": [1, 2], "max_tokens": 2, "min_p": 0.0, "use_beam_search": False, "length_penalty": 1,
            "include_stop_str_in_output": False, "skip_special_tokens": True, "user": "u"}
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200


@pytest.mark.parametrize(("content", "fragment"), [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"prompt": [1], "temperature": NaN}', "NaN is not a JSON number"),
    (b'{"prompt": [1], "temperature": 1e400}', "beyond float64"),
], ids=["nested-100000", "nan", "overflow"])
def test_bodies_python_json_would_take_get_400(served, content, fragment):
    url, _, _ = served
    response = httpx.post(f"{url}/v1/completions", content=content, timeout=30)
    assert response.status_code == 400, response.text
    assert fragment in response.json()["error"]["message"]


def test_a_client_leaving_mid_body_leaves_no_traceback(tiny_models):
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    with thread_server(tiny_llm(tiny_models["tiny-llama"])) as (url, _engine):
        keep = Keep(level=logging.WARNING)
        logging.getLogger("uvicorn.error").addHandler(keep)
        try:
            host, port = url.removeprefix("http://").split(":")
            with socket.create_connection((host, int(port))) as sock:
                sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 1000\r\n\r\n{\"prompt\": [1,")
            time.sleep(1.0)
            assert httpx.post(f"{url}/v1/completions", json={"prompt": [1], "max_tokens": 1}).status_code == 200
        finally:
            logging.getLogger("uvicorn.error").removeHandler(keep)
    assert not [r for r in records if r.exc_info], [r.getMessage() for r in records]


@pytest.mark.slow
def test_serve_a_bundled_model_and_replay_it_by_name(tmp_path, capsys):
    """`kvplan serve --model tiny-llama`, then `kvplan replay --endpoint URL --model tiny-llama` as written: the
    vocabulary comes from the registry serve uses, no --vocab-size needed."""
    with server_process("tiny-llama", TINY, startup_s=120) as url:
        models = httpx.get(f"{url}/v1/models").json()["data"]
        assert models[0]["id"] == "tiny-llama" and models[0]["vocab_size"] == 512
        out = tmp_path / "r"
        assert main(["replay", "--endpoint", url, "--model", "tiny-llama", "--trace", _trace(tmp_path, 6),
                     "--out", str(out)]) == 0, capsys.readouterr().err
        assert "6 completed, 0 failed" in capsys.readouterr().out
        verify_result_set(out)


def test_a_served_name_outside_the_registry_takes_the_servers_vocab(served, tmp_path, capsys):
    url, name, _ = served  # served as "tiny", which no registry knows: /v1/models says vocab_size 512
    assert main(["replay", "--endpoint", url, "--model", name, "--trace", _trace(tmp_path, 4), "--out",
                 str(tmp_path / "r")]) == 0, capsys.readouterr().err
    assert "4 completed, 0 failed" in capsys.readouterr().out


GOOD = ['{"choices": [{"index": 0, "text": "a", "token_ids": [1]}]}'] * 2 + [
    '{"choices": [], "usage": {"prompt_tokens": 6, "completion_tokens": 2}}']
EVENTS = {  # trace row -> the data lines the garbage server streams, and the failure each one must give
    0: (GOOD, None),
    1: (["[1, 2]"], "event is [1, 2]; allowed: a JSON object"),
    2: (['"x"'], "event is 'x'; allowed: a JSON object"),
    3: (['{"choices": {"a": 1}}'], "choices is {'a': 1}; allowed: a list of objects"),
    4: (['{"choices": ["x"]}'], "choices[] is 'x'; allowed: a JSON object"),
    5: (['{"choices": [], "usage": "x"}'], "usage is 'x'; allowed: a JSON object"),
    6: ([*GOOD[:2], '{"choices": [], "usage": {"prompt_tokens": 6, "completion_tokens": -5}}'],
        "usage.completion_tokens: -5 is out of range"),
    7: (['{"choices": [{"index": 0, "token_ids": [Infinity]}]}'], "Infinity is not a JSON number"),
    8: (GOOD, None),
}


class _Garbage(QuietHandler):
    posts = 0

    def do_GET(self) -> None:
        if self.path != "/metrics":
            self.send_error(404)
            return
        # the counters "restart" once requests came (however often /metrics was read before): they go backwards
        queries = 100 if _Garbage.posts == 0 else 40
        self._send(200, f"vllm:prefix_cache_queries_total {queries}\nvllm:num_preemptions_total -3\n".encode(),
                   "text/plain")

    def do_POST(self) -> None:
        _Garbage.posts += 1
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        lines, _ = EVENTS[body["seed"] % 1_000_003]  # the load generator's per-row seed (seed 0)
        self._send(200, b"".join(f"data: {line}\n\n".encode() for line in [*lines, "[DONE]"]), "text/event-stream")


def test_a_garbage_server_fails_requests_one_by_one(tmp_path, capsys):
    server = LoopbackServer(("127.0.0.1", 0), _Garbage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        out = tmp_path / "r"
        assert main(["replay", "--endpoint", f"http://127.0.0.1:{server.server_port}", "--trace",
                     _trace(tmp_path, len(EVENTS)), "--vocab-size", "100", "--out", str(out), "--json"]) == 0
    finally:
        server.shutdown()
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert "counters went backwards or are not counts" in captured.err
    assert doc["summary"]["prefix_cache_queries"] is None and doc["summary"]["num_preemptions"] is None
    verify_result_set(out)
    failed = {json.loads(line)["row"]: json.loads(line)["error"] for line in (out / "failed.jsonl").open()}
    assert set(failed) == {row for row, (_, why) in EVENTS.items() if why}
    for row, error in failed.items():
        assert error.startswith("malformed stream: ") and EVENTS[row][1] in error, (row, error)
    table = pd.read_parquet(out / "requests.parquet")
    assert sorted(table.loc[table["rejected"] == "", "request_id"]) == [0, 8]
    assert sorted(table.loc[table["rejected"] != "", "request_id"]) == sorted(failed)


class _Failing(_Garbage):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self._send(500, b'{"error": {"message": "boom"}}', "application/json")


def test_a_server_failing_every_request_is_one_line(tmp_path, capsys):
    server = LoopbackServer(("127.0.0.1", 0), _Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        code = main(["replay", "--endpoint", f"http://127.0.0.1:{server.server_port}", "--trace", _trace(tmp_path, 3),
                     "--vocab-size", "100", "--out", str(tmp_path / "o")])
    finally:
        server.shutdown()
    err = capsys.readouterr().err
    assert code == 2 and "every request failed (first: request_id 0 (t.jsonl:1): HTTP 500: boom)" in err, err
