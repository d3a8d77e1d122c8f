"""Comparing live runs with simulations of them: policy identity, timing error against the noise band, plots,
and the markdown report of `kvplan validate`.

Policy fidelity: a simulation priced by the live run's own step durations (`--cost recorded`) must give every
sequence the same token times (to float rounding: a duration is end − start, and start + duration may differ
from end in the last bit) and the same counters. Timing fidelity: a simulation priced by a calibrated profile
is compared percentile by percentile with the median of N live runs; the live runs' spread is the noise band.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field

import numpy as np

from kvplan.engine.core.metrics import TIER_COUNTER_KEYS
from kvplan.results.serving_result import ServingResult

TOKEN_TIME_TOLERANCE_S = 1e-9
LATENCY_KEYS = tuple(f"{stat}_{lat}_ms" for lat in ("ttft", "tpot", "itl", "e2el") for stat in ("median", "p90",
                                                                                                  "p99"))
RATE_KEYS = ("request_throughput", "output_throughput")
# The targets (DESIGN.md, "Fidelity"): median |error| over configurations.
TARGETS = {"median_e2el_ms": 3.0, "p90_e2el_ms": 3.0, "median_tpot_ms": 3.0, "p90_tpot_ms": 3.0,
           "p99_ttft_ms": 8.0}


def counters(result: ServingResult) -> dict[str, int | None]:
    """The policy counters side by side; None where a run could not see one (an endpoint that does not expose
    it), never a made-up 0."""
    s, blocks = result.summary, result.info["num_blocks"]

    def known(value: float | None) -> int | None:
        return None if value is None or math.isnan(value) else round(value)

    # cached_tokens_reported: an endpoint's per-request cached-token counts (usage cached_tokens, llama.cpp's
    # timings.cache_n), summed; the simulator's (and the in-process engine's) own prefix hits beside them
    reported = result.info.get("reported_cached_tokens", s["prefix_cache_hits"])
    out = {"num_preemptions": known(s["num_preemptions"]), "prefix_cache_hits": known(s["prefix_cache_hits"]),
           "cached_tokens_reported": known(reported), "num_evicted_blocks": known(s["num_evicted_blocks"]),
           "peak_blocks": known(s["kv_usage_peak"] * blocks) if blocks is not None else None}
    # the prefix tiers' counters of the tiers the run had (kv_offload_cpu_promotions, ...)
    out.update((key, known(s[key])) for key in TIER_COUNTER_KEYS if s.get(key) is not None)
    return out


@dataclass(slots=True)
class PolicyCheck:
    identical: bool
    sequences: int
    max_token_diff_s: float
    differences: list[str] = field(default_factory=list)  # the first few, described


def policy_check(live: ServingResult, sim: ServingResult) -> PolicyCheck:
    """Every sequence's token times and every counter, live vs simulated."""
    diffs: list[str] = []
    worst = 0.0
    for key, times in sorted(live.token_times.items()):
        other = sim.token_times.get(key)
        if other is None or len(other) != len(times):
            diffs.append(f"request row {key[0]} sample {key[1]}: {len(times)} live tokens, "
                         f"{'none' if other is None else len(other)} simulated")
            continue
        gap = max((abs(a - b) for a, b in zip(times, other, strict=True)), default=0.0)
        worst = max(worst, gap)
        if gap > TOKEN_TIME_TOLERANCE_S:
            diffs.append(f"request row {key[0]} sample {key[1]}: token times differ by up to {gap:.3g} s")
    for key in sorted(set(sim.token_times) - set(live.token_times)):
        diffs.append(f"request row {key[0]} sample {key[1]}: simulated but never finished live")
    a, b = counters(live), counters(sim)
    diffs += [f"{k}: live {a.get(k)}, simulated {b.get(k)}" for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]
    return PolicyCheck(not diffs, len(live.token_times), worst, diffs[:5])


def error_pct(simulated: float, live: float) -> float:
    return (simulated - live) / live * 100.0 if live else (0.0 if simulated == live else math.inf)


@dataclass(slots=True)
class MetricRow:
    metric: str
    live: float  # median over the live runs
    band_pct: float  # half the live runs' range, in % of `live` (0 with one run)
    simulated: float
    error_pct: float

    @property
    def within(self) -> bool:
        target = TARGETS.get(self.metric)
        return target is None or abs(self.error_pct) <= max(target, self.band_pct)


def timing_rows(lives: list[ServingResult], sim: ServingResult,
                keys: tuple[str, ...] = (*LATENCY_KEYS, *RATE_KEYS)) -> list[MetricRow]:
    """Per summary key: the live runs' median and band, the simulation and its error."""
    rows = []
    for key in keys:
        values = np.array([r.summary[key] for r in lives], dtype=float)
        live = float(np.median(values))
        band = float((values.max() - values.min()) / 2 / live * 100) if live and len(values) > 1 else 0.0
        rows.append(MetricRow(key, live, band, float(sim.summary[key]), error_pct(sim.summary[key], live)))
    return rows


def target_summary(per_config: dict[str, list[MetricRow]]) -> list[dict]:
    """Per targeted metric: the median |error| over configurations, the median band, and the verdict."""
    out = []
    for metric, target in TARGETS.items():
        rows = [next(r for r in rows if r.metric == metric) for rows in per_config.values()]
        errors = [abs(r.error_pct) for r in rows]
        bands = [r.band_pct for r in rows]
        median_error, median_band = float(np.median(errors)), float(np.median(bands))
        out.append({"metric": metric, "median_abs_error_pct": median_error, "median_noise_band_pct": median_band,
                    "target_pct": target, "met": median_error <= max(target, median_band)})
    return out


def cdf_plot(lives: list[ServingResult], sims: dict[str, ServingResult], title: str) -> bytes:
    """PNG: CDFs of TTFT, TPOT and E2E latency per request, every live run against the simulation(s)."""
    from kvplan.caches import prepare_matplotlib

    prepare_matplotlib()  # a writable font cache, no stale lock (kvplan.caches)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, column in zip(axes, ("ttft_ms", "tpot_ms", "e2el_ms"), strict=True):
        for i, live in enumerate(lives):
            _cdf(ax, live.requests[column], f"live {i + 1}", color="0.3", alpha=0.7, ls="-")
        for (name, sim), color in zip(sims.items(), ("C1", "C0"), strict=False):
            _cdf(ax, sim.requests[column], f"simulated ({name})", color=color, alpha=1.0, ls="--")
        ax.set(xscale="log", xlabel=column.replace("_ms", " (ms)"), ylabel="fraction of requests")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def _cdf(ax, values, label: str, **style) -> None:
    v = np.sort(np.asarray(values, dtype=float))
    v = v[np.isfinite(v) & (v > 0)]
    if len(v):
        ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=label, **style)
