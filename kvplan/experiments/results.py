"""An experiment's answer: the run table, the point table, the recommendation and `summary.md`.

runs.parquet has one row per run: point, label, seed, the search's probed value, every configuration knob
(dotted names), every summary metric, the attainment share and the SLO verdict. Wall-clock time stays in each
run's summary.json, so that the table depends only on the configurations (a resumed sweep ends with exactly the
table an uninterrupted one writes). points.parquet has one row per point: its metrics at the answer (averaged
over seeds), the SLO verdict, and for a search the capacity found.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvplan.experiments.runner import Outcome
from kvplan.experiments.schema import SEARCH_TARGETS, Experiment
from kvplan.experiments.search import PointTask
from sim.metrics import SUMMARY_KEYS

HEADLINE = ("request_throughput", "p99_ttft_ms", "p90_tpot_ms", "p90_e2el_ms", "kv_usage_mean",
            "kv_token_utilization", "prefix_cache_hit_rate", "num_preemptions")


def flatten(config: dict) -> dict[str, object]:
    out = {"model": config["model"], "hardware": config["hardware"]}
    for section in ("engine", "cluster"):
        out.update({f"{section}.{k}": v for k, v in config[section].items()})
    out["workload.rate_scale"] = config["workload"]["rate_scale"]
    return out


def runs_frame(exp: Experiment, outcome: Outcome) -> pd.DataFrame:
    probe_key = SEARCH_TARGETS[exp.search["target"]] if exp.search else None
    rows = []
    for key, run in outcome.runs.items():
        doc, config = run["doc"], run["config"]
        for point in run["points"]:
            task = outcome.tasks[point]
            flat = flatten(config)
            rows.append({"point": point, "label": task.point.label, "seed": config["seed"],
                         "probe": float(flat[probe_key]) if probe_key else math.nan, "run": key, **flat,
                         **{k: doc["summary"][k] for k in SUMMARY_KEYS},
                         "offered_rate_rps": doc["offered_rate_rps"], "num_blocks": doc["info"]["num_blocks"],
                         "rejected": doc["info"]["rejected"], "attainment": doc["attainment"],
                         "slo_met": run["met"], "slo_broken": "; ".join(run["broken"])})
    frame = pd.DataFrame(rows)
    return frame.sort_values(["point", "probe", "seed"], kind="stable").reset_index(drop=True)


def answer_runs(task: PointTask, runs: pd.DataFrame) -> pd.DataFrame:
    """The runs that describe a point: all its runs, or for a search those at its answer (else its last probe)."""
    mine = runs[runs["point"] == task.point.index]
    if not task.exp.search:
        return mine
    value = task.answer if task.answer is not None else task.probes[-1][0]
    return mine[np.isclose(mine["probe"], float(value))]


def points_frame(exp: Experiment, outcome: Outcome, runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for task in outcome.tasks:
        at = answer_runs(task, runs)
        row = {"point": task.point.index, "label": task.point.label, **task.point.values,
               "seeds": len(at), "slo_met": bool(at["slo_met"].all()),
               **{k: float(at[k].mean()) for k in (*SUMMARY_KEYS, "offered_rate_rps")},
               "attainment": float(at["attainment"].mean()) if at["attainment"].notna().any() else math.nan}
        if exp.search:
            row["answer"] = math.nan if task.answer is None else float(task.answer)
            row["search_outcome"] = task.outcome or "found"
            row["probes"] = len(task.probes)
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass(slots=True)
class Recommendation:
    point: int | None
    label: str
    why: str


def recommend(exp: Experiment, points: pd.DataFrame) -> Recommendation:
    metric, goal = exp.objective["metric"], exp.objective["goal"]
    ascending = goal == "min"
    by = f"{goal} {metric}"
    if exp.search:
        target = exp.search["target"]
        found = points[points["answer"].notna()]
        if found.empty:
            return Recommendation(None, "", f"no point meets the SLOs inside the searched range "
                                            f"[{exp.search['low']:g}, {exp.search['high']:g}]")
        best_first = target == "min_replicas"
        ranked = found.sort_values(["answer", metric], ascending=[best_first, ascending], kind="stable")
        best = ranked.iloc[0]
        what = (f"the highest capacity under the SLOs: rate scale x{best['answer']:.3g} "
                f"({best['offered_rate_rps']:.3g} req/s offered)" if target == "max_rate"
                else f"the fewest replicas meeting the SLOs: {int(best['answer'])}")
        return Recommendation(int(best["point"]), best["label"], f"{what}; ties broken by {by}")
    eligible = points[points["slo_met"]] if (exp.slo or exp.attainment) else points
    if eligible.empty:
        closest = points.sort_values("attainment" if exp.attainment else metric,
                                     ascending=not exp.attainment and ascending, kind="stable").iloc[0]
        return Recommendation(None, "", f"no point meets the SLOs; the closest is {closest['label']}")
    best = eligible.sort_values(metric, ascending=ascending, kind="stable").iloc[0]
    among = f"{len(eligible)} of {len(points)} points meet the SLOs" if (exp.slo or exp.attainment) else \
        f"{len(points)} points, no SLO given"
    return Recommendation(int(best["point"]), best["label"],
                          f"{among}; it has the {'lowest' if ascending else 'highest'} {metric} "
                          f"({best[metric]:.4g})")


def slo_lines(exp: Experiment) -> list[str]:
    lines = [f"{k} <= {v:g}" for k, v in exp.slo.items()]
    if exp.attainment:
        bounds = ", ".join(f"{k} <= {v:g}" for k, v in exp.attainment.items() if k != "fraction" and v is not None)
        lines.append(f"at least {exp.attainment['fraction']:.0%} of requests with {bounds}")
    return lines


def point_table(exp: Experiment, points: pd.DataFrame) -> tuple[list[str], list[list[object]]]:
    headers = ["point", "label", *(["answer", "search_outcome"] if exp.search else []), "slo_met",
               *(["attainment"] if exp.attainment else []), *HEADLINE]
    rows = [[_cell(row[h]) for h in headers] for _, row in points.iterrows()]
    return headers, rows


def _cell(value: object) -> object:
    if isinstance(value, float | np.floating):
        return "n/a" if not math.isfinite(value) else float(f"{value:.4g}")
    if isinstance(value, np.bool_ | bool):
        return "yes" if value else "no"
    return value.item() if isinstance(value, np.generic) else value


def summary_markdown(exp: Experiment, points: pd.DataFrame, rec: Recommendation, runs: int) -> str:
    headers, rows = point_table(exp, points)
    lines = [f"# {exp.name}", ""]
    if exp.description:
        lines += [exp.description.strip(), ""]
    lines += [f"{len(points)} point(s), {runs} run(s), seeds {exp.seeds}.", ""]
    if exp.slo or exp.attainment:
        lines += ["SLOs: " + "; ".join(slo_lines(exp)) + ".", ""]
    if exp.search:
        lines += [f"Search: {exp.search['target']} over [{exp.search['low']:g}, {exp.search['high']:g}]"
                  + (f", tolerance {exp.search['tolerance']:g}" if exp.search["target"] == "max_rate" else "")
                  + ".", ""]
    verdict = f"**{rec.label}** — {rec.why}." if rec.point is not None else f"**none** — {rec.why}."
    lines += ["## Recommendation", "", verdict, "", "## Points", ""]
    lines += ["| " + " | ".join(headers) + " |", "|---" * len(headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
