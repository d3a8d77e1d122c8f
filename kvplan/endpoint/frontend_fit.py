"""The API server's latency of a real server, fitted from one replay: the TTFT its clients measured (kvplan's load
generator) against the engine's own TTFT (the server's /metrics histograms, differenced over the replay).

The engine's TTFT, best first:
* `engine core`: vLLM's `vllm:request_queue_time_seconds` + `vllm:request_prefill_time_seconds` - stamped by the
  engine core (queued, scheduled, first token), so the difference from the client's is the whole front end;
* `API server`: `vllm:time_to_first_token_seconds` - vLLM stamps it from the request's arrival in the API server
  (after HTTP parsing), kvplan serve from its hand-off to the engine loop (after parsing and tokenizing): the
  difference is then the transport and what the server did before that stamp.

What the fit returns: `latency_s` for `sim.frontend.FrontendCost` (a simulation's api_server_latency_ms), i.e. the
mean added TTFT less the API-server work `base` prices for these requests (parsing and tokenizing their prompts,
delivering their first token). Negative differences (a server whose histogram includes more than the client saw)
are reported, and give 0.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from kvplan.sim.frontend import FrontendCost

# summary key -> the server's metric names (cumulative: differenced over the replay like the counters)
HISTOGRAM_KEYS: dict[str, tuple[str, ...]] = {
    "queue_time_s_sum": ("vllm:request_queue_time_seconds_sum",),
    "queue_time_count": ("vllm:request_queue_time_seconds_count",),
    "prefill_time_s_sum": ("vllm:request_prefill_time_seconds_sum",),
    "prefill_time_count": ("vllm:request_prefill_time_seconds_count",),
    "server_ttft_s_sum": ("vllm:time_to_first_token_seconds_sum",),
    "server_ttft_count": ("vllm:time_to_first_token_seconds_count",),
}


@dataclass(slots=True)
class FrontendFit:
    latency_s: float  # the fitted constant (>= 0)
    requests: int
    client_mean_ttft_ms: float
    engine_mean_ttft_ms: float
    added_ttft_ms: float  # client - engine, mean
    work_ms: float  # the API-server work `base` prices for these requests
    engine_source: str  # which histograms gave the engine's TTFT

    def to_json(self) -> dict:
        return asdict(self)


def engine_mean_ttft_s(counters: dict[str, float]) -> tuple[float, str] | None:
    """The engine's mean TTFT over the replay from the differenced histograms, and which ones; None if absent."""
    def mean(total: str, count: str) -> float:
        n = counters.get(count, math.nan)
        return counters.get(total, math.nan) / n if n and not math.isnan(n) else math.nan

    core = mean("queue_time_s_sum", "queue_time_count") + mean("prefill_time_s_sum", "prefill_time_count")
    if math.isfinite(core):
        return core, "engine core (request_queue_time + request_prefill_time)"
    server = mean("server_ttft_s_sum", "server_ttft_count")
    if math.isfinite(server):
        return server, "API server (time_to_first_token)"
    return None


def fit_latency(client_ttft_ms: np.ndarray, prompt_tokens: np.ndarray, counters: dict[str, float],
                base: FrontendCost | None = None) -> FrontendFit | None:
    """`latency_s` from one replay's client TTFTs (ms, one per request) and prompt lengths and the server's
    differenced histograms; None when the server exposes no engine TTFT or nothing was served."""
    engine = engine_mean_ttft_s(counters)
    ttft = np.asarray(client_ttft_ms, dtype=np.float64)
    ttft = ttft[np.isfinite(ttft)]
    if engine is None or len(ttft) == 0:
        return None
    base = base or FrontendCost()
    work = float(np.mean(base.inbound_s(prompt_tokens))) + base.delivery_s(1.0)
    client = float(ttft.mean()) / 1e3
    added = client - engine[0]
    return FrontendFit(max(added - work, 0.0), len(ttft), client * 1e3, engine[0] * 1e3, added * 1e3, work * 1e3,
                       engine[1])
