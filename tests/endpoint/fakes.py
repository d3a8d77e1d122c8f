"""Small fake servers, one per adapter, answering as each real server documents (kvplan.endpoint.servers names the
sources): their info endpoint, their metric names, their reset call (or none), and their streams (vLLM's with
`token_ids`, the others' text chunks only; llama.cpp's final chunk with `timings`). stdlib http.server on a
thread, loopback, a free port. Every completion request is counted, so that a test can assert none was sent."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

import numpy as np

from kvplan.traces.io import render
from kvplan.traces.synth import synthesize
from tests.loopback_server import LoopbackServer

SPEC = {"seed": 3, "requests": 12, "arrivals": {"process": "poisson", "rate": 30},
        "lengths": {"prompt": {"dist": "lognormal", "median": 40, "sigma": 0.5, "max": 120},
                    "output": {"dist": "lognormal", "median": 8, "sigma": 0.4, "max": 16}},
        "prefix": {"granularity": 16, "system_prompts": {"count": 2, "tokens": {"dist": "uniform", "min": 16,
                                                                                 "max": 32}, "zipf": 1.0}}}
INFO = {"llamacpp": ("/props", {"total_slots": 4, "default_generation_settings": {"n_ctx": 512, "params": {}},
                                "endpoint_slots": True, "endpoint_metrics": True}),
        "sglang": ("/get_server_info", {"page_size": 1, "context_length": 2048, "disable_radix_cache": False,
                                        "max_running_requests": 8, "max_total_num_tokens": 3000, "version": "0.5"}),
        "tgi": ("/info", {"model_id": "m", "max_total_tokens": 1024, "max_batch_total_tokens": 4096,
                          "max_concurrent_requests": 16, "version": "3.0.0"}),
        "vllm": (None, None)}
RESET = {"vllm": "/reset_prefix_cache", "sglang": "/flush_cache"}
# (counter of generated tokens, of prompt tokens, of cached prompt tokens, running gauge) per kind
METRICS = {"vllm": ("vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:prefix_cache_hits_total",
                    "vllm:num_requests_running"),
           "sglang": ("sglang:generation_tokens_total", "sglang:prompt_tokens_total", "sglang:cached_tokens_total",
                      "sglang:num_running_reqs"),
           "tgi": ("tgi_request_generated_tokens_sum", "tgi_request_input_length_sum", None, "tgi_batch_current_size"),
           "llamacpp": ("llamacpp:tokens_predicted_total", "llamacpp:prompt_tokens_total",
                        "llamacpp:prompt_tokens_cached_total", "llamacpp:requests_processing")}


@dataclass
class Fake:
    """A server's state; `step_s` per token, `warm_factor` the speed-up of a prompt it has served before since the
    last reset (its cache is warm), `tokens_per_chunk` > 1 merges text chunks, `fail_after` completions fail,
    `count_lag_s`: how long after a request's last byte its tokens reach the counters (and it leaves the running
    gauge), as a server that logs a finished request after handing its output on."""

    kind: str
    step_s: float = 0.002
    warm_factor: float = 1.0
    tokens_per_chunk: int = 1
    fail_after: int | None = None
    count_lag_s: float = 0.0
    completions: int = 0
    bodies: list = field(default_factory=list)
    generated: int = 0
    prompted: int = 0
    cached: int = 0
    running: int = 0
    seen: set = field(default_factory=set)  # prompts served since the last reset
    lock: threading.Lock = field(default_factory=threading.Lock)

    def metrics_text(self) -> str:
        gen, prompt, cached, running = METRICS[self.kind]
        lines = [f"# TYPE {gen} counter", f"{gen} {self.generated}", f"{prompt} {self.prompted}",
                 f"{running} {self.running}"]
        if cached:
            lines.append(f"{cached} {self.cached}")
        if self.kind == "vllm":
            lines.append('vllm:cache_config_info{block_size="16",num_gpu_blocks="200",'
                         'enable_prefix_caching="True",max_model_len="1024"} 1')
        return "\n".join(lines) + "\n"


class QuietHandler(BaseHTTPRequestHandler):
    """A handler that answers whole bodies and logs nothing."""

    def _send(self, code: int, data: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


def _handler(fake: Fake) -> type[BaseHTTPRequestHandler]:
    class Handler(QuietHandler):
        def do_GET(self) -> None:
            path, doc = INFO[fake.kind]
            if self.path == "/metrics":
                self._send(200, fake.metrics_text().encode(), "text/plain")
            elif path is not None and self.path == path:
                self._send(200, json.dumps(doc).encode(), "application/json")
            elif self.path == "/v1/models":
                self._send(200, b'{"data": [{"id": "m"}]}', "application/json")
            else:
                self._send(404, b'{"error": {"message": "File Not Found"}}', "application/json")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == RESET.get(fake.kind):
                fake.seen.clear()
                self._send(200, b"{}", "application/json")
            elif self.path == "/v1/completions":
                self._complete(body)
            elif self.path.startswith("/slots/"):  # llama.cpp without --slot-save-path
                self._send(501, b'{"error": {"code": 501, "message": "This server does not support slots action. '
                                b'Start it with `--slot-save-path`"}}', "application/json")
            else:
                self._send(404, b'{"error": {"message": "File Not Found"}}', "application/json")

        def _complete(self, body: dict) -> None:
            with fake.lock:
                fake.completions += 1
                fake.bodies.append(body)
                number = fake.completions
            if fake.fail_after is not None and number > fake.fail_after:
                self._send(500, b'{"error": {"message": "boom"}}', "application/json")
                return
            n, prompt = int(body["max_tokens"]), body["prompt"]
            prompt_len = len(prompt) if isinstance(prompt, list) else len(prompt.split())
            key = json.dumps(prompt)
            with fake.lock:
                warm = key in fake.seen
                fake.seen.add(key)
            step = fake.step_s / (fake.warm_factor if warm else 1.0)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            with fake.lock:
                fake.running += 1
            time.sleep(step + prompt_len * 2e-5)
            sent = 0
            while sent < n:
                k = min(fake.tokens_per_chunk, n - sent)
                choice: dict = {"index": 0, "text": " a" * k, "finish_reason": None}
                if fake.kind == "vllm":
                    choice["token_ids"] = [7] * k
                self._event({"choices": [choice]})
                sent += k
                time.sleep(step * k)
            cached = 0 if fake.kind == "llamacpp" and body.get("cache_prompt") is False else prompt_len // 2
            usage = {"prompt_tokens": prompt_len, "completion_tokens": n, "total_tokens": prompt_len + n}
            final: dict = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": usage}
            if fake.kind == "llamacpp":  # cached count in `timings` only (as with --no-prompt-details)
                final["timings"] = {"cache_n": cached, "prompt_n": prompt_len - cached, "prompt_ms": 1.0,
                                    "predicted_n": n, "predicted_ms": 2.0}
            else:
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
            self._event(final)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            time.sleep(fake.count_lag_s)
            with fake.lock:
                fake.running -= 1
                fake.generated += n
                fake.prompted += prompt_len
                fake.cached += cached

        def _event(self, doc: dict) -> None:
            self.wfile.write(f"data: {json.dumps(doc)}\n\n".encode())
            self.wfile.flush()

    return Handler


@contextlib.contextmanager
def fake_server(fake: Fake):
    """Yields the URL; the server stops afterwards."""
    server = LoopbackServer(("127.0.0.1", 0), _handler(fake))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def write_trace(tmp_path, **changes) -> str:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(render(synthesize({**SPEC, **changes}), "jsonl"))
    return str(path)


def profile(tmp_path, scale: float = 1.0, probe_s: float | None = None, longest: int | None = None) -> str:
    """A calibrated profile for smollm2-135m; `probe_s`: its calibration-time drift probe, `longest`: the longest
    prompt it was fitted on."""
    from kvplan.sim.cost.calibrated import CalibratedCost, save_profile

    meta = {"model": "smollm2-135m", "device": "endpoint", "block_size": 16,
            "provenance": {"endpoint_probe_s": probe_s} if probe_s else {},
            "fit": {"longest_prompt_tokens": longest} if longest else {}}
    path = tmp_path / f"profile-{scale}.yaml"
    save_profile(CalibratedCost({"step": 0.002 * scale, "prefill_tokens": 2e-5 * scale}, meta=meta), path)
    return str(path)


def median(values) -> float:
    return float(np.median(values))
