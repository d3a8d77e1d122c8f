"""An endpoint replay as the simulator's result tables (the same per-request table, series and summary `kvplan
simulate` writes), plus what only a client sees: every token's time (tokens.jsonl) and failed requests
(failed.jsonl).

A black box hides some columns: `first_scheduled_s` is the time the request was sent (queueing inside the
server is not visible), preemptions per request are unknown (0; the server-wide count is in the summary when it
exposes vLLM's counter), and cached prompt tokens come from the usage's `prompt_tokens_details` when the server
reports them. The engine-internal latencies (`*_engine_ms`) are unknown to a client: null. Summary values the
server does not expose are null, never 0. Failed requests are not in the
per-request table: they are counted in `num_rejected` and by reason in `info.failed_reasons` (timeout,
server_error:<field>, ...: kvplan.endpoint.loadgen), and each is in failed.jsonl with its reason and error.
Values the server sent against their meaning outside a request (a /metrics sample or counter, a failed scrape)
are excluded and counted in `info.server_faults` ({kind: {count, first}}).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from kvplan.endpoint.loadgen import LoadResult
from kvplan.endpoint.servers import KvConfig
from kvplan.engine.core.metrics import TIER_SUMMARY_KEYS
from kvplan.output import json_line, write_atomic
from kvplan.results.itl import ItlLog
from kvplan.results.rejected import references, rejected_rows
from kvplan.results.request_table import ENGINE_LATENCY_COLUMNS, RequestLog
from kvplan.results.serving_result import ServingResult
from kvplan.results.summary import MEMORY_KEYS, SUMMARY_KEYS, latency_summary
from kvplan.sim.replica import SERIES_COLUMNS
from kvplan.traces import Trace


def to_result(load: LoadResult, trace: Trace, kv: KvConfig | None = None) -> ServingResult:
    """The tables of one replay. A request whose per-token gaps are approximate (a server streaming text without
    token ids, counts that did not add up) keeps its row but adds no gaps to the ITL distribution."""
    table, itl, tokens = RequestLog(), ItlLog(), {}
    for o in load.outcomes:
        if o.error is not None:
            continue
        for sample, times in sorted(o.token_times.items()):
            gaps = np.diff(times) if len(times) > 1 else np.empty(0)
            if not o.gaps_approximate:
                itl.add_many(gaps.tolist(), [1] * len(gaps))
            table.add(o.row, sample, 0, o.arrival_s, o.sent_s, times[0], times[-1], o.prompt_tokens, len(times),
                      o.cached_tokens, 0, float(gaps.max()) if len(gaps) else 0.0)
            tokens[(o.row, sample)] = times
    frame = table.to_frame(trace.request_id)
    frame[list(ENGINE_LATENCY_COLUMNS)] = np.nan  # a client sees no engine-internal times (endpoint.frontend_fit)
    series = _series(load.series)
    # a server's own offload tiers are not read from it: their counters are null, as for a run without tiers
    summary = {**latency_summary(frame, itl), **_kv(load, series), **dict.fromkeys(TIER_SUMMARY_KEYS)}
    failed = [o for o in load.outcomes if o.error is not None]
    busy = float(frame["finish_s"].max() - frame["arrival_s"].min()) if len(frame) else 0.0
    done = [o for o in load.outcomes if o.error is None]
    kv = kv if kv is not None else KvConfig()
    reasons: dict[str, int] = {}
    for o in failed:
        reasons[o.reason or "unknown"] = reasons.get(o.reason or "unknown", 0) + 1
    info = {"num_blocks": kv.num_blocks, "block_size": kv.block_size, "replicas": 1, "steps": None,
            "busy_fraction": _busy(series), "failed": len(failed), "rejected": len(failed),
            "rejected_first": references(trace, [(o.row, o.error) for o in failed]), "wall_s": load.wall_s,
            "duration_s": busy, "server_counters": load.counters, "cache_config": load.cache_config,
            "server": load.server, "reported_cached_tokens": sum(o.cached_tokens for o in done),
            "approximate_gap_requests": sum(o.gaps_approximate for o in done),
            "failed_reasons": dict(sorted(reasons.items())), "server_faults": load.faults.to_json()}
    return ServingResult({key: summary[key] for key in SUMMARY_KEYS}, frame, series, info, tokens,
                     rejected_rows(trace, [(o.row, o.error) for o in failed]))


def _series(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame([{"replica": 0, **row} for row in rows], columns=list(SERIES_COLUMNS))
    return frame.astype({c: "float64" for c in SERIES_COLUMNS if c != "replica"})


def _kv(load: LoadResult, series: pd.DataFrame) -> dict[str, float]:
    """KV keys from the sampled gauges and the counters' differences; NaN (null) where the server is silent."""
    c = load.counters
    usage = series["kv_usage"].to_numpy() if len(series) else np.empty(0)
    usage = usage[~np.isnan(usage)]
    queries, hits = c.get("prefix_cache_queries", math.nan), c.get("prefix_cache_hits", math.nan)
    return {"kv_usage_mean": float(usage.mean()) if len(usage) else math.nan,
            "kv_usage_peak": float(usage.max()) if len(usage) else math.nan, "kv_token_utilization": math.nan,
            "prefix_cache_queries": queries, "prefix_cache_hits": hits,
            "prefix_cache_hit_rate": hits / queries if queries and not math.isnan(queries) else math.nan,
            "num_preemptions": c.get("num_preemptions", math.nan), "num_evicted_blocks": math.nan,
            "num_rejected": sum(o.error is not None for o in load.outcomes), **dict.fromkeys(MEMORY_KEYS, math.nan)}


def _busy(series: pd.DataFrame) -> float:
    """The share of /metrics samples that found the server with requests running: its busy fraction as far as
    a client can see (NaN without the gauge)."""
    running = series["running"].to_numpy() if len(series) else np.empty(0)
    running = running[~np.isnan(running)]
    return float((running > 0).mean()) if len(running) else math.nan


def write_client_files(load: LoadResult, out: Path) -> None:
    """tokens.jsonl: each sequence's token times (and ids, when returned); failed.jsonl: each failure."""
    lines = []
    for o in load.outcomes:
        for sample, times in sorted(o.token_times.items()):
            if o.error is None:
                lines.append(json_line({"row": o.row, "sample": sample, "times_s": times,
                                        "token_ids": o.token_ids.get(sample), "gaps_approximate": o.gaps_approximate,
                                        "cached_tokens": o.cached_tokens, "server_timings": o.server_timings}))
    write_atomic(out / "tokens.jsonl", "".join(f"{line}\n" for line in lines).encode())
    failed = [json_line({"row": o.row, "arrival_s": o.arrival_s, "sent_s": o.sent_s, "reason": o.reason,
                         "error": o.error,
                         "tokens_received": sum(len(t) for t in o.token_times.values())})
              for o in load.outcomes if o.error is not None]
    write_atomic(out / "failed.jsonl", "".join(f"{line}\n" for line in failed).encode())
