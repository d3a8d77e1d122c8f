"""The vLLM-style summary of a served trace, the same keys whoever served it: latency percentiles from the
per-request table and the inter-token gaps, request/token throughput and goodput, and the KV keys (block usage,
memory breakdown, prefix-cache, preemption, eviction and tier counters)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

# The core fills the tier counters under these names; a summary names them whether or not a run had the tier.
from kvplan.engine.core.metrics import TIER_SUMMARY_KEYS
from kvplan.results.goodput import goodput_count
from kvplan.results.itl import ItlLog

LATENCIES = ("ttft", "tpot", "itl", "e2el")
# The engine-internal view (request_table.ENGINE_LATENCY_COLUMNS): the client's latencies less the API server's
ENGINE_LATENCIES = ("ttft_engine", "tpot_engine", "e2el_engine")
MEMORY_KEYS = ("token_states", "internal_fragmentation", "reserved_unused", "external_fragmentation", "free")
SUMMARY_KEYS = (
    "completed", "duration_s", "request_throughput", "output_throughput", "total_token_throughput",
    "request_goodput",
    *(f"{stat}_{lat}_ms" for lat in LATENCIES for stat in ("mean", "median", "p90", "p99")),
    *(f"{stat}_{lat}_ms" for lat in ENGINE_LATENCIES for stat in ("mean", "median", "p90", "p99")),
    "kv_usage_mean", "kv_usage_peak", "kv_token_utilization", "prefix_cache_queries", "prefix_cache_hits",
    "prefix_cache_hit_rate", "num_preemptions", "num_evicted_blocks", "num_rejected", *MEMORY_KEYS,
    *TIER_SUMMARY_KEYS,
)

# What each summary key means and its unit, (unit, meaning), composed as the keys are: the reference page of the
# metrics (`kvplan.reference`) prints it, and tests/docs fail for a key without an entry.
_LATENCY_HELP = {
    "ttft": "time to first token, arrival to the first output token, as the client sees it",
    "tpot": "time per output token after the first ((E2E - TTFT) / (output tokens - 1)), per request, as the "
            "client sees it",
    "itl": "inter-token latency: every gap between two consecutive output tokens of a request",
    "e2el": "end-to-end latency, arrival to the last token, as the client sees it",
    "ttft_engine": "TTFT inside the engine (without the API server in front; equal to the client's when none is "
                   "simulated)",
    "tpot_engine": "TPOT inside the engine (without the API server)",
    "e2el_engine": "end-to-end latency inside the engine (without the API server)",
}
_STAT_HELP = {"mean": "mean", "median": "median (50th percentile)", "p90": "90th percentile",
              "p99": "99th percentile"}
# the memory breakdown (engine.core.metrics: fractions of the KV token slots that sum to 1), averaged over time
_MEMORY_HELP = {
    "token_states": "KV slots holding a computed token's K and V",
    "internal_fragmentation": "allocated KV slots beyond what a request will ever need (the tail of its last "
                              "block; a reservation larger than the real length)",
    "reserved_unused": "KV slots allocated to a request for tokens it will produce but has not yet",
    "external_fragmentation": "free KV slots a contiguous allocator cannot use (outside the largest free extent; "
                              "0 for paged allocation)",
    "free": "free KV slots (cached-but-free blocks count as free, as in vLLM)",
}
_TIER_HELP = {"hits": "blocks a prefix lookup found in the {tier} tier (and the GPU did not have)",
              "promotions": "blocks copied from the {tier} tier into the GPU",
              "demotions": "blocks stored in the {tier} tier (evicted from the tier above, or written through)",
              "dropped": "blocks the {tier} tier evicted with nowhere below to go",
              "bytes": "bytes the {tier} tier's link moved (promotions out of it and stores into it)"}
_TIERS = {"cpu": "CPU", "disk": "local-disk", "shared": "cluster-shared"}
SUMMARY_HELP: dict[str, tuple[str, str]] = {
    "completed": ("requests", "requests that finished inside the measurement window"),
    "duration_s": ("s", "the measurement window (a replay: first arrival to last finish)"),
    "request_throughput": ("requests/s", "completed requests per second of the window"),
    "output_throughput": ("tokens/s", "output tokens per second of the window"),
    "total_token_throughput": ("tokens/s", "prompt and output tokens per second of the window"),
    "request_goodput": ("requests/s", "requests per second meeting every per-request SLO bound (DistServe's "
                                      "goodput; null without bounds)"),
    **{f"{stat}_{lat}_ms": ("ms", f"{_STAT_HELP[stat]} of the {_LATENCY_HELP[lat]}")
       for lat in (*LATENCIES, *ENGINE_LATENCIES) for stat in _STAT_HELP},
    "kv_usage_mean": ("fraction", "time-weighted mean share of the KV blocks in use"),
    "kv_usage_peak": ("fraction", "the largest share of the KV blocks in use at once"),
    "kv_token_utilization": ("fraction", "token_states / (token_states + reserved_unused + internal_fragmentation): "
                                         "the share of allocated KV slots holding real tokens"),
    "prefix_cache_queries": ("tokens", "prompt tokens looked up in the prefix cache"),
    "prefix_cache_hits": ("tokens", "prompt tokens found in the prefix cache (computed once, reused)"),
    "prefix_cache_hit_rate": ("fraction", "prefix_cache_hits / prefix_cache_queries"),
    "num_preemptions": ("count", "running requests preempted to free KV blocks"),
    "num_evicted_blocks": ("blocks", "cached free blocks evicted from the prefix cache to be reused"),
    "num_rejected": ("requests", "requests refused because they can never run (longer than max_model_len, or "
                                 "more KV than the cache holds)"),
    **{key: ("fraction", f"{text}: time-weighted share of the KV slots") for key, text in _MEMORY_HELP.items()},
    **{f"kv_offload_{tier}_{counter}": ("bytes" if counter == "bytes" else "blocks",
                                        text.format(tier=name) + " (null: no such tier)")
       for tier, name in _TIERS.items() for counter, text in _TIER_HELP.items()},
}


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """`np.percentile(np.repeat(values, weights), q)` (linear method) without expanding; values sorted."""
    total = int(weights.sum())
    if total == 0:
        return float("nan")
    h = (total - 1) * q / 100.0
    lo = int(np.floor(h))
    ends = np.cumsum(weights)
    i = int(np.searchsorted(ends, lo, side="right"))
    j = int(np.searchsorted(ends, min(lo + 1, total - 1), side="right"))
    return float(values[i] + (h - lo) * (values[j] - values[i]))


def _stats(name: str, values: np.ndarray, weights: np.ndarray | None = None) -> dict[str, float]:
    if weights is None:
        values = values[~np.isnan(values)]
        weights = np.ones(len(values), dtype=np.int64)
        values = np.sort(values)
    total = int(weights.sum())
    # fsum, not np.dot: a BLAS dot splits long vectors across its threads, so its last bits depended on the machine's
    # core count (and it rounds at every add); fsum is the exactly rounded sum wherever it runs
    mean = math.fsum((values * weights).tolist()) / total if total else float("nan")
    return {f"mean_{name}_ms": mean, f"median_{name}_ms": weighted_percentile(values, weights, 50),
            f"p90_{name}_ms": weighted_percentile(values, weights, 90),
            f"p99_{name}_ms": weighted_percentile(values, weights, 99)}


def latency_summary(table: pd.DataFrame, itl: ItlLog, goodput: dict[str, float | None] | None = None,
                    duration_s: float | None = None) -> dict[str, float | None]:
    """vLLM serving-benchmark keys from the per-request table and the inter-token gaps. `request_goodput` (vLLM's
    name; DistServe's sense) is the rate of requests meeting every bound in `goodput`, None without bounds.
    `duration_s` overrides the span from the first arrival to the last finish (a measurement window)."""
    completed = int(table.loc[table["sample"] == 0, "request"].nunique()) if len(table) else 0
    duration = float(table["finish_s"].max() - table["arrival_s"].min()) if len(table) else 0.0
    duration = duration if duration_s is None else duration_s
    output = int(table["output_tokens"].sum())
    prompt = int(table.loc[table["sample"] == 0, "prompt_tokens"].sum())
    rate = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    values, counts = itl.arrays()
    return {"completed": completed, "duration_s": duration, "request_throughput": rate(completed),
            "output_throughput": rate(output), "total_token_throughput": rate(output + prompt),
            "request_goodput": None if goodput is None else rate(goodput_count(table, goodput)),
            **_stats("ttft", table["ttft_ms"].to_numpy()), **_stats("tpot", table["tpot_ms"].to_numpy()),
            **_stats("itl", values * 1e3, counts), **_stats("e2el", table["e2el_ms"].to_numpy()),
            **{key: value for lat in ENGINE_LATENCIES for key, value in _stats(lat, table[f"{lat}_ms"].to_numpy()
                                                                              ).items()}}


def kv_summary(usage_integral_blocks_s: float, total_blocks_s: float, peak: float, series: pd.DataFrame,
               counters: dict[str, int]) -> dict[str, float | None]:
    """KV keys: time-weighted and peak block usage, token utilization and memory breakdown averaged over the
    sampled series, and the prefix-cache / preemption / eviction counters summed over replicas."""
    queries, hits = counters["prefix_cache_queries"], counters["prefix_cache_hits"]
    memory = {key: float(series[key].mean()) if len(series) else 0.0 for key in MEMORY_KEYS}
    allocated = memory["token_states"] + memory["reserved_unused"] + memory["internal_fragmentation"]
    return {"kv_usage_mean": usage_integral_blocks_s / total_blocks_s if total_blocks_s else 0.0,
            "kv_usage_peak": peak,
            "kv_token_utilization": memory["token_states"] / allocated if allocated else 1.0,
            "prefix_cache_queries": queries, "prefix_cache_hits": hits,
            "prefix_cache_hit_rate": hits / queries if queries else 0.0,
            "num_preemptions": counters["num_preemptions"], "num_evicted_blocks": counters["num_evicted_blocks"],
            "num_rejected": counters.get("num_rejected", 0), **memory,
            **{key: counters.get(key) for key in TIER_SUMMARY_KEYS}}  # null where the run had no such tier


def summarize(table: pd.DataFrame, itl: ItlLog, kv: dict[str, float | None],
              goodput: dict[str, float | None] | None = None) -> dict[str, float | None]:
    summary = {**latency_summary(table, itl, goodput), **kv}
    return {key: summary[key] for key in SUMMARY_KEYS}
