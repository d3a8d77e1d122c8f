"""Per-request table and the vLLM-style summary, shared by the simulator and (later) the engine's replay.

The per-request table has one row per generated sequence (an n > 1 request gives n rows, `sample` 0..n-1).
Inter-token latencies are kept as a multiset of (gap, count) at microsecond resolution: one entry per distinct
gap instead of one per token, so a million requests fit in memory.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

import numpy as np
import pandas as pd

from kvplan.engine.core.metrics import TIER_SUMMARY_KEYS

RAW_COLUMNS = ("request", "sample", "replica", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s",
               "prompt_tokens", "output_tokens", "cached_prompt_tokens", "preemptions", "itl_max_s")
_INT_COLUMNS = {"request", "sample", "replica", "prompt_tokens", "output_tokens", "cached_prompt_tokens",
                "preemptions"}
LATENCIES = ("ttft", "tpot", "itl", "e2el")
# Per-request latency bounds (goodput, SLO attainment) -> the per-request table's column.
REQUEST_BOUNDS = {"ttft_ms": "ttft_ms", "tpot_ms": "tpot_ms", "itl_ms": "itl_max_ms", "e2el_ms": "e2el_ms"}
MEMORY_KEYS = ("token_states", "internal_fragmentation", "reserved_unused", "external_fragmentation", "free")
SUMMARY_KEYS = (
    "completed", "duration_s", "request_throughput", "output_throughput", "total_token_throughput",
    "request_goodput",
    *(f"{stat}_{lat}_ms" for lat in LATENCIES for stat in ("mean", "median", "p90", "p99")),
    "kv_usage_mean", "kv_usage_peak", "kv_token_utilization", "prefix_cache_queries", "prefix_cache_hits",
    "prefix_cache_hit_rate", "num_preemptions", "num_evicted_blocks", "num_rejected", *MEMORY_KEYS,
    *TIER_SUMMARY_KEYS,
)


class RequestLog:
    """Finished sequences, appended column by column into typed arrays (8 bytes per cell)."""

    def __init__(self) -> None:
        self.columns = {name: array("q" if name in _INT_COLUMNS else "d") for name in RAW_COLUMNS}

    def add(self, *values: float) -> None:
        for column, value in zip(self.columns.values(), values, strict=True):
            column.append(value)

    def __len__(self) -> int:
        return len(self.columns["request"])

    def to_frame(self, request_ids: np.ndarray | None = None) -> pd.DataFrame:
        """The per-request table, ordered by (request, sample), with the derived latency columns."""
        frame = pd.DataFrame({name: np.frombuffer(col, dtype=np.int64 if name in _INT_COLUMNS else np.float64)
                              for name, col in self.columns.items()})
        frame = frame.sort_values(["request", "sample"], kind="stable").reset_index(drop=True)
        if request_ids is not None:
            frame.insert(0, "request_id", np.asarray(request_ids)[frame["request"].to_numpy()])
        return add_latency_columns(frame)


def add_latency_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """TTFT, TPOT (mean gap after the first token, vLLM's definition), E2E latency and queueing delay."""
    out = frame["output_tokens"].to_numpy()
    ttft = frame["first_token_s"] - frame["arrival_s"]
    e2el = frame["finish_s"] - frame["arrival_s"]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2el - ttft) / np.maximum(out - 1, 1), np.nan)
    frame["ttft_ms"] = ttft * 1e3
    frame["tpot_ms"] = tpot * 1e3
    frame["itl_max_ms"] = np.where(out > 1, frame["itl_max_s"] * 1e3, np.nan)
    frame["e2el_ms"] = e2el * 1e3
    frame["queueing_ms"] = (frame["first_scheduled_s"] - frame["arrival_s"]) * 1e3
    return frame.drop(columns=["itl_max_s"])


class ItlLog:
    """Multiset of inter-token gaps, counted per microsecond: gap -> count. Microsecond bins keep the table small
    on long runs (a bin per distinct float would grow with the number of steps) and lose nothing at the
    millisecond precision the summary reports."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}

    def add(self, seconds: float, count: int = 1) -> None:
        self.add_many((seconds,), (count,))

    def add_many(self, seconds: Iterable[float], counts: Iterable[int]) -> None:
        table = self.counts
        for gap, count in zip(seconds, counts, strict=True):
            key = round(gap * 1e6)
            table[key] = table.get(key, 0) + count

    def merge(self, others: Iterable[ItlLog]) -> ItlLog:
        for other in others:
            for key, count in other.counts.items():
                self.counts[key] = self.counts.get(key, 0) + count
        return self

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(sorted gaps in seconds, counts)."""
        keys = np.fromiter(self.counts.keys(), dtype=np.int64, count=len(self.counts))
        counts = np.fromiter(self.counts.values(), dtype=np.int64, count=len(self.counts))
        order = np.argsort(keys, kind="stable")
        return keys[order] / 1e6, counts[order]


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
    mean = float(np.dot(values, weights) / total) if total else float("nan")
    return {f"mean_{name}_ms": mean, f"median_{name}_ms": weighted_percentile(values, weights, 50),
            f"p90_{name}_ms": weighted_percentile(values, weights, 90),
            f"p99_{name}_ms": weighted_percentile(values, weights, 99)}


def within_bounds(table: pd.DataFrame, bounds: dict[str, float | None]) -> np.ndarray:
    """Per sequence: every per-request bound (`REQUEST_BOUNDS` keys, None: unbounded) holds; NaN fails."""
    ok = np.ones(len(table), dtype=bool)
    for key, column in REQUEST_BOUNDS.items():
        if bounds.get(key) is not None:
            ok &= np.nan_to_num(table[column].to_numpy(dtype=float), nan=np.inf) <= bounds[key]
    return ok


def goodput_count(table: pd.DataFrame, bounds: dict[str, float | None]) -> int:
    """Requests whose every sequence meets every bound (DistServe's goodput counts these)."""
    if not len(table):
        return 0
    return int(pd.Series(within_bounds(table, bounds)).groupby(table["request"].to_numpy()).all().sum())


def latency_summary(table: pd.DataFrame, itl: ItlLog, goodput: dict[str, float | None] | None = None,
                    duration_s: float | None = None) -> dict[str, float]:
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
            **_stats("itl", values * 1e3, counts), **_stats("e2el", table["e2el_ms"].to_numpy())}


def kv_summary(usage_integral_blocks_s: float, total_blocks_s: float, peak: float, series: pd.DataFrame,
               counters: dict[str, int]) -> dict[str, float]:
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


def summarize(table: pd.DataFrame, itl: ItlLog, kv: dict[str, float],
              goodput: dict[str, float | None] | None = None) -> dict[str, float]:
    summary = {**latency_summary(table, itl, goodput), **kv}
    return {key: summary[key] for key in SUMMARY_KEYS}
