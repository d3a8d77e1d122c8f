"""A min_cost search's answer in words (`min_cost`): the winner (or the tie), every shape with its status and
reason, and the Pareto frontier - as terminal lines, summary.md markdown and report.html rows."""

from __future__ import annotations

import math

import pandas as pd

from kvplan.experiments.ranking import fixed_gpus
from kvplan.experiments.schema import Experiment

SHAPE_HEADERS = ("shape", "status", "replicas", "GPUs", "$/GPU-h", "$/h", "$/h over seeds", "$/h model range",
                 "$/Mtok in/out", "lower bound $/h", "reason")
FRONTIER_HEADERS = ("shape", "status", "latency", "tok/s per GPU", "$/Mtok", "frontier: tok/s/GPU",
                    "frontier: $/Mtok")


def _n(value: object, fmt: str = ".4g") -> str:
    return "-" if not isinstance(value, int | float) or not math.isfinite(value) else format(value, fmt)


def winner_line(exp: Experiment, points: pd.DataFrame, rec) -> str:  # rec: ranking.Recommendation
    """The cheapest configuration holding the rate, with its verdict and interval over seeds; or the tie."""
    rate = exp.base["workload"]["rate"]
    held = f"{rate:g} req/s" if rate is not None else "the trace's rate"
    by_point = {int(row["point"]): row for _, row in points.iterrows()}
    if rec.tie:
        shown = ", ".join(f"{by_point[i]['label']} (${_n(by_point[i]['shape_cost_low'])}-"
                          f"{_n(by_point[i]['shape_cost_high'])}/h)" for i in rec.tie)
        return (f"Tie for the cheapest deployment holding {held}: {shown}: their $/h intervals over the seeds overlap, "
                "so none is recommended (more seeds may separate them).")
    if rec.point is None:
        return f"No deployment holds {held} within the SLOs: {rec.why}."
    row = by_point[rec.point]
    fixed = fixed_gpus(row)
    prefill = f"{fixed:g} prefill GPUs + " if fixed else ""
    replicas = "decode replicas" if prefill else "replicas"  # (a P/D shape: its decode pool searched)
    return (f"Cheapest deployment holding {held}: {row['label']}: {prefill}{_n(row['answer'], 'g')} {replicas} x "
            f"{int(row['gpus_per_replica'])} GPUs = {_n(row['gpus'], 'g')} GPUs, ${_n(row['shape_cost_per_hour'])}/h "
            f"(${_n(row['price_per_gpu_hour'], '.3g')}/GPU-h{' for the decode GPUs' if prefill else ''}; "
            f"${_n(row['shape_cost_low'])}-"
            f"{_n(row['shape_cost_high'])}/h over {int(row['seeds'])} seed(s), {model_range(row)} over the GPU "
            "model's error band), "
            f"${_n(row['usd_per_m_input_tokens'], '.3g')}/Mtok in, "
            f"${_n(row['usd_per_m_output_tokens'], '.3g')}/Mtok out, "
            f"{_n(row['goodput_per_usd'], '.4g')} good requests per $ (sim.dollars, at the answer); "
            f"verdict {row['verdict']}.")


def model_range(row: pd.Series) -> str:
    """The $/h the GPU model's error band allows ("-": the point has no model range; an open end reads '?')."""
    ends = [row.get("shape_cost_model_lo"), row.get("shape_cost_model_hi")]
    known = [isinstance(v, int | float) and math.isfinite(v) for v in ends]
    if not any(known):
        return "-"
    return "-".join(_n(v) if ok else "?" for v, ok in zip(ends, known, strict=True))


def shape_rows(points: pd.DataFrame) -> list[list[str]]:
    """One row per shape (SHAPE_HEADERS), cheapest found first, then the rejected ones by point."""
    order = points.assign(_cost=points["shape_cost_per_hour"].fillna(math.inf)).sort_values(
        ["_cost", "point"], kind="stable")
    rows = []
    for _, row in order.iterrows():
        searched = math.isfinite(row["answer"])
        rows.append([str(row["label"]), str(row["status"]), _n(row["answer"], "g"),
                     _n(row.get("gpus"), "g") if searched else "-", _n(row["price_per_gpu_hour"], ".3g"),
                     _n(row["shape_cost_per_hour"]),
                     f"{_n(row['shape_cost_low'])}-{_n(row['shape_cost_high'])}" if searched else "-",
                     model_range(row) if searched else "-",
                     f"{_n(row['usd_per_m_input_tokens'], '.3g')}/{_n(row['usd_per_m_output_tokens'], '.3g')}"
                     if searched else "-", _n(row["lower_bound_per_hour"]), str(row["status_reason"] or "")])
    return rows


def frontier_rows(exp: Experiment, points: pd.DataFrame) -> list[list[str]]:
    """The shapes that meet the SLOs (FRONTIER_HEADERS) by latency, their frontier membership marked `*`."""
    latency = exp.search["latency"]
    met = points[points["status"].isin(("winner", "tie", "feasible"))].sort_values([latency, "point"])
    return [[str(row["label"]), str(row["status"]), _n(row[latency]), _n(row["throughput_per_gpu"]),
             _n(row["usd_per_m_tokens"], ".3g"), "*" if row["frontier_throughput"] else "",
             "*" if row["frontier_cost"] else ""] for _, row in met.iterrows()]


def terminal_lines(exp: Experiment, points: pd.DataFrame, rec) -> list[str]:
    """The winner, the shapes' statuses and reasons, and the frontier, short enough for the terminal."""
    lines = [winner_line(exp, points, rec), "Shapes (cheapest first):"]
    for row in shape_rows(points):
        label, status, replicas, gpus, _, cost, spread, by_model, per_token, _, reason = row
        what = f"{replicas} replicas, {gpus} GPUs, ${cost}/h (seeds {spread}, model range {by_model}), " \
            f"${per_token} per Mtok in/out" if replicas != "-" else ""
        lines.append(f"  {label}: {status}" + (f", {what}" if what else "") + (f": {reason}" if reason else ""))
    frontier = frontier_rows(exp, points)
    if frontier:
        lines.append(f"Pareto frontier vs {exp.search['latency']} (* on it): "
                     + "; ".join(f"{r[0]} {r[2]} ms, {r[3]} tok/s/GPU{' *' if r[5] else ''}, ${r[4]}/Mtok"
                                 f"{' *' if r[6] else ''}" for r in frontier) + ".")
    return lines


def _md_table(headers: tuple[str, ...], rows: list[list[str]]) -> list[str]:
    clean = [[c.replace("|", "\\|").replace("*", "\\*") for c in row] for row in rows]
    return ["| " + " | ".join(headers) + " |", "|---" * len(headers) + "|", *("| " + " | ".join(r) + " |"
                                                                             for r in clean)]


def markdown(exp: Experiment, points: pd.DataFrame, rec) -> list[str]:
    """summary.md's `## Cheapest deployment`: the winner, every shape's status with its reason, the frontier."""
    latency = exp.search["latency"]
    lines = ["## Cheapest deployment", "", winner_line(exp, points, rec), "",
             "Every shape: winner, tie, feasible (meets the SLOs, costs more), or rejected - SLO (no replica count up "
             "to search.high meets them), memory, gate, or cost bound (the cheapest any of its seeds can still need "
             "costs more than the cheapest shape's interval: searched only up to the cost ceiling, or not at all).", "",
             *_md_table(SHAPE_HEADERS, shape_rows(points)),
             "", f"Pareto frontier (shapes meeting the SLOs; * on the frontier of lower {latency} and higher "
             "throughput per GPU, or lower $ per million tokens):", "",
             *_md_table((*FRONTIER_HEADERS[:2], latency, *FRONTIER_HEADERS[3:]), frontier_rows(exp, points))]
    return lines
