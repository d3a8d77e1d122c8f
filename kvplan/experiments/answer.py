"""The answer in words: what `kvplan run` prints and what `summary.md` says.

The terminal answer fits `WIDTH` (100) columns: one row per configuration - its short label, the answer with its
seed interval (and model range where one was searched), and its binding limit with the key that moves it (see
`binding`) - then the recommendation or the tie (`ranking`), the SLOs and every gate that can decide an answer,
each with its value and key (`criteria.gate_lines`). On a terminal it is a rich table; piped, the same table in
plain ASCII (no escape codes). `summary.md` holds the same answer as markdown, then everything else: the full
points table, each capacity in a sentence, the model error.
"""

from __future__ import annotations

import io
import math
import sys
from pathlib import Path
from typing import TextIO

import pandas as pd

from kvplan.engine.core.vllm_versions import NEWEST
from kvplan.experiments import model_range
from kvplan.experiments.criteria import SUMMARY_TO_SLO, gate_lines, slo_name
from kvplan.experiments.pd_block import KEY as PD_KEY
from kvplan.experiments.pd_block import SPECULATIVE, comparison_line, hidden
from kvplan.experiments.rank_by import COLUMNS, rank_by
from kvplan.experiments.rank_by import HEADERS as RANK_HEADERS
from kvplan.experiments.rank_by import UNITS as RANK_UNITS
from kvplan.experiments.ranking import UNTESTED, Recommendation, capacity_sentence, fixed_gpus, rank_span, span
from kvplan.experiments.results import cell, load_line, point_table
from kvplan.experiments.schema import INTEGER_TARGETS, REPLICA_TARGETS, Experiment
from kvplan.sim.gpu.model_error import ModelError

WIDTH = 100
UNITS = {"max_rate": "req/s", "max_goodput": "req/s", "max_concurrency": "users", "max_burst_scale": "x rate",
         "min_replicas": "replicas", "min_cost": "replicas"}
# swept keys whose values name themselves ("h100-sxm", not "hardware=h100-sxm"; a P/D block by its shape, "1P2D")
TOP_LEVEL = ("model", "hardware", PD_KEY, SPECULATIVE)


def short_label(exp: Experiment, row: pd.Series) -> str:
    """A point's swept values, short: a model or GPU by its name, a switch as `prefix_caching` / `no
    prefix_caching` (`enable_` dropped), any other value as `leaf=value`; "base" without a sweep."""
    parts = []
    for key in (*exp.sweep_grid, *exp.sweep_zip):
        value, leaf = row[key], key.split(".")[-1]
        if hasattr(value, "item"):
            value = value.item()
        if hidden(key, value, row.get(PD_KEY)):
            continue
        if key in TOP_LEVEL:
            parts.append(str(value))
        elif isinstance(value, bool):
            name = leaf.removeprefix("enable_")
            parts.append(name if value else f"no {name}")
        else:
            parts.append(f"{leaf}={value}")
    return " ".join(parts) or "base"


def _number(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:.4g}"


def answer_table(exp: Experiment, points: pd.DataFrame, rec: Recommendation) -> tuple[list[str], list[list[str]]]:
    """The answer's table: headers and rows of text. The first column marks the recommended point `*` and the
    tied ones `=`."""
    ranged = exp.search is not None and points[list(model_range.RANGE_COLUMNS)].notna().any(axis=None)
    by = rank_by(exp)  # a rate ranked per GPU or per $: that figure beside the answer
    if exp.search:
        headers = ["", "configuration", UNITS[exp.search["target"]], *([RANK_HEADERS[by]] if by != "rate" else []),
                   "seeds", *(["model range"] if ranged else [])]
    else:
        headers = ["", "configuration", exp.objective["metric"], "seeds", "SLOs met"]
    headers += ["binding limit", "key that moves it"]
    rows = []
    for _, row in points.iterrows():
        index = int(row["point"])
        cells = ["*" if index == rec.point else "=" if index in rec.tie else "", short_label(exp, row)]
        if exp.search:
            value = row["answer"]
            text = _number(value)
            if exp.search["target"] in REPLICA_TARGETS and math.isfinite(value):
                text += f" = {row['gpus']:g} GPUs"
            cells.append(text if math.isfinite(value) else "none")
            if by != "rate":
                cells.append(_number(row[COLUMNS[by]]))
            cells.append(span(exp, row) if math.isfinite(value) else "-")
            if ranged:
                low, high = row["capacity_model_lo"], row["capacity_model_hi"]
                cells.append("-" if not (math.isfinite(low) or math.isfinite(high)) else
                             f"{_number(low)}-{_number(high)}")
        else:
            cells += [_number(row[exp.objective["metric"]]), span(exp, row), "yes" if row["slo_met"] else "no"]
        votes = f" ({row['binding_votes']}/{row['binding_of']})" if row["binding_of"] > 1 else ""
        limit = row["binding_limit"]
        cells += ["-" if limit == "none" else f"{limit}{votes}", row["binding_key"] or
                  ("-" if limit == "none" else "fixed")]
        rows.append(cells)
    return headers, rows


def verdict_line(exp: Experiment, points: pd.DataFrame, rec: Recommendation) -> str:
    """The recommendation and the next best it is clear of, the tie, or why there is none, in one sentence."""
    by_point = {int(row["point"]): row for _, row in points.iterrows()}
    if rec.tie:
        shown = ", ".join(f"{short_label(exp, by_point[i])} ({rank_span(exp, by_point[i])})" for i in rec.tie)
        return f"Tie: {shown}: their seed intervals overlap, so nothing is recommended (more seeds may separate them)."
    if rec.point is None:
        return f"No recommendation: {rec.why}."
    best = by_point[rec.point]
    text = f"Recommended (*): {short_label(exp, best)}"
    if exp.search:
        unit = "decode replicas" if fixed_gpus(best) else UNITS[exp.search["target"]]  # (a P/D replica search)
        text += f", {_number(best['answer'])} {unit}"
        if rank_by(exp) != "rate":
            text += f" = {_number(best[COLUMNS[rank_by(exp)]])} {RANK_UNITS[rank_by(exp)]}"
    else:
        text += f", {exp.objective['metric']} {_number(best[exp.objective['metric']])}"
    text += f" (seeds {rank_span(exp, best)}"
    if exp.search and any(math.isfinite(best.get(k, math.nan)) for k in model_range.RANGE_COLUMNS):
        text += f"; model range {_number(best['capacity_model_lo'])}-{_number(best['capacity_model_hi'])}"
    text += ")"
    if rec.runner_up is not None:
        other = by_point[rec.runner_up]
        text += f", clear of the next best, {short_label(exp, other)} ({rank_span(exp, other)})"
    return text + (f"; {UNTESTED}" if len(exp.seeds) < 2 else "") + "."


def _money(value: object) -> str:
    return f"${value:.3g}" if isinstance(value, float | int) and math.isfinite(value) else "n/a"


def point_cost(row: pd.Series) -> str:
    """One point's cost, short: '$33.4/h; per Mtok $0.05 in, $1.21 out; 950 req/$ in SLO', or why none."""
    if not math.isfinite(row.get("cost_per_hour", math.nan)):
        return f"no cost: {row.get('cost_note') or 'not priced'}"
    per = "in SLO" if row["goodput_basis"] == "slo" else "completed"
    return (f"{_money(row['cost_per_hour'])}/h; per Mtok {_money(row['usd_per_m_input_tokens'])} in, "
            f"{_money(row['usd_per_m_output_tokens'])} out; {row['goodput_per_usd']:.3g} req/$ {per}")


def cost_text(exp: Experiment, points: pd.DataFrame, rec: Recommendation) -> str:
    """The cost line under the answer: the recommended point's (or each tied point's), else every point's range
    of $/h; with the price kind. The per-point columns are in summary.md and points.parquet."""
    kind = exp.prices.kind.replace("_", "-")
    by_point = {int(row["point"]): row for _, row in points.iterrows()}
    shown = [rec.point] if rec.point is not None else list(rec.tie)
    if shown:
        return "Cost: " + "; ".join(f"{short_label(exp, by_point[i])}: {point_cost(by_point[i])}"
                                    for i in shown) + f" ({kind})."
    hours = [v for v in points.get("cost_per_hour", pd.Series(dtype=float)) if math.isfinite(v)]
    if not hours:
        return f"Cost: none: {points['cost_note'].iloc[0] if 'cost_note' in points else 'not priced'}."
    return f"Cost: {_money(min(hours))}-{_money(max(hours))}/h over the configurations ({kind})."


def slo_text(exp: Experiment) -> str:
    """The SLO lines with their keys: "p99 TTFT <= 1000 ms (slo.p99_ttft_ms)"."""
    lines = [f"{slo_name(k)} <= {v:g} ms (slo.{SUMMARY_TO_SLO[k]})" for k, v in exp.slo.items()]
    if exp.attainment:
        bounds = ", ".join(f"{k} <= {v:g}" for k, v in exp.attainment.items() if k != "fraction" and v is not None)
        lines.append(f"at least {exp.attainment['fraction']:.0%} of requests with {bounds} (slo.attainment)")
    return "; ".join(lines) or "none given"


def gates_text(exp: Experiment) -> str:
    """Every gate besides the SLOs, short, in `gate_lines`' order: each with its value and key (the completion
    check, which has no bound, alone)."""
    return "; ".join(f"{g.short} ({g.key})" if g.key else g.short for g in gate_lines(exp))


def render(exp: Experiment, points: pd.DataFrame, rec: Recommendation, *, width: int = WIDTH,
           terminal: bool = False) -> str:
    """The terminal answer as text `width` columns wide: with colours and box lines on a terminal, plain ASCII
    otherwise."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    plain = box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)  # a dashed rule under the head
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=terminal, no_color=not terminal,
                      color_system="standard" if terminal else None, highlight=False, emoji=False)
    headers, rows = answer_table(exp, points, rec)
    # columns two apart (the box's divider and one space): the most room for the labels
    table = Table(box=box.SIMPLE_HEAD if terminal else plain, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0),
                  header_style="bold" if terminal else "")
    for i, header in enumerate(headers):
        # identifiers (keys, numbers, ranges) never break; the label and the limit's name wrap at spaces
        table.add_column(header, overflow="fold", no_wrap=i not in (1, len(headers) - 2),
                         justify="right" if i == 2 else "left")
    for index, cells in zip(points["point"], rows, strict=True):
        style = "bold green" if terminal and int(index) == rec.point else ""
        table.add_row(*cells, style=style)
    search = exp.search
    what = f"{search['target']} ({UNITS[search['target']]})" if search else \
        f"{exp.objective['goal']} {exp.objective['metric']}"
    if rank_by(exp) != "rate":
        what += f" ranked in {RANK_UNITS[rank_by(exp)]} (search.rank_by: {rank_by(exp)})"
    console.print(f"{exp.name}: {what}, {len(points)} configuration(s), seeds {exp.seeds}, {vllm_text(exp, points)}")
    console.print(table)
    if "frontier_cost" in points:  # a min_cost search: its winner line says the verdict and the cost once
        from kvplan.experiments.min_cost_text import terminal_lines

        for line in terminal_lines(exp, points, rec):
            console.print(line)
    else:
        console.print(verdict_line(exp, points, rec), style="bold" if terminal else "")
        console.print(cost_text(exp, points, rec))
    if (per_gpu := comparison_line(exp, points)) is not None:  # P/D vs co-located per GPU and per $
        console.print(per_gpu)
    notes = sorted({str(n) for n in points.get("model_range_note", pd.Series(dtype=str)) if isinstance(n, str) and n})
    if notes:  # why a point has no model range ('-' in the table)
        console.print(f"(-) {'; '.join(notes)}.")
    for label, text in zip(points["label"], points.get("skipped", pd.Series([""] * len(points))), strict=True):
        if isinstance(text, str) and text:  # probes the analytic bound decided: never simulated, said so
            console.print(f"skipped: {label}: {text}.")
    console.print(f"SLOs: {slo_text(exp)}.")
    console.print(f"Gates: {gates_text(exp)}.")
    return "".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines())


def print_answer(exp: Experiment, points: pd.DataFrame, rec: Recommendation, out: TextIO | None = None) -> None:
    """Print the answer on `out` (stdout): a rich table on a terminal (at most `WIDTH` columns, fewer on a
    narrower one), plain text when piped."""
    import shutil

    out = out or sys.stdout
    terminal = out.isatty()
    width = min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns) if terminal else WIDTH
    out.write(render(exp, points, rec, width=width, terminal=terminal))


def read_result_set(out: Path) -> tuple[pd.DataFrame, Recommendation]:
    """A written result set's points (points.parquet) and recommendation (result.json)."""
    from kvplan.strict_json import loads

    points = pd.read_parquet(out / "points.parquet")
    doc = loads((out / "result.json").read_bytes())["recommendation"]
    tie = doc.get("tie") or []
    return points, Recommendation(doc["point"], doc["label"], doc["why"], [t["point"] for t in tie],
                                  [t["label"] for t in tie], doc.get("runner_up"))


def print_result_set(exp: Experiment, out: Path) -> None:
    """Print the answer of the result set in `out`."""
    print_answer(exp, *read_result_set(out))


def markdown_answer(exp: Experiment, points: pd.DataFrame, rec: Recommendation) -> list[str]:
    """summary.md's `## Answer`: the terminal's table as markdown, the verdict, the SLOs and each gate in full."""
    headers, rows = answer_table(exp, points, rec)
    lines = ["## Answer", "", "| " + " | ".join(headers) + " |", "|---" * len(headers) + "|"]
    lines += ["| " + " | ".join(c.replace("*", "\\*").replace("|", "\\|") for c in row) + " |" for row in rows]
    per_gpu = comparison_line(exp, points)
    lines += ["", verdict_line(exp, points, rec).replace("(*)", "(\\*)"), "", cost_text(exp, points, rec), "",
              *([per_gpu, ""] if per_gpu else []),
              f"SLOs: {slo_text(exp)}.", "",
              "Gates (besides the SLOs) that can decide an answer:", ""]
    lines += [f"- **{g.short}**{' (`' + g.key + '`)' if g.key else ''}: {g.rule}" for g in gate_lines(exp)]
    lines += ["", "Binding limit per configuration (what stopped its answer, and the votes of its searches):", ""]
    lines += [f"- **{row['label']}**: {row['binding_limit']} ({row['binding_key'] or 'fixed'}), "
              f"{row['binding_votes']} of {row['binding_of']}: {row['binding_detail']}" for _, row in points.iterrows()]
    return lines


def cost_markdown(exp: Experiment, points: pd.DataFrame) -> list[str]:
    """summary.md's `## Cost`: each point's cost, the prices used (kind, $/GPU-hour, source and date per GPU) and
    the rules (docs/cost.md)."""
    lines = ["## Cost", "", f"At {exp.prices.kind.replace('_', '-')} prices (`prices:`, `--prices`, "
             "`--price-kind`; docs/cost.md). A deployment pays for replicas x TP x PP GPUs every hour; the hour's "
             "cost is split between input and output tokens by the prefill share of the GPUs' busy time.", ""]
    lines += [f"- **{row['label']}**: {point_cost(row)}" for _, row in points.iterrows()]
    hardware = sorted({str(h) for h in points.get("hardware", pd.Series([exp.base["hardware"]]))})
    lines += ["", "Prices:", ""]
    for name in hardware:
        entry = exp.prices.entries.get(name)
        lines.append(f"- {name}: " + ("not priced" if entry is None else
                                      f"${exp.prices.gpu_hour(name):.4g}/GPU-hour ({exp.prices.kind}), "
                                      f"{entry.date or 'undated'}: {entry.source}"))
    return lines


def vllm_text(exp: Experiment, points: pd.DataFrame) -> str:
    """'as vLLM 0.34': the release the simulated scheduler and its defaults follow (`vllm_version`; every
    release a sweep names)."""
    key = "engine.vllm_version"
    versions = sorted(set(points[key])) if key in points else [exp.base["engine"].get("vllm_version") or NEWEST]
    return f"as vLLM {' and '.join(str(v) for v in versions)}"


def summary_markdown(exp: Experiment, points: pd.DataFrame, rec: Recommendation, runs: int,
                     errors: dict[int, ModelError]) -> str:
    headers, rows = point_table(exp, points)
    lines = [f"# {exp.name}", ""]
    if exp.description:
        lines += [exp.description.strip(), ""]
    lines += [f"{len(points)} point(s), {runs} run(s), seeds {exp.seeds}, {vllm_text(exp, points)}.", ""]
    lines += [*markdown_answer(exp, points, rec), ""]
    if "frontier_cost" in points:
        from kvplan.experiments.min_cost_text import markdown

        lines += [*markdown(exp, points, rec), ""]
    if exp.search:
        integer = exp.search["target"] in INTEGER_TARGETS
        lines += [f"Search: {exp.search['target']} over [{exp.search['low']:g}, {exp.search['high']:g}]"
                  + ("" if integer else f", tolerance {exp.search['tolerance']:g}")
                  + (", each seed on its own, the median reported" if exp.search["combine"] == "median" else
                     ", every seed must meet") + ".", ""]
    lines += [load_line(exp), ""]
    if rec.tie:
        verdict = f"**tie** — {rec.why}."
    else:
        verdict = f"**{rec.label}** — {rec.why}." if rec.point is not None else f"**none** — {rec.why}."
    lines += ["## Recommendation", "", verdict, "", "## Points", ""]
    lines += ["| " + " | ".join(headers) + " |", "|---" * len(headers) + "|"]
    lines += ["| " + " | ".join(str(cell(c)) for c in row) + " |" for row in rows]
    if exp.search:
        lines += ["", "## Capacity", ""]
        lines += [f"- **{row['label']}**: " + (capacity_sentence(exp, row) if math.isfinite(row["answer"])
                                                else row["search_outcome"])
                  + (f" Skipped: {row['skipped']}." if isinstance(row.get("skipped"), str) and row["skipped"] else "")
                  for _, row in points.iterrows()]
    lines += ["", *cost_markdown(exp, points)]
    lines += ["", *model_range.markdown(exp, errors)]
    return "\n".join(lines).rstrip("\n") + "\n"
