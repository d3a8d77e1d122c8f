"""`kvplan bench serve`: a bounded loopback load test of `kvplan serve`.

The server runs in its own process (the real command); the client is `kvplan replay --endpoint`'s load
generator in closed loop: every request is ready at t = 0 and at most C are in flight, so C is the load. A ramp
doubles C until throughput stops growing (< 5% more requests/s than the best level so far, or the last level):
the saturation point is the first level within 5% of the best throughput. The server is then held there for
`hold_s` seconds (a request count sized from the ramp's throughput) and checked afterwards: no failed request,
every request counted by the server, and no leaked block (KV usage back to 0, nothing running or waiting).
TTFT is measured from when a request was sent, not from t = 0.

Deadlines (`timeout_s`, the command's --timeout): the server must answer /health within it of its start (else one
line with its last log lines, exit 2: kvplan.endpoint.local_server), and every request and /metrics scrape has
it, connect to last byte (kvplan.endpoint.http_limits). A /metrics answer against its meaning (a negative gauge,
a KV usage outside [0, 1], malformed cache_config_info labels) stops the bench as the server's fault: this is
kvplan's own server, so a bad value is a bug to report, not a sample to exclude.
"""

from __future__ import annotations

import math
import time

import numpy as np

from kvplan.endpoint import scrape, servers
from kvplan.endpoint.http_limits import ServerFault, fetch
from kvplan.endpoint.loadgen import LoadGenerator
from kvplan.endpoint.local_server import server_process
from kvplan.endpoint.prompts import EndpointRequest

PLATEAU = 0.05  # a level within 5% of the best throughput is saturated
LEVELS = (1, 2, 4, 8, 16, 32, 64, 128)
VLLM = servers.ADAPTERS["vllm"]  # `kvplan serve` exports vLLM's metric names


def workload(count: int, prompt_tokens: int, output_tokens: int, vocab: int, rng: np.random.Generator,
             first_row: int) -> list[EndpointRequest]:
    return [EndpointRequest(first_row + i, 0.0, rng.integers(0, vocab, prompt_tokens).tolist(), prompt_tokens,
                            output_tokens) for i in range(count)]


def measure(url: str, requests: list[EndpointRequest], concurrency: int, timeout_s: float) -> dict:
    load = LoadGenerator(url, None, temperature=0.0, max_concurrency=concurrency, timeout_s=timeout_s,
                         sample_interval_s=1.0, progress=lambda _line: None).run(requests)
    done = [o for o in load.outcomes if o.error is None]
    ttft = np.array([o.token_times[0][0] - o.sent_s for o in done]) * 1e3
    tokens = sum(len(t) for o in done for t in o.token_times.values())
    return {"concurrency": concurrency, "requests": len(requests), "completed": len(done),
            "failed": len(requests) - len(done), "first_error": next((o.error for o in load.outcomes if o.error), None),
            "wall_s": load.wall_s, "requests_per_s": len(done) / load.wall_s,
            "output_tokens_per_s": tokens / load.wall_s,
            "p50_ttft_ms": float(np.median(ttft)) if len(ttft) else math.nan,
            "p99_ttft_ms": float(np.percentile(ttft, 99)) if len(ttft) else math.nan}


def metrics(url: str, timeout_s: float) -> list:
    """/metrics of the server, its gauges checked (module doc)."""
    reply = fetch("GET", f"{url}/metrics", min(timeout_s, servers.CALL_TIMEOUT_S))
    if reply.status != 200:
        raise ServerFault(f"{reply.what}: HTTP {reply.status}; kvplan serve exports /metrics", "http")
    samples = scrape.parse(reply.text())
    _, faults = servers.gauges(VLLM, samples, reply.what)
    if faults:
        raise faults[0]
    return samples


def settle(url: str, timeout_s: float, idle_s: float = 30.0) -> list:
    """/metrics once the server is idle (or after idle_s)."""
    deadline = time.monotonic() + idle_s
    while True:
        samples = metrics(url, timeout_s)
        g, _ = servers.gauges(VLLM, samples, url)  # checked by `metrics`
        if (g["running"] == 0 and g["waiting"] == 0 and g["kv_usage"] == 0) or time.monotonic() > deadline:
            return samples
        time.sleep(0.2)


def run(model: str, *, hold_s: float = 60.0, levels: tuple[int, ...] = LEVELS, ramp_s: float = 5.0,
        prompt_tokens: int = 128, output_tokens: int = 32, vocab: int = 512, seed: int = 0,
        engine_args: list[str] | None = None, timeout_s: float = 300.0) -> dict:
    rng = np.random.default_rng(seed)
    rows = 0
    with server_process(model, engine_args or [], startup_s=timeout_s) as url:
        before = servers.counters(VLLM, metrics(url, timeout_s))
        ramp, rate = [], None
        for level in levels:
            # enough requests for ~ramp_s at the last level's rate (at least 4 rounds of `level`)
            count = max(4 * level, math.ceil((rate or 0) * ramp_s))
            result = measure(url, workload(count, prompt_tokens, output_tokens, vocab, rng, rows), level, timeout_s)
            best_before = max((r["requests_per_s"] for r in ramp), default=0.0)
            ramp.append(result)
            rows += count
            rate = result["requests_per_s"]
            if len(ramp) > 1 and rate < best_before * (1 + PLATEAU):  # no longer growing: saturated
                break
        best = max(r["requests_per_s"] for r in ramp)
        saturation = next(r for r in ramp if r["requests_per_s"] >= best * (1 - PLATEAU))
        count = max(saturation["concurrency"], math.ceil(best * hold_s))
        hold = measure(url, workload(count, prompt_tokens, output_tokens, vocab, rng, rows),
                       saturation["concurrency"], timeout_s)
        rows += count
        after_samples = settle(url, timeout_s)
    served = scrape.difference(before, servers.counters(VLLM, after_samples))
    gauges, _ = servers.gauges(VLLM, after_samples, url)  # checked by `metrics`
    try:
        blocks = VLLM.read_kv({}, after_samples).num_blocks or 0
    except servers.KvFactError as exc:
        raise exc.fault(f"GET {url}/metrics") from None
    leaked = round(gauges["kv_usage"] * blocks)
    failed = sum(r["failed"] for r in ramp) + hold["failed"]
    return {"model": model, "prompt_tokens": prompt_tokens, "output_tokens": output_tokens, "ramp": ramp,
            "saturation_concurrency": saturation["concurrency"], "hold": hold, "hold_target_s": hold_s,
            "requests_sent": rows, "requests_counted_by_server": served["request_success"], "failed": failed,
            "leaked_blocks": leaked, "left_running": gauges["running"], "left_waiting": gauges["waiting"],
            "num_kv_blocks": blocks,
            "ok": failed == 0 and leaked == 0 and gauges["running"] == 0 and gauges["waiting"] == 0
            and served["request_success"] == rows}
