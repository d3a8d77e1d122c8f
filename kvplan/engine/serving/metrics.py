"""Prometheus metrics of `kvplan serve`, under vLLM's names, so dashboards and `kvplan replay --endpoint` read a
kvplan server and a vLLM one alike.

Each server has its own registry (tests run several in one process). Gauges and the scheduler's cumulative
counters are refreshed by the engine thread after every step; latencies are observed when tokens are sent:
TTFT from the request's arrival at the server to its first token, ITL between consecutive tokens of a
sequence, E2E from arrival to the last token. prometheus_client is thread-safe, and `/metrics` renders the
registry from the server's thread.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kvplan.engine.core.metrics import kv_snapshot

# vLLM's bucket edges (seconds), so histograms line up with a vLLM deployment's
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
               960.0, 1920.0, 7680.0)
# scheduler counter (engine.core.metrics) -> vLLM counter (exposed with the _total suffix)
SCHEDULER_COUNTERS = (("prefix_cache_queries", "vllm:prefix_cache_queries", "Prefix-cache lookups, in tokens"),
                      ("prefix_cache_hits", "vllm:prefix_cache_hits", "Prefix-cache hits, in tokens"),
                      ("num_preemptions", "vllm:num_preemptions", "Preemptions (recompute or swap)"))


class ServingMetrics:
    def __init__(self, model_name: str, cache_info: dict[str, object]) -> None:
        self.registry = CollectorRegistry()
        labels, self.labels = ["model_name"], {"model_name": model_name}
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r).labels(**self.labels)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=r).labels(**self.labels)

        def histogram(name: str, doc: str, buckets: tuple) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(**self.labels)

        self.running = gauge("vllm:num_requests_running", "Requests in the running batch")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting for admission")
        self.swapped = gauge("vllm:num_requests_swapped", "Requests swapped out to CPU")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "Fraction of KV blocks in use (1 = full)")
        self.gpu_usage = gauge("vllm:gpu_cache_usage_perc", "Fraction of KV blocks in use (vLLM v0 name)")
        self.scheduler_counters = {key: counter(name, doc) for key, name, doc in SCHEDULER_COUNTERS}
        self._last = dict.fromkeys(self.scheduler_counters, 0)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of accepted requests")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens sent")
        self.success = Counter("vllm:request_success", "Finished requests", [*labels, "finished_reason"],
                               registry=r)
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Gap between consecutive tokens", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to last token", E2E_BUCKETS)
        info = Gauge("vllm:cache_config_info", "KV cache configuration", sorted(cache_info), registry=r)
        info.labels(**{k: str(v) for k, v in cache_info.items()}).set(1)

    def observe_scheduler(self, sched) -> None:
        m = kv_snapshot(sched.kv, sched.stats)  # gauges and counters only: no per-step memory breakdown
        self.running.set(len(sched.running))
        self.waiting.set(len(sched.waiting))
        self.swapped.set(len(sched.swapped))
        self.kv_usage.set(m["kv_usage"])
        self.gpu_usage.set(m["kv_usage"])
        for key, metric in self.scheduler_counters.items():
            value = int(m[key])
            if value > self._last[key]:
                metric.inc(value - self._last[key])
                self._last[key] = value

    def finished(self, reason: str, arrival_s: float, now: float) -> None:
        self.success.labels(**self.labels, finished_reason=reason).inc()
        if reason != "abort":
            self.e2e.observe(now - arrival_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
