"""The report's figures, as PNG bytes. Each function returns None when the experiment holds no data for it (a
latency-vs-rate plot needs more than one rate; a capacity plot needs a search), so a report shows what was
measured and nothing empty.

A metric per point is drawn against the first numeric swept key when there is one (one line per combination of
the other swept keys: hit rate vs cache size per eviction policy), else as one bar per point. Every y-axis starts
at zero, except the latency panels: log scale, said in their title (near capacity latency grows by orders of
magnitude). A replica search draws its latencies against the GPUs its probes used (replicas x TP x PP), not the
offered rate (which a replica search holds fixed). The binding limit is marked: a red cross on the latency panel
of the SLO that stopped each configuration, at its first failing probe, and named beside each capacity.
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
              bound: float | None = None, notes: pd.Series | None = None) -> bytes | None:
    """`metric` per point; `notes` (aligned with `points`): a short text written beside each point's value."""
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
        where = list(zip(points[x], values, strict=True))
    else:
        ax.bar(range(len(points)), values, color="C0")
        ax.set_xticks(range(len(points)), points["label"], rotation=30, ha="right", fontsize=8)
        where = list(zip(range(len(points)), values, strict=True))
    if notes is not None:
        for (px, py), note in zip(where, notes, strict=True):
            if np.isfinite(py) and note:
                ax.annotate(str(note), (px, py), textcoords="offset points", xytext=(0, 4), ha="center",
                            fontsize=7, color="C3")
    if bound is not None:
        ax.axhline(bound, color="k", ls="--", lw=1, label="SLO")
    top = float(np.nanmax(values)) if bound is None else max(float(np.nanmax(values)), bound)
    ax.set_ylim(0, top * 1.15 if top > 0 else 1.0)  # from zero, with room for the notes
    ax.set(title=title, ylabel=ylabel)
    ax.grid(alpha=0.3)
    return _png(fig)


PANELS = ("p99_ttft_ms", "p90_tpot_ms", "p90_e2el_ms")


def panels(slo: dict[str, float]) -> tuple[str, ...]:
    """The latency panels: every SLO'd latency first (its line and binding mark are drawn there), then
    `PANELS`, three at least."""
    return tuple(dict.fromkeys([*(k for k in slo if k.endswith("_ms")), *PANELS]))[:max(3, len(slo))]


def latency_vs_load(runs: pd.DataFrame, swept: list[str], slo: dict[str, float],
                    knees: dict[str, float] | None = None, x: str = "offered_rate_rps",
                    xlabel: str = "offered request rate (req/s)",
                    marks: list[tuple[str, float, float]] | None = None) -> bytes | None:
    """p99 TTFT, p90 TPOT and p90 E2E vs the load `x` (the offered rate; GPUs for a replica search), one line
    per configuration (the swept keys other than the load), from the probes judged stable (or burst replays:
    they have no verdict) - an unstable probe's percentiles describe a backlog still growing, not a load the
    server holds. `knees` maps a line's label to `x` at its capacity, marked on each panel; `marks` are binding
    limits: (panel metric, x, y) at a configuration's first failing probe."""
    keys = [k for k in swept if k not in ("workload.rate_scale", "workload.rate", "workload.concurrency")]
    runs = runs[runs["verdict"].isin(("stable", "burst"))]
    groups = list(runs.groupby(keys, sort=False)) if keys else [((), runs)]
    if not groups or max(g[x].nunique() for _, g in groups) < 2:
        return None
    shown_panels = panels(slo)
    fig, axes = _figure(1, len(shown_panels), size=(4.7 * len(shown_panels), 4))
    for ax, metric in zip(axes[0], shown_panels, strict=True):
        for i, (name, group) in enumerate(groups):
            name = name if isinstance(name, tuple) else (name,)
            label = " ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(keys, name, strict=True)) or "base"
            for j, (_, seed) in enumerate(group.groupby("seed", sort=True)):  # one curve per seed: its own draws
                mean = seed.groupby(x)[metric].mean().sort_index()
                ax.plot(mean.index, mean.values, marker="o", ms=3, lw=0.8, alpha=0.8, color=f"C{i}",
                        label=label if j == 0 else None)
            knee = (knees or {}).get(label)
            if knee is not None and np.isfinite(knee):
                ax.axvline(knee, color=f"C{i}", ls=":", lw=1)
        if metric in slo:
            ax.axhline(slo[metric], color="k", ls="--", lw=1, label="SLO")
        shown = [(mx, my) for panel, mx, my in marks or () if panel == metric and np.isfinite(my) and my > 0]
        if shown:
            ax.plot(*zip(*shown, strict=True), "x", color="C3", ms=9, mew=2, label="binding limit (first failure)")
        ax.set(xlabel=f"{xlabel}, stable probes; dotted: capacity", ylabel=metric.replace("_ms", " (ms)"))
        values = pd.to_numeric(runs[metric], errors="coerce")
        if (values > 0).any():
            ax.set_yscale("log")
        else:  # nothing to draw on a log axis (one-token outputs have no TPOT): linear, from zero
            ax.set_ylim(bottom=0)
            ax.set_title(f"{metric}: no positive value (linear scale)", fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle("Latency vs load - log scale (not from zero): near capacity latency grows by orders of magnitude",
                 fontsize=10)
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
    ax.set_ylim(bottom=0)
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
    bottom.set_ylim(bottom=0)
    bottom.set(xlabel="time (s)", ylabel="requests per replica")
    bottom.legend(fontsize=8)
    bottom.grid(alpha=0.3)
    return _png(fig)


def cost_frontier(points: pd.DataFrame, latency: str) -> bytes | None:
    """A min_cost search's Pareto frontier: throughput per GPU and $ per million tokens against `latency`, one
    marker per shape meeting the SLOs (at its answer), the frontier joined by a line; None when no shape meets."""
    met = points[points["status"].isin(("winner", "tie", "feasible"))]
    if met.empty:
        return None
    fig, axes = _figure(1, 2, size=(11, 4.2))
    for ax, metric, flag, ylabel in ((axes[0][0], "throughput_per_gpu", "frontier_throughput",
                                      "tokens/s per GPU (higher is better)"),
                                     (axes[0][1], "usd_per_m_tokens", "frontier_cost",
                                      "$ per million tokens (lower is better)")):
        for i, (_, row) in enumerate(met.iterrows()):
            best = row["status"] in ("winner", "tie")
            ax.plot(row[latency], row[metric], "*" if best else "o", ms=11 if best else 6, color=f"C{i % 10}",
                    label=str(row["label"]))
        front = met[met[flag]].sort_values(latency)
        ax.plot(front[latency], front[metric], "-", color="k", lw=1, label="Pareto frontier")
        ax.set(xlabel=latency.replace("_ms", " (ms)"), ylabel=ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Shapes meeting the SLOs at their fewest replicas (star: the cheapest, or tied for it)",
                 fontsize=10)
    return _png(fig)
