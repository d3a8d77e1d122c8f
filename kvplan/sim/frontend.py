"""The API server in front of the engine (vLLM's OpenAI server, `vllm serve`): what a client measures beyond the
engine's own times.

Where it sits in time (vLLM 0.34: entrypoints/openai/*, v1/engine/async_llm.py, v1/engine/output_processor.py).
Each replica (one `vllm serve`) has one API-server process (`--api-server-count` defaults to 1) running one
asyncio event loop; the engine core runs in its own process and steps on while the API server works, so the API
server never slows a step - but its own work is serial:

* on the way in, each request is parsed (HTTP, the JSON body into `CompletionRequest`) and its prompt tokenized,
  then handed to the engine core: `request_s + prompt_token_s * prompt_tokens` of API-server time, served first
  come first served by the one process. The engine sees the request when that work ends.
* on the way out, every engine step's outputs are detokenized (`OutputProcessor.process_outputs`, the whole
  step's batch in one loop) and each request's delta is sent as one SSE chunk: `output_token_s` per token. A
  token reaches the client after its step's batch is processed: on average half the batch ahead of it plus its
  own, `output_token_s * (batch + 1) / 2` after the engine emitted it.
* `latency_s`: what a client waits that occupies no API-server time: the HTTP transport both ways, the ASGI
  server's and the client's own stacks, the hand-offs between the event loop's tasks and the engine core's ZMQ
  sockets. A constant per request, added before the engine sees it.

So a client's TTFT and E2E are the engine's plus the request's inbound wait and work, `latency_s` and the
delivery delay of its tokens; its inter-token gaps are the engine's (consecutive tokens of a steady batch are
delayed alike). The outbound work shares the event loop with the inbound: the inbound queue is served at the
speed the outbound load leaves (processor sharing, `1 / (1 - outbound utilization)`). When the API server's
total utilization reaches 1 it cannot keep up at all: `utilization` says so, and a client's latencies grow
without bound there (the model's times are then a lower bound).

The default constants: the API-server work from vLLM's own code timed on the CPU (`sim.gpu.host_overhead`,
scripts/measure_host_overhead.py); `latency_s` from a published client-vs-server measurement of `vllm serve`
(vLLM PR #54628, Qwen2.5-0.5B on an RTX 4070 Laptop, vLLM 0.28.1, 512-token prompts, 8 concurrent streams:
client TTFT minus the server's own `vllm:time_to_first_token_seconds` = +8.4 and +12.0 ms for the completions
backend, mean 10.2 ms), less the measured API-server work of such a request. `validate --endpoint` fits
`latency_s` for a real server (`kvplan.endpoint.frontend_fit`), and the api_server_latency_ms setting carries the
fit into a simulation.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pandas as pd

from kvplan.errors import UserError
from kvplan.sim.gpu import host_overhead as host

# PR #54628's two `openai` (completions) rows: client TTFT - server TTFT, ms; the prompts were 512 tokens
PUBLISHED_OVERHEAD_S, PUBLISHED_PROMPT_TOKENS = (8.4e-3 + 12.0e-3) / 2, 512
SOURCE = host.SOURCE + "; latency_s: vLLM PR #54628 (client vs server TTFT), less that work"
MAX_BACKGROUND = 0.95  # outbound utilization beyond which the inbound share is taken as this (already saturated)


@dataclass(slots=True, frozen=True)
class FrontendCost:
    """One API server's costs (seconds). Invariant: every field finite and >= 0."""

    request_s: float = host.API_REQUEST_S
    prompt_token_s: float = host.API_PROMPT_TOKEN_S
    output_token_s: float = host.API_OUTPUT_TOKEN_S
    latency_s: float = (PUBLISHED_OVERHEAD_S - host.API_REQUEST_S - host.API_PROMPT_TOKEN_S * PUBLISHED_PROMPT_TOKENS
                        - host.API_OUTPUT_TOKEN_S)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, int | float) and np.isfinite(value) and value >= 0):
                raise ValueError(f"FrontendCost.{f.name}: {value!r}; allowed: a number of seconds >= 0")

    def inbound_s(self, prompt_tokens: np.ndarray) -> np.ndarray:
        return self.request_s + self.prompt_token_s * np.asarray(prompt_tokens, dtype=np.float64)

    def engine_arrivals(self, arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                        servers: int = 1) -> tuple[np.ndarray, float]:
        """When the engine sees each request (the arrivals sorted), and the outbound utilization of one API
        server that the inbound queue was slowed by. Each replica has its own API server (one `vllm serve` each);
        requests are dealt to them in turn (what a round-robin balancer does). On each, first come first served:
        d_i = max(a_i + latency, d_{i-1}) + s_i, in closed form d_i = S_i + max_{k <= i}(a_k + latency - S_{k-1})
        with S the running sum of services. The result is kept in the clients' order (the cluster hands requests
        over in trace order): a request that finished its API work before an earlier one waits for it."""
        arrival = np.asarray(arrival_s, dtype=np.float64)
        if len(arrival) == 0:
            return arrival.copy(), 0.0
        span = float(arrival[-1] - arrival[0])
        background = self.outbound_utilization(float(np.sum(output_tokens, dtype=np.float64)) / servers, span)
        service = self.inbound_s(prompt_tokens) / (1.0 - min(background, MAX_BACKGROUND))
        engine = np.empty_like(arrival)
        for k in range(min(servers, len(arrival))):
            mine = slice(k, None, servers)
            done = np.cumsum(service[mine])
            engine[mine] = done + np.maximum.accumulate(arrival[mine] + self.latency_s - (done - service[mine]))
        return np.maximum.accumulate(engine), background

    def outbound_utilization(self, output_tokens: float, span_s: float) -> float:
        """The API server's share of time spent sending tokens, at `output_tokens` over `span_s` seconds."""
        return self.output_token_s * output_tokens / span_s if span_s > 0 else 0.0

    def delivery_s(self, mean_batch: float) -> float:
        """After the engine emits a token, until its client has it: half the step's batch ahead of it, and it."""
        return self.output_token_s * (max(mean_batch, 1.0) + 1.0) / 2.0


@dataclass(slots=True)
class FrontendRun:
    """One run through the API server: the clients' arrivals, the engine's, and the load it carried."""

    cost: FrontendCost
    client_arrival_s: np.ndarray  # by trace row
    engine_arrival_s: np.ndarray  # by trace row
    outbound_share: float  # the outbound utilization the inbound queue was slowed by (from the trace's lengths)

    servers: int = 1  # API servers: one per replica

    @classmethod
    def start(cls, cost: FrontendCost, arrival_s: np.ndarray, prompt_tokens: np.ndarray,
              output_tokens: np.ndarray, servers: int = 1) -> FrontendRun:
        engine, share = cost.engine_arrivals(arrival_s, prompt_tokens, output_tokens, servers)
        return cls(cost, np.asarray(arrival_s, dtype=np.float64), engine, share, servers)

    def client_columns(self, columns: dict[str, np.ndarray], mean_batch: float) -> dict[str, np.ndarray]:
        """The recorded columns (`RequestLog.raw_columns`) as clients see them: `arrival_s`, `first_token_s`,
        `finish_s` become the client's, and the engine's follow the recorded ones as `engine_arrival_s`,
        `first_token_engine_s`, `finish_engine_s` (`latency_columns` then gives both views' latencies)."""
        delivery = self.cost.delivery_s(mean_batch)
        client = dict(columns)
        client["arrival_s"] = self.client_arrival_s[columns["request"]]
        client["first_token_s"] = columns["first_token_s"] + delivery
        client["finish_s"] = columns["finish_s"] + delivery
        itl = client.pop("itl_max_s")  # the engine's worst gap: a client's, delivery alike (kept last)
        client.update(engine_arrival_s=columns["arrival_s"], first_token_engine_s=columns["first_token_s"],
                      finish_engine_s=columns["finish_s"], itl_max_s=itl)
        return client

    def info(self, table: pd.DataFrame, mean_batch: float) -> dict[str, Any]:
        """What the API servers did over the run: the utilization of one (>= 1: it could not keep up, the client
        latencies are a lower bound), the mean added TTFT, and the constants."""
        span = float(table["finish_s"].max() - table["arrival_s"].min()) if len(table) else 0.0
        first = table["sample"] == 0
        work = float(self.cost.inbound_s(table.loc[first, "prompt_tokens"].to_numpy()).sum()
                     + self.cost.output_token_s * table["output_tokens"].sum())
        added = (table["ttft_ms"] - table["ttft_engine_ms"]).to_numpy()
        return {"entry_point": "openai_server", "api_servers": self.servers,
                "utilization": work / span / self.servers if span > 0 else 0.0,
                "mean_added_ttft_ms": float(np.nanmean(added)) if len(added) else 0.0,
                "delivery_ms": self.cost.delivery_s(mean_batch) * 1e3, "mean_batch": mean_batch,
                "constants": {f.name: getattr(self.cost, f.name) for f in fields(self.cost)},
                "source": SOURCE}


def frontend_for(entry_point: str, latency_ms: float | None = None) -> FrontendCost | None:
    """The API server's cost for a simulated vLLM run from `entry_point` (`latency_ms`: the api_server_latency_ms
    setting, None for the default): the OpenAI server has one; the offline LLM class and the bare engine core
    report engine times (a client of the LLM class pays its tokenization, about a microsecond per prompt token,
    which is left out)."""
    if entry_point != "openai_server":
        if latency_ms is not None:
            raise UserError(f"--api-server-latency-ms: {latency_ms:g} given with entry_point {entry_point}, which has "
                            "no API server; allowed: --entry-point openai_server, or no --api-server-latency-ms")
        return None
    return FrontendCost() if latency_ms is None else FrontendCost(latency_s=latency_ms / 1e3)


def explain(entry_point: str, latency_ms: float | None) -> str:
    """The --explain line: what the reported latencies include."""
    cost = frontend_for(entry_point, latency_ms)
    if cost is None:
        return (f"entry_point {entry_point}: latencies are the engine's own (no API server in front); "
                "*_engine_ms equal them")
    return (f"entry_point openai_server: latencies as a client of vLLM's API server sees them - the engine's plus "
            f"{cost.latency_s * 1e3:.1f} ms of transport, {cost.request_s * 1e6:.0f} us + "
            f"{cost.prompt_token_s * 1e6:.2f} us per prompt token of parsing and tokenizing (one process, first come "
            f"first served) and {cost.output_token_s * 1e6:.1f} us per token of detokenizing and streaming "
            "(sim.frontend); the engine's own are the *_engine_ms columns")


def saturation_note(info: dict[str, Any] | None) -> str | None:
    """A note when an API server was busy all the time: its clients' latencies are then a lower bound."""
    if info is None or info["utilization"] < 1.0:
        return None
    return (f"the API server was {info['utilization']:.0%} busy (one per replica: parsing, tokenizing, "
            "detokenizing and streaming): it cannot keep up with this load, and the client latencies reported are "
            "a lower bound; more replicas (or vLLM's --api-server-count) spread it")
