"""An experiment's tables: the run table and the point table (the recommendation: `ranking`; the words: `answer`).

runs.parquet has one row per run: point, label, seed, the search's probed value, every configuration knob
(dotted names), every summary metric, the attainment share, the probe's counts (warm-up, measured, cool-down,
unfinished requests) and stability verdict, and the SLO verdict: `slo_broken` in words, `failures` as data (a
list of {limit, key, kind, value, bound, excess, text}: `criteria.failures`). Wall-clock time stays in each run's
summary.json, so that the table depends only on the configurations (a resumed sweep ends with exactly the
table an uninterrupted one writes). points.parquet has one row per point: its metrics at the answer (averaged
over seeds), the SLO verdict, and for a search the capacity: the median of the seeds' answers with their range,
in the search's unit and in requests and tokens per second; and the objective metric's range over the seeds'
values (objective_low, objective_high; for a search, each seed's value at its own answer). Every point has its
binding limit (`binding.COLUMNS`: binding_limit, binding_key - the experiment file's key that moves it -,
binding_detail, and the votes of its searches or runs that named it, binding_votes of binding_of).

Both tables carry the model error (`model_range`): the source that priced the point's GPU and its step-time band
(model_error_source, model_error_band_lo_pct, model_error_band_hi_pct), and for a search the answer's range over
that band (capacity_model_lo, capacity_model_hi). Both carry the cost (`sim.dollars`, at the experiment's
`prices:`): $/h of the run's GPUs, $ per million input and output tokens at its sustained rate, goodput per
dollar, and the price's kind, source and date - computed from the stored runs, so that other prices re-price a
result set (`--resume`) without simulating again; a point averages its runs' numbers. runs.parquet also
holds the edge searches' runs: their `step_scale` is the band edge's factor on every step's compute time (1 for
every run of the answer itself).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from kvplan.experiments import binding, model_range, pd_block
from kvplan.experiments.criteria import failures
from kvplan.experiments.rank_by import COLUMNS, RATE_TARGETS, rank_by, ranked_columns
from kvplan.experiments.ranking import Recommendation as Recommendation
from kvplan.experiments.ranking import capacity_sentence as capacity_sentence
from kvplan.experiments.ranking import recommend as recommend
from kvplan.experiments.runner import Outcome
from kvplan.experiments.schema import REPLICA_TARGETS, Experiment
from kvplan.experiments.search import PointTask
from kvplan.results.summary import SUMMARY_KEYS
from kvplan.sim.dollars import COST_KEYS, cost_fields, pools_cost_fields
from kvplan.sim.pd_spec import OPTIONS

# the cost columns (`sim.dollars.COST_KEYS`): numbers averaged over a point's runs, words taken from its first
COST_NUMBERS = ("cost_per_hour", "usd_per_m_input_tokens", "usd_per_m_output_tokens", "goodput_per_usd",
                "prefill_share", "billed_gpus", "price_per_gpu_hour")
COST_WORDS = ("goodput_basis", "price_kind", "price_source", "price_date", "cost_note")
COST_SHOWN = ("cost_per_hour", "usd_per_m_input_tokens", "usd_per_m_output_tokens", "goodput_per_usd")
assert set(COST_NUMBERS) | set(COST_WORDS) == set(COST_KEYS)

HEADLINE = ("request_throughput", "request_goodput", "p99_ttft_ms", "p90_tpot_ms", "p90_e2el_ms", "kv_usage_mean",
            "kv_token_utilization", "prefix_cache_hit_rate", "num_preemptions")
# A probe's counts and signals in runs.parquet (summary.json's "probe"; missing for a burst run).
PROBE_COLUMNS = ("verdict", "warmup_requests", "measured_requests", "cooldown_requests", "unfinished_requests",
                 "completed_measured", "queue_first", "queue_second", "ttft_first_ms", "ttft_second_ms",
                 "p99_queue_delay_ms",
                 "stopped_early", "duration_s")
COUNTS = ("warmup_requests", "measured_requests", "cooldown_requests", "unfinished_requests")


def flatten(config: dict) -> dict[str, object]:
    out = {"model": config["model"], "hardware": config["hardware"]}
    for section in ("engine", "cluster"):
        out.update({f"{section}.{k}": v for k, v in config[section].items()})
    block = config.get(pd_block.KEY)  # a P/D point's pools (None in each column: co-located)
    out.update({f"{pd_block.KEY}.{k}": (block or {}).get(k) for k in OPTIONS})
    out[pd_block.KEY] = pd_block.shape(block)  # (a swept whole block groups the runs by this)
    out["gpus"] = pd_block.gpus(config)
    for key in ("mode", "rate", "concurrency", "rate_scale", "lora_adapters", "lora_skew"):
        out[f"workload.{key}"] = config["workload"][key]
    return out


def probe_row(doc: dict) -> dict[str, object]:
    probe = doc.get("probe") or {}
    row = {key: probe.get(key) for key in PROBE_COLUMNS}
    row["verdict"] = row["verdict"] or "burst"  # a burst replay has no steady state to judge
    row["stopped_early"] = row["stopped_early"] or ""
    return row


def run_cost(exp: Experiment, doc: dict, config: dict) -> dict[str, object]:
    """A run's cost columns (`sim.dollars`) at the experiment's prices: its GPUs are replicas x TP x PP of its
    hardware. Computed here, from the stored run, so that new prices re-price a result set without a rerun."""
    pools = (doc["info"].get(pd_block.KEY) or {}).get("pools")
    if pools is not None:  # a P/D run: each pool's GPUs at its hardware's price, its hour split by its own work
        return pools_cost_fields(exp.prices, [(p["hardware"], p["gpus"], p["busy_s"], p["prefill_busy_s"])
                                              for p in pools], doc["summary"])
    return cost_fields(exp.prices, config["hardware"], pd_block.gpus(config), doc["summary"], doc["info"])


def runs_frame(exp: Experiment, outcome: Outcome) -> pd.DataFrame:
    rows, seen = [], set()
    for key, run in outcome.runs.items():
        doc, config = run["doc"], run["config"]
        for index in run["points"]:
            point = outcome.tasks[index].point
            if (point.index, key) in seen:  # two searches of one point asked for the same run
                continue
            seen.add((point.index, key))
            flat = flatten(config)
            probe_key = pd_block.varied_key(exp, point.config)  # (a P/D replica search: its decode pool's)
            rows.append({"point": point.index, "label": point.label, "seed": config["seed"],
                         "probe": float(flat[probe_key]) if probe_key else math.nan, "run": key, **flat,
                         "step_scale": float(config.get("step_scale", 1.0)),
                         **model_range.error_columns(outcome.model_errors.get(point.index)),
                         **{k: doc["summary"][k] for k in SUMMARY_KEYS},
                         "offered_rate_rps": doc["offered_rate_rps"], "num_blocks": doc["info"]["num_blocks"],
                         "rejected": doc["info"]["rejected"], "attainment": doc["attainment"], **probe_row(doc),
                         "slo_met": run["met"], "slo_broken": "; ".join(run["broken"]),
                         "failures": [f.as_dict() for f in failures(exp, doc, config)],
                         **run_cost(exp, doc, config)})
    frame = pd.DataFrame(rows)
    numeric = [c for c in PROBE_COLUMNS if c not in ("verdict", "stopped_early")]
    for column in ("request_goodput", "workload.rate", "workload.concurrency", *numeric, *COST_NUMBERS):
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype(float)  # None -> NaN
    return frame.sort_values(["point", "probe", "seed"], kind="stable").reset_index(drop=True)


def answer_runs(task: PointTask, runs: pd.DataFrame) -> pd.DataFrame:
    """The runs that describe a task: all its runs, or for a search those at its answer (else its last probe)."""
    if not task.exp.search:
        return task.runs_in(runs)
    return task.runs_in(runs, task.answer if task.answer is not None else task.probes[-1][0])


def median_answer(answers: list[float | None], missing_low: bool) -> float | None:
    """The median of the seeds' answers, where a missing answer (outside the searched range) sorts below every
    found one (`missing_low`: a rate that fails at `low`) or above (replicas that fail at `high`); None when the
    median itself is missing."""
    edge = -math.inf if missing_low else math.inf
    values = sorted(edge if a is None else a for a in answers)
    n = len(values)
    middle = values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
    return None if math.isinf(middle) else middle


def points_frame(exp: Experiment, outcome: Outcome, runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for point in dict.fromkeys(t.point.index for t in outcome.tasks if t.probes or not exp.search):  # searched
        every = [t for t in outcome.tasks if t.point.index == point]
        tasks = [t for t in every if not t.edge]  # the edge searches only give the model range
        at = pd.concat([answer_runs(t, runs) for t in tasks])
        first = tasks[0].point
        row = {"point": point, "label": first.label,
               **{k: pd_block.label_value(k, v) for k, v in first.values.items()},
               **model_range.error_columns(outcome.model_errors.get(point)),
               "seeds": int(at["seed"].nunique()), "slo_met": bool(at["slo_met"].all()),
               **{k: float(pd.to_numeric(at[k], errors="coerce").mean()) for k in (*SUMMARY_KEYS, "offered_rate_rps")},
               "attainment": float(at["attainment"].mean()) if at["attainment"].notna().any() else math.nan,
               **{k: float(at[k].mean()) for k in COUNTS}, "verdict": "/".join(sorted(set(at["verdict"]))),
               **{k: float(at[k].mean()) for k in COST_NUMBERS}, **{k: at[k].iloc[0] for k in COST_WORDS},
               "gpus": float(at["gpus"].mean())}
        # what each GPU of the deployment serves within the SLOs (DistServe's per-GPU goodput; completions
        # per second where no SLO defines goodput): how a P:D shape and a co-located one of other sizes compare
        served = row["request_goodput"] if math.isfinite(row["request_goodput"]) else row["request_throughput"]
        row["goodput_per_gpu"] = served / row["gpus"]
        # the objective's spread over the seeds (for a search: at each seed's own answer)
        per_seed = at.groupby("seed")[exp.objective["metric"]].mean()
        row["objective_low"], row["objective_high"] = float(per_seed.min()), float(per_seed.max())
        if exp.search:
            answers = [t.answer for t in tasks]
            median = median_answer(answers, exp.search["target"] not in REPLICA_TARGETS)
            found = [a for a in answers if a is not None]
            whole = len(found) == len(answers)  # else an end is open: below the range, or replicas above it
            upward = exp.search["target"] not in REPLICA_TARGETS
            row["answer"] = math.nan if median is None else float(median)
            row["answer_low"] = float(min(found)) if found and (whole or not upward) else math.nan
            row["answer_high"] = float(max(found)) if found and (whole or upward) else math.nan
            row["capacity_model_lo"], row["capacity_model_hi"] = model_range.capacity_range(exp, every, median)
            row["model_range_note"] = model_range.missing_range(exp, every, outcome.model_errors.get(point))
            row["answers"] = ", ".join("n/a" if a is None else f"{a:.4g}" for a in answers)
            outcomes = sorted({t.outcome for t in tasks if t.outcome})
            row["search_outcome"] = "; ".join(outcomes) if outcomes else "found"
            row["skipped"] = skipped_text(exp, tasks)
            row["probes"] = sum(v not in t.decided for t in tasks for v, _ in t.probes)  # simulated ones
            row["capacity_rps"] = row["request_throughput"]  # sustained: completions per second of window
            row["capacity_tok_s"] = row["total_token_throughput"]
            if exp.search["target"] in REPLICA_TARGETS:  # what the answer costs: every replica's GPUs (and a P/D
                # point's prefill pool, which its search does not vary)
                row["fixed_gpus"], row["gpus_per_replica"] = pd_block.replica_unit(exp, first.config)
                row["gpus"] = row["fixed_gpus"] + row["answer"] * row["gpus_per_replica"]
                row |= answer_cost(row, pd_block.answer_hour(exp, first.config, row["answer"]))
            if exp.search["target"] in RATE_TARGETS:  # what `search.rank_by` may rank by
                row |= ranked_columns(row)
            row |= binding.search_binding(tasks, runs).columns()
        else:
            row |= binding.sweep_binding(exp, at).columns()
        rows.append(row)
    return pd.DataFrame(rows)


def answer_cost(row: dict, cost: float) -> dict[str, float]:
    """A replica search's cost at its answer (the median of the seeds' replica counts), not the mean over the
    seeds' own answers, whose deployments may differ (1, 2, 2 replicas average to a deployment nobody runs): $/h is
    `cost`, the answer's GPUs at their prices (`pd_block.answer_hour`), and the per-token prices and requests per $
    are the seeds' runs' averages re-priced from their mean $/h to the answer's (the tokens and the prefill share
    stay the runs')."""
    paid = row["cost_per_hour"]
    if not (math.isfinite(row["answer"]) and math.isfinite(paid) and paid > 0 and math.isfinite(cost)):
        return {}
    factor = cost / paid
    return {"cost_per_hour": cost, "billed_gpus": row["gpus"],
            "usd_per_m_input_tokens": row["usd_per_m_input_tokens"] * factor,
            "usd_per_m_output_tokens": row["usd_per_m_output_tokens"] * factor,
            "goodput_per_usd": row["goodput_per_usd"] / factor}


def points_table(exp: Experiment, outcome: Outcome, runs: pd.DataFrame) -> pd.DataFrame:
    """The points table: `points_frame`, and for a min_cost search every shape with its cost and status
    (`min_cost.cost_points`)."""
    points = points_frame(exp, outcome, runs)
    if outcome.plan is None:
        return points
    from kvplan.experiments.min_cost import cost_points

    return cost_points(exp, outcome.plan, points)


def skipped_text(exp: Experiment, tasks: list[PointTask]) -> str:
    """The probes a point's searches skipped because its analytic bound decided them (`experiments.bound`), in
    words ("" when none): which values, and the bound that decided them."""
    values = sorted({v for t in tasks for v in t.decided})
    if not values:
        return ""
    from kvplan.experiments.search import describe

    bound = tasks[0].bound
    assert bound is not None  # only a bounded task decides
    shown = [describe(exp.search["target"], v) for v in values]
    listed = ", ".join(shown) if len(shown) <= 3 else f"{shown[0]} ... {shown[-1]} ({len(shown)} values)"
    return f"{listed}: fails by the analytic bound, {bound.as_text()}"


def slo_lines(exp: Experiment) -> list[str]:
    lines = [f"{k} <= {v:g}" for k, v in exp.slo.items()]
    if exp.attainment:
        bounds = ", ".join(f"{k} <= {v:g}" for k, v in exp.attainment.items() if k != "fraction" and v is not None)
        lines.append(f"at least {exp.attainment['fraction']:.0%} of requests with {bounds}")
    return lines


def point_table(exp: Experiment, points: pd.DataFrame) -> tuple[list[str], list[list[object]]]:
    search = ["answer", "answer_low", "answer_high", *model_range.RANGE_COLUMNS, "capacity_rps", "capacity_tok_s",
              "search_outcome", "objective_low", "objective_high"]
    if exp.search and exp.search["target"] in REPLICA_TARGETS:
        search[1:1] = ["fixed_gpus", "gpus_per_replica", "gpus"]
    elif exp.search and exp.search["target"] in RATE_TARGETS and (pd_block.used(exp) or rank_by(exp) != "rate"):
        search[1:1] = ["gpus", *(COLUMNS[by] for by in ("per_gpu", "per_usd"))]  # what the points are ranked by
    # P/D and co-located shapes of different sizes: compared per GPU
    per_gpu = ["gpus", "goodput_per_gpu"] if pd_block.used(exp) and "gpus" not in search else []
    headers = ["point", "label", *per_gpu, *(search if exp.search else ["objective_low", "objective_high"]),
               "binding_limit", "binding_key", "slo_met", "verdict",
               *(["attainment"] if exp.attainment else []), *HEADLINE, *COST_SHOWN, *COUNTS]
    rows = [[cell(row[h]) for h in headers] for _, row in points.iterrows()]
    return headers, rows


def cell(value: object) -> object:
    if isinstance(value, float | np.floating):
        return "n/a" if not math.isfinite(value) else float(f"{value:.4g}")
    if isinstance(value, np.bool_ | bool):
        return "yes" if value else "no"
    return value.item() if isinstance(value, np.generic) else value


def load_line(exp: Experiment) -> str:
    """How the load was offered and measured, in one sentence."""
    w, p = exp.base["workload"], exp.base["probe"]
    if w["mode"] == "burst":
        return "Load: burst absorption - the trace as recorded, time-scaled by rate_scale, served to its end."
    what = (f"open-loop arrivals ({w['arrivals']}) drawn from the trace's sessions" if w["mode"] == "sustained"
            else f"closed loop, think time {w['think_s']:g} s")
    warm = "10%" if p["warmup_s"] is None else f"{p['warmup_s']:g} s"
    cool = "10%" if p["cooldown_s"] is None else f"{p['cooldown_s']:g} s"
    return (f"Load: {w['mode']} - {what}; each probe at least {p['duration_s']:g} s and {p['min_requests']} "
            f"measured requests, warm-up {warm} and cool-down {cool} trimmed; a probe must be stable "
            f"(not backlogged or overloaded) before its SLOs count.")
