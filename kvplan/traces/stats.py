"""Summary statistics of a trace, and the infinite-cache prefix reuse when it carries prefix identity."""

from __future__ import annotations

import numpy as np

from kvplan.traces.schema import Trace

PERCENTILES = (50, 90, 99)


def summarize(trace: Trace) -> dict:
    gaps = np.diff(trace.arrival_s)
    mean_gap = float(gaps.mean()) if len(gaps) else 0.0
    timed = trace.timed and len(trace) > 1
    summary = {
        "source": trace.report.source, "format": trace.report.format, "requests": len(trace),
        "duration_s": float(trace.arrival_s[-1] - trace.arrival_s[0]) if timed else None,
        # The rate and CV of the inter-arrival gaps: 1 / mean gap, and std / mean (1 for Poisson).
        "mean_rate_rps": 1.0 / mean_gap if timed and mean_gap > 0 else None,
        "interarrival_cv": float(gaps.std() / mean_gap) if timed and mean_gap > 0 else None,
        "prompt_tokens": distribution(trace.prompt_tokens),
        "output_tokens": distribution(trace.output_tokens),
        "prefix": prefix_summary(trace) if trace.has_prefix else None,
        "load_report": trace.report.lines(),
    }
    return summary


def distribution(values: np.ndarray) -> dict:
    if len(values) == 0:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}, "max": None}
    points = np.percentile(values, PERCENTILES)
    quantiles = {f"p{p}": float(v) for p, v in zip(PERCENTILES, points, strict=True)}
    return {"mean": float(values.mean()), **quantiles, "max": int(values.max())}


def prefix_summary(trace: Trace) -> dict:
    hits, unique_blocks = _reuse(trace)
    total = int(trace.prompt_tokens.sum())
    return {
        "hash_granularity": trace.hash_granularity,
        "unique_blocks": unique_blocks,
        "prompt_tokens": total,
        "hit_tokens": int(hits.sum()),
        "reuse_fraction": float(hits.sum() / total) if total else 0.0,
    }


def infinite_cache_hits(trace: Trace) -> np.ndarray:
    """Prefix-cache hit tokens per request with an unbounded cache, requests taken in arrival order.

    A request hits its longest leading run of blocks that some earlier request already carried; the hit is
    min(k * granularity, prompt length). Vectorized: a block occurrence is "seen" when the first request
    that carried its hash id came before this one.
    """
    return _reuse(trace)[0]


def _reuse(trace: Trace) -> tuple[np.ndarray, int]:
    """(hit tokens per request, number of unique hash ids): one sort of the hash ids serves both."""
    assert trace.hash_ids is not None and trace.hash_offsets is not None
    ids, offsets = trace.hash_ids, trace.hash_offsets
    counts = np.diff(offsets)
    owner = np.repeat(np.arange(len(trace)), counts)
    _, first_index, inverse = np.unique(ids, return_index=True, return_inverse=True)
    seen = owner[first_index][inverse] < owner
    position = np.arange(len(ids)) - np.repeat(offsets[:-1], counts)
    # The first unseen position of each request is its run length; fully seen requests get their length.
    stop = np.where(seen, np.repeat(counts, counts), position)
    run = np.zeros(len(trace), dtype=np.int64)
    nonempty = counts > 0
    if nonempty.any():
        run[nonempty] = np.minimum.reduceat(stop, offsets[:-1][nonempty])
    return np.minimum(run * trace.hash_granularity, trace.prompt_tokens), len(first_index)
