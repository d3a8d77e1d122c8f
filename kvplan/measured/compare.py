"""Measured against simulated: each latency figure the file states (or its records give) beside the simulator's,
with the relative error, and the throughput.

Both sides use the same definitions (vLLM's, which `results.summary` follows): TTFT from send to first token,
TPOT (E2E - TTFT) / (output - 1) per request with more than one output token, ITL every gap between tokens, E2E
from send to last token; percentiles by linear interpolation (`np.percentile`), means plain. The measured side
covers the requests the tool counted as successful; the simulated side every request it served.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kvplan.measured.record import METRICS, MeasuredRun

# The simulator's summary keys per point (`results.summary`) and per metric.
_SUMMARY_STAT = {"mean": "mean", "50": "median", "90": "p90", "99": "p99"}
_SUMMARY_NAME = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2el"}
_TABLE_COLUMN = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2e": "e2el_ms"}  # per request: any percentile
DEFAULT_POINTS = ("mean", "50", "90", "99")  # computed from records when the file states no figure
THROUGHPUT = (("request_rps", "request_throughput", "req/s"), ("output_tps", "output_throughput", "out_tok/s"))


def distribution(values: Sequence[float] | np.ndarray, points: Iterable[str]) -> dict[str, float]:
    """`points` ("mean" or a percentile such as "99") of `values`, as the tools compute them (numpy's linear)."""
    array = np.asarray(values, dtype=np.float64)
    return {p: float(array.mean() if p == "mean" else np.percentile(array, float(p))) for p in points}


def point_key(point: object) -> str:
    """A percentile key as record.py spells it: "mean", or the percentile's number ("50", "99.9"); a reader's
    "p99" or 99 is read the same."""
    text = str(point).strip().lower().removeprefix("p")
    if text in ("mean", "median"):
        return "mean" if text == "mean" else "50"
    number = float(text)
    return str(int(number)) if number.is_integer() else str(number)


def _order(point: str) -> float:
    return -1.0 if point == "mean" else float(point)


def measured(run: MeasuredRun) -> dict[str, dict[str, float]]:
    """Seconds per metric and point: the tool's own figures, and for a metric it gives none, the figures of its
    successful per-request records (when it kept them)."""
    out = {m: {point_key(p): v for p, v in run.percentiles.get(m, {}).items()} for m in METRICS}
    ok = [r for r in run.requests or [] if r.ok]
    samples = {
        "ttft": [r.ttft_s for r in ok if r.ttft_s is not None],
        "e2e": [r.e2e_s for r in ok if r.e2e_s is not None],
        "tpot": [(r.e2e_s - r.ttft_s) / (r.output_tokens - 1) for r in ok
                 if r.e2e_s is not None and r.ttft_s is not None and r.output_tokens > 1],
        "itl": [g for r in ok for g in r.itl_s or []],
    }
    for metric in METRICS:
        if not out[metric] and samples[metric]:
            out[metric] = distribution(samples[metric], DEFAULT_POINTS)
    return {m: dict(sorted(v.items(), key=lambda kv: _order(kv[0]))) for m, v in out.items() if v}


def simulated(result, metric: str, point: str) -> float | None:
    """The simulator's figure in seconds (None: not computed for this point, e.g. ITL's p95)."""
    if point in _SUMMARY_STAT:
        value = result.summary.get(f"{_SUMMARY_STAT[point]}_{_SUMMARY_NAME[metric]}_ms")
    elif metric in _TABLE_COLUMN and len(result.requests):
        column = result.requests[result.requests["sample"] == 0][_TABLE_COLUMN[metric]].dropna().to_numpy()
        value = float(np.percentile(column, float(point))) if len(column) else None
    else:
        value = None
    return None if value is None or not math.isfinite(value) else value / 1e3


@dataclass(slots=True)
class Row:
    """One figure side by side. Latencies in seconds; throughput rows (`metric` req/s, out_tok/s) in their unit."""

    metric: str
    point: str
    measured: float
    simulated: float | None

    @property
    def error_pct(self) -> float | None:
        """(simulated - measured) / measured: positive when the simulator is slower (or, for throughput, higher)."""
        if self.simulated is None or self.measured <= 0:
            return None
        return (self.simulated - self.measured) / self.measured * 100

    def to_json(self) -> dict:
        return {"metric": self.metric, "point": self.point, "measured": self.measured, "simulated": self.simulated,
                "error_pct": self.error_pct}


def compare(run: MeasuredRun, result) -> list[Row]:
    """Every latency figure of the run beside the simulation's, then the throughput figures the run states."""
    rows = [Row(metric, point, value, simulated(result, metric, point))
            for metric, points in measured(run).items() for point, value in points.items()]
    for ours, key, label in THROUGHPUT:
        if ours in run.throughput:
            value = result.summary.get(key)
            rows.append(Row(label, "", run.throughput[ours], None if value is None else float(value)))
    return rows


def table_rows(rows: list[Row]) -> list[list[str]]:
    """Rows for `output.format_table` under TABLE_HEADERS: latencies in ms."""
    def cell(value: float | None, scale: float) -> str:
        return "-" if value is None else f"{value * scale:.4g}"

    out = []
    for row in rows:
        scale = 1.0 if row.point == "" else 1e3
        point = "" if row.point == "" else "mean" if row.point == "mean" else f"p{row.point}"
        error = row.error_pct
        out.append([row.metric, point, cell(row.measured, scale), cell(row.simulated, scale),
                    "-" if error is None else f"{error:+.1f}%"])
    return out


TABLE_HEADERS = ("metric", "stat", "measured", "simulated", "error")
