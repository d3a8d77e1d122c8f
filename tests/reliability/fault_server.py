"""A fake OpenAI-compatible server (vLLM's names: /v1/models, /v1/completions streamed as SSE, /metrics with
vllm:cache_config_info, POST /reset_prefix_cache) that misbehaves on purpose, one fault per mode. A real HTTP
server (stdlib ThreadingHTTPServer) on a loopback port in a thread: the client under test sees real sockets,
real partial reads and real stalls.

Faults in time (the client must give up at its deadline): a completion that drips its bytes or its headers,
stalls before its headers, sends SSE keep-alive comments forever, or an error body that drips; /v1/models, /metrics or
/reset_prefix_cache that drip; /metrics that starts dripping once the replay has begun. Faults in size: a line
that never ends, a /v1/models body that never ends. Faults in meaning (the client must name the server's value
and exclude it or refuse): a vocab_size of 10^30 in /v1/models, a 500 body nested 100,000 deep, an event nested
as deep, choices[].index 1 for n=1, usage.prompt_tokens 10^30, finish_reason "error", cached_tokens 10x the
prompt, absurd /metrics values (KV usage 50.0, negative running and waiting, more prefix-cache hits than
lookups), malformed or too-small KV facts in cache_config_info. Per-request faults hit trace row 0 only (the row
is the request's seed, `--seed 0`), so a replay of two rows shows one request excluded and counted and one
served.
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from tests.loopback_server import LoopbackServer

DRIP_S = 0.05  # between two dripped bytes: far below any read timeout, so only an overall deadline ends it
LABELS = {"block_size": "16", "num_gpu_blocks": "200", "enable_prefix_caching": "True", "max_model_len": "1024"}
KV_FAULTS = {"bad-kv-block": {"block_size": "16.5"}, "bad-kv-caching": {"enable_prefix_caching": "yes"},
             "small-kv": {"num_gpu_blocks": "0"}}
ROW0_FAULTS = ("wrong-index", "huge-number", "finish-error", "cached-over-prompt", "nested-event")
MODES = ("ok", "drip", "drip-headers", "stall", "keep-alive", "endless-line", "drip-error", "deeply-nested",
         "drip-models", "huge-models", "huge-vocab", "drip-metrics", "drip-metrics-later", "drip-reset",
         "absurd-metrics",
         *ROW0_FAULTS, *KV_FAULTS)


@dataclass
class Faulty:
    """The server's mode and what it has seen."""

    mode: str = "ok"
    completions: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def metrics_text(self) -> str:
        n = self.completions
        labels = {**LABELS, **KV_FAULTS.get(self.mode, {})}
        info = ",".join(f'{k}="{v}"' for k, v in labels.items())
        usage, running, waiting, hits, queries = 0.0, 0, 0, n, 2 * n
        if self.mode == "absurd-metrics":
            usage, running, waiting, hits, queries = 50.0, -3, -1, 50 * n, n
        return (f"vllm:cache_config_info{{{info}}} 1\nvllm:kv_cache_usage_perc {usage}\n"
                f"vllm:num_requests_running {running}\nvllm:num_requests_waiting {waiting}\n"
                f"vllm:prefix_cache_hits_total {hits}\nvllm:prefix_cache_queries_total {queries}\n"
                f"vllm:generation_tokens_total {3 * n}\n")


def _handler(server: Faulty) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _head(self, code: int, kind: str, length: int | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            if length is not None:
                self.send_header("Content-Length", str(length))
            self.end_headers()

        def _whole(self, code: int, data: bytes, kind: str = "application/json") -> None:
            self._head(code, kind, len(data))
            self.wfile.write(data)

        def _forever(self, piece: bytes, pause_s: float) -> None:
            """Write `piece` again and again until the client leaves or the server stops."""
            with contextlib.suppress(OSError):
                while not server.stop.is_set():
                    self.wfile.write(piece)
                    self.wfile.flush()
                    if pause_s:
                        server.stop.wait(pause_s)

        def _drip(self, code: int = 200, kind: str = "application/json") -> None:
            self._head(code, kind, 1 << 20)  # promises a body it never finishes
            self._forever(b" ", DRIP_S)

        def do_GET(self) -> None:
            mode = server.mode
            if self.path == "/v1/models":
                if mode == "drip-models":
                    self._drip()
                elif mode == "huge-models":
                    self._head(200, "application/json")
                    self._forever(b'{"data": [' + b" " * 65536, 0.0)
                elif mode == "huge-vocab":
                    self._whole(200, b'{"object": "list", "data": [{"id": "m", "vocab_size": 1' + b"0" * 30 + b"}]}")
                else:
                    self._whole(200, b'{"object": "list", "data": [{"id": "m"}]}')
            elif self.path == "/metrics":
                if mode == "drip-metrics" or (mode == "drip-metrics-later" and server.completions):
                    self._drip(kind="text/plain")
                else:
                    self._whole(200, server.metrics_text().encode(), "text/plain")
            else:
                self._whole(404, b'{"error": {"message": "not found"}}')

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/reset_prefix_cache":
                if server.mode == "drip-reset":
                    self._drip()
                else:
                    self._whole(200, b"")
            elif self.path == "/v1/completions":
                with server.lock:
                    server.completions += 1
                self._complete(body)
            else:
                self._whole(404, b'{"error": {"message": "not found"}}')

        def _complete(self, body: dict) -> None:
            mode = server.mode
            if mode == "stall":  # accepts, reads the request, never answers
                server.stop.wait(60)
                return
            if mode == "drip-headers":  # a status line, then header bytes one at a time
                self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                self._forever(b"X", DRIP_S)
                return
            if mode == "deeply-nested":
                self._whole(500, b"[" * 100_000 + b"]" * 100_000)
                return
            if mode == "drip-error":
                self._drip(500)
                return
            self._head(200, "text/event-stream")
            if mode == "keep-alive":
                self._forever(b": ping\n\n", DRIP_S)
                return
            if mode == "endless-line":
                self.wfile.write(b'data: {"choices": [{"index": 0, "text": "')
                self._forever(b"a" * 65536, 0.0)
                return
            if mode == "drip":
                self._forever(b"d", DRIP_S)
                return
            self._stream(body, mode if body.get("seed", 0) % 1_000_003 == 0 else "ok")

        def _stream(self, body: dict, fault: str) -> None:
            n, prompt = int(body["max_tokens"]), len(body["prompt"])
            index = 1 if fault == "wrong-index" else 0
            for _ in range(n):
                self._event({"choices": [{"index": index, "text": " a", "token_ids": [7],
                                          "finish_reason": None}]})
            if fault == "nested-event":
                self.wfile.write(b"data: " + b"[" * 100_000 + b"]" * 100_000 + b"\n\n")
            usage = {"prompt_tokens": 10**30 if fault == "huge-number" else prompt, "completion_tokens": n,
                     "prompt_tokens_details": {"cached_tokens": 10 * prompt if fault == "cached-over-prompt" else 0}}
            finish = "error" if fault == "finish-error" else "length"
            self._event({"choices": [{"index": 0, "text": "", "finish_reason": finish}], "usage": usage})
            with contextlib.suppress(OSError):
                self.wfile.write(b"data: [DONE]\n\n")

        def _event(self, doc: dict) -> None:
            with contextlib.suppress(OSError):
                self.wfile.write(f"data: {json.dumps(doc)}\n\n".encode())
                self.wfile.flush()

    return Handler


@contextlib.contextmanager
def fault_server(mode: str):
    """Yields (URL, the server's state); the server and every handler still dripping stop afterwards."""
    assert mode in MODES, mode
    state = Faulty(mode)
    httpd = LoopbackServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}", state
    finally:
        state.stop.set()
        httpd.shutdown()
        httpd.server_close()
