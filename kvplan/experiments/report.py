"""Writing an experiment's result set: tables, `result.json`, `summary.md`, the figures and `report.html` - a
single self-contained page (figures embedded as data URIs, no script, no external resource) to send to a
colleague: the recommendation and why, the SLOs, the points table, the figures and the experiment file itself.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

import numpy as np
import pandas as pd

from kvplan.experiments import model_range, pd_block, plots
from kvplan.experiments.answer import cost_markdown, summary_markdown, vllm_text
from kvplan.experiments.criteria import gate_lines
from kvplan.experiments.min_cost import mark_winner
from kvplan.experiments.min_cost_text import FRONTIER_HEADERS, SHAPE_HEADERS, frontier_rows, shape_rows, winner_line
from kvplan.experiments.rank_by import rank_by
from kvplan.experiments.ranking import Recommendation, capacity_sentence, recommend
from kvplan.experiments.results import (
    COUNTS,
    answer_runs,
    cell,
    load_line,
    point_table,
    points_table,
    runs_frame,
    slo_lines,
)
from kvplan.experiments.runner import Outcome
from kvplan.experiments.schema import REPLICA_TARGETS, SLO_KEYS, Experiment
from kvplan.output import json_text, write_atomic

UNITS = {"max_rate": "req/s (sustained)", "max_goodput": "req/s (sustained)", "max_concurrency": "users",
         "max_burst_scale": "rate scale (x the recorded trace)", "min_replicas": "replicas",
         "min_cost": "replicas"}
FIGURES = (
    ("cost_frontier", "Cheapest deployment: the Pareto frontier of the shapes meeting the SLOs (throughput per GPU and "
                      "$ per million tokens vs latency)"),
    ("latency_vs_rate", "Latency vs offered request rate (stable probes; dotted: each configuration's capacity; "
                        "red cross: its binding SLO at its first failing probe)"),
    ("latency_vs_gpus", "Latency vs GPUs of the replica search (stable probes; dotted: each configuration's answer; "
                        "red cross: its binding SLO at its first failing probe)"),
    ("slo_headroom", "SLO headroom"),
    ("capacity", "Capacity under the SLOs, each with its binding limit"),
    ("throughput", "Request throughput"),
    ("memory_breakdown", "KV memory breakdown per point"),
    ("kv_over_time", "KV memory and queues over time (recommended point)"),
    ("prefix_hit_rate", "Prefix-cache hit rate"),
    ("preemptions", "Preemptions"),
)


def _parquet(frame: pd.DataFrame) -> bytes:
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    return buffer.getvalue()


def figures(exp: Experiment, outcome: Outcome, runs: pd.DataFrame, points: pd.DataFrame, rec: Recommendation,
            staging: Path) -> dict[str, bytes]:
    swept = list(exp.sweep_grid) + list(exp.sweep_zip)
    out = {**latency_figure(exp, runs, points, swept),
           "slo_headroom": plots.slo_headroom(points, exp.slo, exp.attainment),
           "throughput": plots.per_point(points, swept, "request_throughput", "Request throughput", "req/s"),
           "memory_breakdown": plots.memory_breakdown(points),
           "preemptions": plots.per_point(points, swept, "num_preemptions", "Preemptions", "count")}
    if exp.search:
        gpus = exp.search["target"] in REPLICA_TARGETS  # what a replica search buys: GPUs
        out["capacity"] = plots.per_point(points, swept, "gpus" if gpus else "answer",
                                          f"Capacity: {exp.search['target']} (median of seeds; red: binding limit)",
                                          "GPUs (replicas x TP x PP)" if gpus else UNITS[exp.search["target"]],
                                          notes=points["binding_limit"])
    if "frontier_cost" in points:  # a min_cost search
        out["cost_frontier"] = plots.cost_frontier(points, exp.search["latency"])
    if (runs["prefix_cache_queries"] > 0).any():
        out["prefix_hit_rate"] = plots.per_point(points, swept, "prefix_cache_hit_rate", "Prefix-cache hit rate",
                                                 "hit rate")
    shown = rec.point if rec.point is not None else rec.tie[0] if rec.tie else 0
    task = next(t for t in outcome.tasks if t.point.index == shown and not t.edge)  # the point's first search
    run = answer_runs(task, runs).iloc[0]["run"]
    series = pd.read_parquet(staging / "runs" / run / "series.parquet")
    out["kv_over_time"] = plots.kv_over_time(series, f"{task.point.label} (run {run})")
    return {name: png for name, png in out.items() if png is not None}


def latency_figure(exp: Experiment, runs: pd.DataFrame, points: pd.DataFrame,
                   swept: list[str]) -> dict[str, bytes | None]:
    """Latency against the load: the offered rate, or for a replica search the GPUs its probes used; each
    configuration's answer dotted and its binding SLO crossed at its first failing probe (`binding_at`)."""
    keys = [k for k in swept if k not in ("workload.rate_scale", "workload.rate", "workload.concurrency")]
    replicas = exp.search is not None and exp.search["target"] in REPLICA_TARGETS
    # (runs.parquet's gpus: each run's deployment at its probed replicas, a P/D point's pools included)
    x, answer = ("gpus", "gpus") if replicas else ("offered_rate_rps", "offered_rate_rps")
    knees = {" ".join(f"{k.split('.')[-1]}={row[k]}" for k in keys) or "base": row[answer]
             for _, row in points.iterrows()} if exp.search else None
    marks = []
    for _, row in points.iterrows() if exp.search else ():
        metric = SLO_KEYS.get(str(row["binding_key"]).removeprefix("slo."))
        if metric not in plots.panels(exp.slo) or not np.isfinite(row["binding_at"]):
            continue
        at = runs[(runs["point"] == row["point"]) & np.isclose(runs["probe"], row["binding_at"])]
        if len(at):
            marks.append((metric, float(at[x].mean()), float(at[metric].mean())))
    name, xlabel = ("latency_vs_gpus", "GPUs (replicas x TP x PP)") if replicas else \
        ("latency_vs_rate", "offered request rate (req/s)")
    return {name: plots.latency_vs_load(runs, swept, exp.slo, knees, x, xlabel, marks)}


def write_results(exp: Experiment, outcome: Outcome, staging: Path) -> None:
    """Everything but the runs themselves, into the staging directory (swapped in whole afterwards)."""
    runs = runs_frame(exp, outcome)
    points = points_table(exp, outcome, runs)
    if exp.search:  # each run beside its point's range (the edge searches' runs included)
        runs = runs.merge(points[["point", *model_range.RANGE_COLUMNS]], on="point", how="left")
    rec = recommend(exp, points)
    if outcome.plan is not None:
        points = mark_winner(points, rec)
    write_atomic(staging / "runs.parquet", _parquet(runs))
    write_atomic(staging / "points.parquet", _parquet(points))
    write_atomic(staging / "experiment.yaml", exp.text)
    summary = summary_markdown(exp, points, rec, len(outcome.runs), outcome.model_errors)
    write_atomic(staging / "summary.md", summary)
    doc = {"name": exp.name, "recommendation": {"point": rec.point, "label": rec.label, "why": rec.why,
                                                "tie": [{"point": i, "label": label} for i, label in
                                                        zip(rec.tie, rec.tie_labels, strict=True)],
                                                "runner_up": rec.runner_up, "rank_by": rank_by(exp)},
           "pd_vs_co_located": pd_block.comparison(exp, points),
           "slo": slo_lines(exp), "gates": [{"name": g.name, "condition": g.short, "key": g.key or None}
                                            for g in gate_lines(exp)],
           "runs": len(outcome.runs), "runs_made": outcome.made,
           "runs_reused": outcome.reused, "points": points.to_dict(orient="records"),
           "model_error": model_range.json_blocks(exp, points, outcome.model_errors)}
    write_atomic(staging / "result.json", json_text(doc))
    central = runs[runs["step_scale"] == 1.0]  # the figures show the answer's runs, not the band's edges
    images = figures(exp, outcome, central, points, rec, staging) if exp.outputs["plots"] else {}
    for name, png in images.items():
        write_atomic(staging / "plots" / f"{name}.png", png)
    if exp.outputs["report"]:
        write_atomic(staging / "report.html", report_html(exp, points, rec, images, len(outcome.runs), runs,
                                                          model_range.html_section(exp, outcome.model_errors)))


def cost_section(exp: Experiment, points: pd.DataFrame, rec: Recommendation) -> str:
    """A min_cost search's winner, every shape's status and reason, and the frontier table ("" otherwise)."""
    if "frontier_cost" not in points:
        return ""
    e = html.escape
    latency = exp.search["latency"]
    return (f"<h2>Cheapest deployment</h2><p class='rec'>{e(winner_line(exp, points, rec))}</p>"
            f"<h3>Shapes</h3>{_table(SHAPE_HEADERS, shape_rows(points))}"
            f"<h3>Pareto frontier (* on it)</h3>"
            f"{_table((*FRONTIER_HEADERS[:2], latency, *FRONTIER_HEADERS[3:]), frontier_rows(exp, points))}")


PROBE_TABLE = ("point", "label", "seed", "probe", "step_scale", "offered_rate_rps", "verdict", *COUNTS, "p99_ttft_ms",
               "p90_tpot_ms", "slo_met", "slo_broken")


def _table(headers, rows, best: int | None = None) -> str:
    e = html.escape
    head = "".join(f"<th>{e(str(h))}</th>" for h in headers)
    body = "".join("<tr" + (' class="best"' if best is not None and row[0] == best else "") + ">"
                   + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<div class='scroll'><table><tr>{head}</tr>{body}</table></div>"


def report_html(exp: Experiment, points: pd.DataFrame, rec: Recommendation, images: dict[str, bytes],
                runs: int, run_table: pd.DataFrame, model_error: str) -> str:
    """The report page. Every probe is listed with its stability verdict and its request counts (warm-up,
    measured, cool-down, unfinished), so that an answer can be traced to the runs behind it."""
    e = html.escape
    headers, rows = point_table(exp, points)
    probes = [[cell(row[h]) for h in PROBE_TABLE] for _, row in run_table.iterrows()]
    capacity = "".join(f"<li><b>{e(row['label'])}</b>: "
                       + e(capacity_sentence(exp, row) if pd.notna(row["answer"]) else row["search_outcome"])
                       + "</li>" for _, row in points.iterrows()) if exp.search else ""
    if rec.point is not None:
        verdict = f"<p class='rec'>Recommended: <b>{e(rec.label)}</b> — {e(rec.why)}.</p>"
    elif rec.tie:
        verdict = f"<p class='rec none'>Tie: <b>{e(', '.join(rec.tie_labels))}</b> — {e(rec.why)}.</p>"
    else:
        verdict = f"<p class='rec none'>No recommendation: {e(rec.why)}.</p>"
    slo = "".join(f"<li>{e(line)}</li>" for line in slo_lines(exp)) or "<li>none given</li>"
    gates = "".join(f"<li><b>{e(g.name)}</b>: {e(g.rule)}{f' ({e(g.key)})' if g.key else ''}</li>"
                    for g in gate_lines(exp))
    limits = "".join(f"<li><b>{e(row['label'])}</b>: {e(row['binding_limit'])} "
                     f"({e(row['binding_key'] or 'fixed')}): {e(row['binding_detail'])}</li>"
                     for _, row in points.iterrows())
    cost = "".join(f"<li>{e(line.removeprefix('- ').replace('**', ''))}</li>" for line in cost_markdown(exp, points)
                   if line.startswith("- "))
    figs = "".join(f"<figure><img alt='{e(title)}' src='data:image/png;base64,"
                   f"{base64.b64encode(images[name]).decode()}'><figcaption>{e(title)}</figcaption></figure>"
                   for name, title in FIGURES if name in images)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>kvplan: {e(exp.name)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.85em; }} td, th {{ border: 1px solid #ccc; padding: 3px 6px; }}
tr.best {{ background: #e6f4e6; }} .rec {{ font-size: 1.15em; }} .none {{ color: #a00; }}
.scroll {{ overflow-x: auto; }} figure {{ margin: 1.5em 0; }} img {{ max-width: 100%; }}
pre {{ background: #f6f6f6; padding: 1em; }}
</style></head><body>
<h1>{e(exp.name)}</h1>
<p>{e(exp.description)}</p>
<p>{len(points)} point(s), {runs} run(s), seeds {e(str(exp.seeds))}; model {e(exp.base['model'])} on
{e(exp.base['hardware'])}, {e(vllm_text(exp, points))}.</p>
{verdict}
<p>{e(load_line(exp))}</p>
{f"<h2>Capacity</h2><ul>{capacity}</ul>" if capacity else ""}
{cost_section(exp, points, rec)}
{model_error}
<h2>Cost</h2><p>At {e(exp.prices.kind.replace('_', '-'))} prices (docs/cost.md): replicas x TP x PP GPUs paid every
hour, split between input and output tokens by the prefill share of their busy time; each point, then each GPU's
price with its source and date.</p><ul>{cost}</ul>
<h2>Binding limits</h2><p>What stopped each answer from being higher (fewer replicas), and the key that moves
it.</p><ul>{limits}</ul>
<h2>SLOs</h2><ul>{slo}</ul>
<h2>Gates</h2><p>Besides the SLOs, these can decide an answer.</p><ul>{gates}</ul>
<h2>Points</h2>{_table(headers, rows, rec.point)}
<h2>Figures</h2>{figs}
<h2>Runs</h2><p>Every run (search probe) with its stability verdict and request counts; a probe must be stable
before its SLOs count. A step_scale other than 1 marks a run of the model range's searches.</p>
{_table(PROBE_TABLE, probes)}
<h2>Experiment file</h2><pre>{e(exp.text)}</pre>
</body></html>
"""
