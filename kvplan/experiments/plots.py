"""The report's figures, as PNG bytes. Each function returns None when the experiment holds no data for it (a
latency-vs-rate plot needs more than one rate; a capacity plot needs a search), so a report shows what was
measured and nothing empty.

A metric per point is drawn against the first numeric swept key when there is one (one line per combination of
the other swept keys: hit rate vs cache size per eviction policy), else as one bar per point.
"""

from __future__ import annotations

import io

import numpy as np
import pandas as pd

from kvplan.results.summary import MEMORY_KEYS

MEMORY_COLORS = {"token_states": "C2", "internal_fragmentation": "C1", "reserved_unused": "C3",
                 "external_fragmentation": "C4", "free": "0.85"}


def _figure(*shape: int, size: tuple[float, float] = (7.5, 4.2)):
    from kvplan.caches import prepare_matplotlib

    prepare_matplotlib()  # a writable font cache, no stale lock (kvplan.caches)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*shape, figsize=size, squeeze=False)


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def swept_axes(points: pd.DataFrame, swept: list[str]) -> tuple[str | None, list[str]]:
    """(the numeric key to draw along x, the other swept keys) for per-point plots."""
    numeric = [k for k in swept if pd.api.types.is_numeric_dtype(points[k]) and not
               pd.api.types.is_bool_dtype(points[k]) and points[k].nunique() > 1]
    x = numeric[0] if numeric else None
    return x, [k for k in swept if k != x]


def per_point(points: pd.DataFrame, swept: list[str], metric: str, title: str, ylabel: str,
              bound: float | None = None) -> bytes | None:
    values = points[metric].astype(float)
    if not np.isfinite(values).any():
        return None
    fig, axes = _figure(1, 1)
    ax = axes[0][0]
    x, others = swept_axes(points, swept)
    if x is not None:
        groups = points.groupby(others, sort=False) if others else [((), points)]
        for name, group in groups:
            name = name if isinstance(name, tuple) else (name,)
            label = " ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(others, name, strict=True)) or metric
            group = group.sort_values(x)
            ax.plot(group[x], group[metric], marker="o", label=label)
        ax.set_xlabel(x)
        if len(others) or len(points) > 1:
            ax.legend(fontsize=8)
    else:
        ax.bar(range(len(points)), values, color="C0")
        ax.set_xticks(range(len(points)), points["label"], rotation=30, ha="right", fontsize=8)
    if bound is not None:
        ax.axhline(bound, color="k", ls="--", lw=1, label="SLO")
    ax.set(title=title, ylabel=ylabel)
    ax.grid(alpha=0.3)
    return _png(fig)


def latency_vs_rate(runs: pd.DataFrame, swept: list[str], slo: dict[str, float],
                    knees: dict[str, float] | None = None) -> bytes | None:
    """p99 TTFT, p90 TPOT and p90 E2E vs the offered request rate, one line per configuration (the swept keys
    other than the load), from the probes judged stable (or burst replays: they have no verdict) - an unstable
    probe's percentiles describe a backlog still growing, not a load the server holds. `knees` maps a line's
    label to the offered rate at its capacity, marked on each panel."""
    keys = [k for k in swept if k not in ("workload.rate_scale", "workload.rate", "workload.concurrency")]
    runs = runs[runs["verdict"].isin(("stable", "burst"))]
    groups = list(runs.groupby(keys, sort=False)) if keys else [((), runs)]
    if not groups or max(g["offered_rate_rps"].nunique() for _, g in groups) < 2:
        return None
    fig, axes = _figure(1, 3, size=(14, 4))
    for ax, metric in zip(axes[0], ("p99_ttft_ms", "p90_tpot_ms", "p90_e2el_ms"), strict=True):
        for i, (name, group) in enumerate(groups):
            name = name if isinstance(name, tuple) else (name,)
            label = " ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(keys, name, strict=True)) or "base"
            for j, (_, seed) in enumerate(group.groupby("seed", sort=True)):  # one curve per seed: its own draws
                mean = seed.groupby("offered_rate_rps")[metric].mean().sort_index()
                ax.plot(mean.index, mean.values, marker="o", ms=3, lw=0.8, alpha=0.8, color=f"C{i}",
                        label=label if j == 0 else None)
            knee = (knees or {}).get(label)
            if knee is not None and np.isfinite(knee):
                ax.axvline(knee, color=f"C{i}", ls=":", lw=1)
        if metric in slo:
            ax.axhline(slo[metric], color="k", ls="--", lw=1)
        ax.set(xlabel="offered request rate (req/s), stable probes; dotted: capacity",
               ylabel=metric.replace("_ms", " (ms)"), yscale="log")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    return _png(fig)


def slo_headroom(points: pd.DataFrame, slo: dict[str, float], attainment: dict | None) -> bytes | None:
    """Each SLO line's value / bound per point (<= 1 meets), and the attainment share."""
    lines = [(k, points[k] / bound) for k, bound in slo.items()]
    if attainment:
        lines.append(("attainment (target / share)", attainment["fraction"] / points["attainment"]))
    if not lines:
        return None
    fig, axes = _figure(1, 1, size=(max(6.0, 1.2 * len(points) + 3), 4.2))
    ax = axes[0][0]
    width = 0.8 / len(lines)
    for i, (name, ratio) in enumerate(lines):
        ax.bar(np.arange(len(points)) + i * width, ratio.astype(float), width, label=name)
    ax.axhline(1.0, color="k", ls="--", lw=1)
    ax.set_xticks(np.arange(len(points)) + 0.4 - width / 2, points["label"], rotation=30, ha="right", fontsize=8)
    ax.set(ylabel="value / SLO bound (<= 1 meets)", title="SLO headroom per point")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return _png(fig)


def memory_breakdown(points: pd.DataFrame) -> bytes:
    """Where the KV memory went, averaged over each point's run: the paged-vs-reservation picture."""
    fig, axes = _figure(1, 1, size=(max(6.0, 0.9 * len(points) + 3) + 2.0, 4.2))
    ax = axes[0][0]
    bottom = np.zeros(len(points))
    for key in MEMORY_KEYS:
        share = points[key].to_numpy(dtype=float)
        ax.bar(range(len(points)), share, bottom=bottom, color=MEMORY_COLORS[key], label=key.replace("_", " "))
        bottom += share
    ax.set_xticks(range(len(points)), points["label"], rotation=30, ha="right", fontsize=8)
    ax.set(ylabel="share of KV memory (time average)", ylim=(0, 1.0), title="KV memory breakdown")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


def kv_over_time(series: pd.DataFrame, title: str) -> bytes | None:
    """KV memory breakdown over time (replicas averaged) and the running / waiting queues."""
    if series.empty:
        return None
    mean = series.groupby("time_s")[[*MEMORY_KEYS, "running", "waiting"]].mean()
    fig, axes = _figure(2, 1, size=(9, 6))
    top, bottom = axes[0][0], axes[1][0]
    top.stackplot(mean.index, *(mean[k] for k in MEMORY_KEYS), labels=[k.replace("_", " ") for k in MEMORY_KEYS],
                  colors=[MEMORY_COLORS[k] for k in MEMORY_KEYS])
    top.set(ylabel="share of KV memory", ylim=(0, 1), title=title)
    top.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    bottom.plot(mean.index, mean["running"], label="running")
    bottom.plot(mean.index, mean["waiting"], label="waiting")
    bottom.set(xlabel="time (s)", ylabel="requests per replica")
    bottom.legend(fontsize=8)
    bottom.grid(alpha=0.3)
    return _png(fig)
