"""The API servers in front of a disaggregated deployment (`entry_point openai_server`): what a client behind
vLLM's P/D proxy measures beyond the two engines' own times. The costs are one API server's (`sim.frontend`).

Every prefill and every decode instance is one `vllm serve` with its own API server, and a request passes both:

1. the proxy sends it to a prefill instance: that instance's API server parses and tokenizes it (first come first
   served, one process) after `latency_s` of transport, then its engine prefills - the co-located model's inbound
   path (`FrontendCost.engine_arrivals`), the requests dealt to the prefill instances in turn; its outbound load is
   one token per request;
2. at the prefill engine's one token the API server returns it to the proxy (`output_token_s` of detokenizing)
   and the proxy sends the original request to a decode instance, whose API server parses and tokenizes the
   prompt again after `latency_s`: `PDFrontend.decode_entry`, one first-come-first-served queue per decode
   instance, slowed (as the co-located one) by that server's share of time spent streaming tokens;
3. the decode engine's tokens reach the client `delivery_s(batch)` after it emits them (detokenized and streamed,
   relayed by the proxy).

The proxy's own work (an asyncio relay) is taken as instant. A request's TTFT gains the part `api_servers_ms`:
both inbound paths, the hand-off's hop and the first token's delivery (`sim.pd_run`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvplan.sim.frontend import MAX_BACKGROUND, SOURCE, FrontendCost, FrontendRun
from kvplan.traces import Trace


@dataclass(slots=True)
class PDFrontend:
    """The API servers of both pools over one run: the prefill side's arrivals (computed ahead, as co-located)
    and the decode side's queues (filled as hand-offs happen). Invariant: `decode_free_s[i]` is when decode
    instance i's API server finishes the inbound work it has been given."""

    cost: FrontendCost
    prefill: FrontendRun  # client arrivals -> prefill engine arrivals
    prompt_tokens: np.ndarray  # by trace row
    decode_slowdown: float  # 1 / (1 - the decode API server's outbound share)
    decode_free_s: list[float] = field(default_factory=list)
    decode_outbound_share: float = 0.0

    @classmethod
    def start(cls, cost: FrontendCost, trace: Trace, prefill_replicas: int, decode_replicas: int) -> PDFrontend:
        ones = np.ones(len(trace), dtype=np.int64)  # a prefill instance returns one token per request
        prefill = FrontendRun.start(cost, trace.arrival_s, trace.prompt_tokens, ones, prefill_replicas)
        span = float(trace.arrival_s[-1] - trace.arrival_s[0]) if len(trace) else 0.0
        share = cost.outbound_utilization(float(np.sum(trace.output_tokens, dtype=np.float64)) / decode_replicas,
                                          span)
        return cls(cost, prefill, np.asarray(trace.prompt_tokens, dtype=np.float64),
                   1.0 / (1.0 - min(share, MAX_BACKGROUND)), [0.0] * decode_replicas, share)

    def decode_entry(self, index: int, row: int, handoff_s: float) -> float:
        """When decode instance `index`'s engine sees trace row `row`, handed off at `handoff_s` (the prefill
        engine's token): its return to the proxy, the hop, then the decode API server's queue and work."""
        reach = handoff_s + self.cost.output_token_s + self.cost.latency_s
        done = max(reach, self.decode_free_s[index]) + float(self.cost.inbound_s(self.prompt_tokens[row])) \
            * self.decode_slowdown
        self.decode_free_s[index] = done
        return done

    def info(self, added_ttft_ms: np.ndarray, mean_batch: float, span_s: float, prefill_replicas: int,
             decode_replicas: int, output_tokens: float, prompt_tokens: float, requests: int) -> dict[str, Any]:
        """What the API servers did: each pool's utilization of one server (>= 1: it could not keep up, the
        client latencies are a lower bound), the mean TTFT they added, the constants."""
        c = self.cost
        inbound = c.request_s * requests + c.prompt_token_s * prompt_tokens
        prefill_work = inbound + c.output_token_s * requests
        decode_work = inbound + c.output_token_s * output_tokens
        p_util = prefill_work / span_s / prefill_replicas if span_s > 0 else 0.0
        d_util = decode_work / span_s / decode_replicas if span_s > 0 else 0.0
        return {"entry_point": "openai_server", "api_servers": prefill_replicas + decode_replicas,
                "utilization": max(p_util, d_util), "prefill_utilization": p_util, "decode_utilization": d_util,
                "mean_added_ttft_ms": float(np.nanmean(added_ttft_ms)) if len(added_ttft_ms) else 0.0,
                "delivery_ms": c.delivery_s(mean_batch) * 1e3, "mean_batch": mean_batch,
                "constants": {"request_s": c.request_s, "prompt_token_s": c.prompt_token_s,
                              "output_token_s": c.output_token_s, "latency_s": c.latency_s},
                "proxy": "instant (its relay's own work is not modelled)", "source": SOURCE}
