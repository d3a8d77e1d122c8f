"""Writing an experiment's result set: tables, `result.json`, `summary.md`, the figures and `report.html` - a
single self-contained page (figures embedded as data URIs, no script, no external resource) to send to a
colleague: the recommendation and why, the SLOs, the points table, the figures and the experiment file itself.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

import pandas as pd

from kvplan.experiments import plots
from kvplan.experiments.results import (
    Recommendation,
    answer_runs,
    point_table,
    points_frame,
    recommend,
    runs_frame,
    slo_lines,
    summary_markdown,
)
from kvplan.experiments.runner import Outcome
from kvplan.experiments.schema import Experiment
from kvplan.output import json_text, write_atomic

FIGURES = (
    ("latency_vs_rate", "Latency vs offered request rate"),
    ("slo_headroom", "SLO headroom"),
    ("capacity", "Capacity under the SLOs"),
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
    out = {"latency_vs_rate": plots.latency_vs_rate(runs, swept, exp.slo),
           "slo_headroom": plots.slo_headroom(points, exp.slo, exp.attainment),
           "throughput": plots.per_point(points, swept, "request_throughput", "Request throughput", "req/s"),
           "memory_breakdown": plots.memory_breakdown(points),
           "preemptions": plots.per_point(points, swept, "num_preemptions", "Preemptions", "count")}
    if exp.search:
        unit = "rate scale (x workload)" if exp.search["target"] == "max_rate" else "replicas"
        out["capacity"] = plots.per_point(points, swept, "answer", f"Capacity: {exp.search['target']}", unit)
    if (runs["prefix_cache_queries"] > 0).any():
        out["prefix_hit_rate"] = plots.per_point(points, swept, "prefix_cache_hit_rate", "Prefix-cache hit rate",
                                                 "hit rate")
    shown = rec.point if rec.point is not None else 0
    run = answer_runs(outcome.tasks[shown], runs).iloc[0]["run"]
    series = pd.read_parquet(staging / "runs" / run / "series.parquet")
    out["kv_over_time"] = plots.kv_over_time(series, f"{outcome.tasks[shown].point.label} (run {run})")
    return {name: png for name, png in out.items() if png is not None}


def write_results(exp: Experiment, outcome: Outcome, staging: Path) -> None:
    """Everything but the runs themselves, into the staging directory (swapped in whole afterwards)."""
    runs = runs_frame(exp, outcome)
    points = points_frame(exp, outcome, runs)
    rec = recommend(exp, points)
    write_atomic(staging / "runs.parquet", _parquet(runs))
    write_atomic(staging / "points.parquet", _parquet(points))
    write_atomic(staging / "experiment.yaml", exp.text)
    summary = summary_markdown(exp, points, rec, len(outcome.runs))
    write_atomic(staging / "summary.md", summary)
    doc = {"name": exp.name, "recommendation": {"point": rec.point, "label": rec.label, "why": rec.why},
           "slo": slo_lines(exp), "runs": len(outcome.runs), "runs_made": outcome.made,
           "runs_reused": outcome.reused, "points": points.to_dict(orient="records")}
    write_atomic(staging / "result.json", json_text(doc))
    images = figures(exp, outcome, runs, points, rec, staging) if exp.outputs["plots"] else {}
    for name, png in images.items():
        write_atomic(staging / "plots" / f"{name}.png", png)
    if exp.outputs["report"]:
        write_atomic(staging / "report.html", report_html(exp, points, rec, images, len(outcome.runs)))


def report_html(exp: Experiment, points: pd.DataFrame, rec: Recommendation, images: dict[str, bytes],
                runs: int) -> str:
    e = html.escape
    headers, rows = point_table(exp, points)
    table = "".join(f"<th>{e(str(h))}</th>" for h in headers)
    body = "".join("<tr" + (' class="best"' if row[0] == rec.point else "") + ">"
                   + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    verdict = (f"<p class='rec'>Recommended: <b>{e(rec.label)}</b> — {e(rec.why)}.</p>" if rec.point is not None
               else f"<p class='rec none'>No recommendation: {e(rec.why)}.</p>")
    slo = "".join(f"<li>{e(line)}</li>" for line in slo_lines(exp)) or "<li>none given</li>"
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
{e(exp.base['hardware'])}.</p>
{verdict}
<h2>SLOs</h2><ul>{slo}</ul>
<h2>Points</h2><div class="scroll"><table><tr>{table}</tr>{body}</table></div>
<h2>Figures</h2>{figs}
<h2>Experiment file</h2><pre>{e(exp.text)}</pre>
</body></html>
"""
