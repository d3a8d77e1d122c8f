"""Each point's model error and the range it puts on the answer, in the tables, summary.md and report.html.

Per point, `point_errors` says which source priced its GPU and how accurate that source is
(`sim.gpu.model_error.model_error_for` on the point's SimSpec). For a search, the point's range comes from its
edge searches (`search.PointTask.step_scale`): each re-finds the answer of the point's first search with every
step's compute time at one edge of the band, and moves the point's answer by as much - by the same ratio for a
rate or a scale, by the same difference for a count of users or replicas - so that the range is the point's
answer's, not the one seed's. The range always holds the answer; an edge search that ends outside [low, high]
leaves that end of the range open (NaN: "outside the range searched"). Its resolution is the search's.
"""

from __future__ import annotations

import html
import json
import math

import pandas as pd

from kvplan.experiments.points import expand
from kvplan.experiments.schema import INTEGER_TARGETS, REPLICA_TARGETS, Experiment
from kvplan.experiments.search import PointTask
from kvplan.sim.gpu.model_error import FAMILY_HEADERS, UNKNOWN, ModelError

POINT_COLUMNS = ("model_error_source", "model_error_band_lo_pct", "model_error_band_hi_pct")
RANGE_COLUMNS = ("capacity_model_lo", "capacity_model_hi")


def point_errors(exp: Experiment) -> dict[int, ModelError]:
    """Point index -> the model error of the cost model its runs are priced with."""
    from kvplan.experiments.execute import build_spec
    from kvplan.sim.gpu.model_error import model_error_for

    return {point.index: model_error_for(build_spec(point.config)) for point in expand(exp)}


def edge_scales(errors: dict[int, ModelError]) -> dict[int, tuple[float, float]]:
    """Point index -> the step-time factors of its band's edges, for the points whose source states a band."""
    return {index: scales for index, error in errors.items() if (scales := error.scales) is not None}


def error_columns(error: ModelError | None) -> dict[str, object]:
    band = error.band_pct if error is not None else None
    return {"model_error_source": error.source if error is not None else UNKNOWN,
            "model_error_band_lo_pct": band[0] if band else math.nan,
            "model_error_band_hi_pct": band[1] if band else math.nan}


def capacity_range(exp: Experiment, tasks: list[PointTask], answer: float | None) -> tuple[float, float]:
    """(low, high) of the point's answer over the model band; (NaN, NaN) without edge searches or an answer."""
    edges = [t for t in tasks if t.edge]
    central = next(t for t in tasks if not t.edge)  # the search the edges were guided by (make_tasks' order)
    if not edges or answer is None or central.answer is None:
        return math.nan, math.nan
    integer = exp.search["target"] in INTEGER_TARGETS
    moved = [answer + (t.answer - central.answer) if integer else answer * t.answer / central.answer
             for t in edges if t.answer is not None]
    low, high = min([answer, *moved]), max([answer, *moved])
    if len(moved) < len(edges):  # an edge failed even at `low` (or needed more than `high` replicas)
        if exp.search["target"] in REPLICA_TARGETS:
            high = math.nan
        else:
            low = math.nan
    return float(low), float(high)


def missing_range(exp: Experiment, tasks: list[PointTask], error: ModelError | None) -> str:
    """Why a point's answer has no model range ("" when its edge searches ran)."""
    if any(t.edge for t in tasks):
        return ""
    if error is None or error.band_pct is None:
        return "model error unknown"
    if tasks[0].point.config["workload"]["mode"] == "burst":
        return "model range not computed for a burst replay"
    if exp.search["model_range"] == "none":
        return "model range not searched (search.model_range: none)"
    return "model range only for the recommended or tied points, or with search.model_range: every_point"


def range_clause(row: pd.Series) -> str:
    """The answer's model range for a capacity sentence, `model range 16.8-21.1`, or why there is none."""
    if row.get("model_range_note"):
        return row["model_range_note"]
    low, high = row.get("capacity_model_lo", math.nan), row.get("capacity_model_hi", math.nan)
    if not (math.isfinite(low) or math.isfinite(high)):  # its first seed, the edges' guide, found no answer
        return "no model range: the first seed found no answer to move" if math.isfinite(row["answer"]) else ""
    shown = [f"{v:.4g}" if math.isfinite(v) else "outside the range searched" for v in (low, high)]
    return f"model range {shown[0]}-{shown[1]}"


def sources(errors: dict[int, ModelError]) -> list[ModelError]:
    """The distinct sources the points used, in point order; GPUs priced by the same figures (the analytic entry
    for several GPUs) shown once, under all their names."""
    groups: dict[str, list[ModelError]] = {}
    for error in errors.values():
        same = {**error.to_json(), "hardware": None}
        groups.setdefault(json.dumps(same, sort_keys=True), []).append(error)
    out = []
    for members in groups.values():
        names = ", ".join(dict.fromkeys(e.hardware for e in members))
        first = members[0]
        out.append(ModelError(first.source, names, first.basis, first.families, first.band_pct))
    return out


METHOD = ("A model range re-runs the point's first seed's search with every step's compute time at the band's edges "
          "(swaps and copies unchanged), started where the answer is expected to move and bisected to the same "
          "tolerance; the point's answer moves by the same ratio (difference, for users or replicas).")


def markdown(exp: Experiment, errors: dict[int, ModelError]) -> list[str]:
    """summary.md's `## Model error` section: every source with its per-family table, and how ranges are made."""
    lines = ["## Model error", ""]
    for error in sources(errors):
        lines += error.markdown()
    if exp.search:
        lines += [METHOD if exp.base["workload"]["mode"] != "burst" else
                  "A burst replay prices steps as the model does: no model range is computed.", ""]
    return lines


def html_section(exp: Experiment, errors: dict[int, ModelError]) -> str:
    """report.html's `Model error` section (the same content as summary.md's)."""
    e = html.escape
    parts = ["<h2>Model error</h2>"]
    for error in sources(errors):
        parts.append(f"<p><b>{e(error.hardware)}</b>: {e(error.source)} — {e(error.basis)}; "
                     f"{e(error.band_text())}.</p>")
        if error.families:
            head = "".join(f"<th>{e(h)}</th>" for h in FAMILY_HEADERS)
            body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>"
                           for row in error.family_rows())
            parts.append(f"<table><tr>{head}</tr>{body}</table>")
    if exp.search and exp.base["workload"]["mode"] != "burst":
        parts.append(f"<p>{e(METHOD)}</p>")
    return "\n".join(parts)


def json_blocks(exp: Experiment, points: pd.DataFrame, errors: dict[int, ModelError]) -> list[dict]:
    """result.json's `model_error`: per point, its source's block and, for a search, the answer's range."""
    out = []
    for _, row in points.iterrows():
        error = errors.get(int(row["point"]))
        block = {"point": int(row["point"]), "label": row["label"],
                 **(error.to_json() if error is not None else {"source": UNKNOWN})}
        if exp.search:
            block["capacity"] = {"answer": row["answer"], "model_lo": row["capacity_model_lo"],
                                 "model_hi": row["capacity_model_hi"], "target": exp.search["target"]}
        out.append(block)
    return out
