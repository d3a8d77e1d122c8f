"""End-to-end validation on four public vLLM 0.19 serving runs: replay each run's requests through kvplan's
simulator with the run's engine settings, on the datasheet hardware entry and the built-in model spec (nothing
fitted on these runs), and compare TTFT, TPOT and E2E with what vLLM measured and what LLMServingSim 2.0
simulated. Writes docs/serving_validation.md.

    PYTHONPATH=. python scripts/serving_validation.py            # writes docs/serving_validation.md
    PYTHONPATH=. python scripts/serving_validation.py --print    # prints the page instead

Data: ../shared/data/llmservingsim-rtx (LLMServingSim's bench/examples, MIT; its SOURCE.txt): per run
vllm/requests.jsonl (per-request stamps: the `vllm-bench` trace format), vllm/meta.json (engine kwargs),
vllm/timeseries.csv (1 s ticks), validation/summary.txt (vLLM vs LLMServingSim). The runs are offline-engine
benches, so every latency is engine-internal: TTFT = first_token_ts - queued_ts, E2E = last_token_ts - queued_ts,
TPOT = (last - first) / (output - 1). The simulation is deterministic (no random draw; seed 0 where one is asked).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "llmservingsim-rtx"
DOC = ROOT / "docs" / "serving_validation.md"
COMMAND = "PYTHONPATH=. python scripts/serving_validation.py"

METRICS = ("ttft", "tpot", "e2e")
STATS = ("mean", "p50", "p90", "p99")
LABELS = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"}
# summary.txt's row names -> ours
SUMMARY_ROWS = {"TTFT": "ttft", "TPOT": "tpot", "Latency": "e2e"}
SUMMARY_STATS = {"Mean": "mean", "Median": "p50", "P90": "p90", "P99": "p99"}
# The runs' model names -> kvplan's built-in specs; the data's hardware folders -> kvplan's datasheet entries.
MODELS = {"meta-llama/Llama-3.1-8B": "llama-3.1-8b", "Qwen/Qwen3-32B": "qwen3-32b",
          "Qwen/Qwen3-30B-A3B-Instruct-2507": "qwen3-30b-a3b"}
HARDWARE = {"RTX4090": "rtx-4090", "RTXPRO6000": "rtx-pro-6000"}
RUNS = ("RTX4090/Llama-3.1-8B", "RTXPRO6000/Llama-3.1-8B", "RTXPRO6000/Qwen3-32B",
        "RTXPRO6000/Qwen3-30B-A3B-Instruct-2507")
# vLLM 0.19 defaults the runs did not override (meta.json's resolved_config states them for the RTX 4090 run:
# block 16, prefix caching and chunked prefill on, gpu_memory_utilization 0.9, FCFS).
# entry_point llm: the runs drive vLLM's offline LLM engine (`python -m bench run`), timed by the engine core's own
# timestamps, so no API server is in front of the latencies compared.
VLLM_DEFAULTS = {"block_size": 16, "gpu_memory_utilization": 0.9, "enable_prefix_caching": True,
                 "enable_chunked_prefill": True, "entry_point": "llm"}


# -- statistics and the comparison table (tested on a fixture: tests/traces/test_vllm_bench.py) -----------------------
def latency_stats(values_ms: np.ndarray) -> dict[str, float]:
    """mean, p50, p90, p99 of the defined values (NaN: a one-token output's TPOT), numpy's linear percentile
    as vLLM's benchmark and LLMServingSim's validate compute them."""
    v = np.asarray(values_ms, dtype=np.float64)
    v = v[~np.isnan(v)]
    if not len(v):
        return dict.fromkeys(STATS, math.nan)
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return {"mean": float(v.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def per_request_stats(ttft_ms: np.ndarray, tpot_ms: np.ndarray, e2e_ms: np.ndarray) -> dict[str, dict[str, float]]:
    return {"ttft": latency_stats(ttft_ms), "tpot": latency_stats(tpot_ms), "e2e": latency_stats(e2e_ms)}


def signed_error_pct(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured * 100.0 if measured else math.nan


def comparison_rows(measured: dict, kvplan: dict, llmservingsim: dict | None) -> list[dict]:
    """One row per (metric, statistic): vLLM measured, LLMServingSim, kvplan (ms) and both simulators' errors (%)."""
    rows = []
    for metric in METRICS:
        for stat in STATS:
            m, k = measured[metric][stat], kvplan[metric][stat]
            s = llmservingsim[metric][stat] if llmservingsim else math.nan
            rows.append({"metric": metric, "stat": stat, "vllm_ms": m, "llmservingsim_ms": s, "kvplan_ms": k,
                         "llmservingsim_err_pct": signed_error_pct(s, m), "kvplan_err_pct": signed_error_pct(k, m)})
    return rows


def median_abs_mean_error(tables: dict[str, list[dict]], column: str = "kvplan_err_pct") -> float:
    """The median |error| of the means over every (run, metric)."""
    errors = [abs(r[column]) for rows in tables.values() for r in rows if r["stat"] == "mean"]
    return float(np.median(errors)) if errors else math.nan


def read_summary(path: Path) -> tuple[dict, dict]:
    """summary.txt's vLLM and Sim columns as {metric: {stat: ms}}; P95 rows are not compared."""
    vllm: dict[str, dict[str, float]] = {m: {} for m in METRICS}
    sim: dict[str, dict[str, float]] = {m: {} for m in METRICS}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        parts = line.split()
        if len(parts) == 5 and parts[0] in SUMMARY_ROWS and parts[1] in (*SUMMARY_STATS, "P95"):
            if parts[1] == "P95":
                continue
            try:
                v, s = float(parts[2]), float(parts[3])
            except ValueError:
                raise SystemExit(f"{path}:{number}: {line.strip()!r}: not a number; allowed: 'Metric Stat vLLM Sim "
                                 "Diff%'") from None
            metric, stat = SUMMARY_ROWS[parts[0]], SUMMARY_STATS[parts[1]]
            vllm[metric][stat], sim[metric][stat] = v, s
    missing = [f"{m} {s}" for m in METRICS for s in STATS if s not in vllm[m]]
    if missing:
        raise SystemExit(f"{path}: missing rows {', '.join(missing)}")
    return vllm, sim


def format_ms(value: float) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.1f}"


def format_pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:+.1f}%"


def markdown_table(rows: list[dict]) -> str:
    lines = ["| metric | vLLM measured (ms) | LLMServingSim (ms) | error | kvplan (ms) | kvplan error |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        name = f"{LABELS[r['metric']]} {r['stat']}"
        name = f"**{name}**" if r["stat"] == "mean" else name
        lines.append(f"| {name} | {format_ms(r['vllm_ms'])} | {format_ms(r['llmservingsim_ms'])} | "
                     f"{format_pct(r['llmservingsim_err_pct'])} | {format_ms(r['kvplan_ms'])} | "
                     f"{format_pct(r['kvplan_err_pct'])} |")
    return "\n".join(lines)


# -- one run -------------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Run:
    """One shared run: where it is, its engine settings and what kvplan replays it as."""

    name: str
    folder: Path
    meta: dict
    model: str
    hardware: str
    settings: dict
    replicas: int
    router: str
    representation: str
    measured_blocks: int | None = None
    # other ways kvplan could represent the run: (label, SimSpec overrides), simulated beside the headline
    alternatives: list[tuple[str, dict]] = field(default_factory=list)


def load_run(name: str, data: Path = DATA) -> Run:
    folder = data / name
    meta = json.loads((folder / "vllm" / "meta.json").read_text())
    kwargs = meta["engine_kwargs"]
    if kwargs.get("dtype") != "bfloat16" or kwargs.get("kv_cache_dtype") != "auto":
        raise SystemExit(f"{folder}/vllm/meta.json: dtype {kwargs.get('dtype')}, kv_cache_dtype "
                         f"{kwargs.get('kv_cache_dtype')}; allowed: bfloat16 and auto (the built-in specs are bf16)")
    kv = meta.get("kv_cache", {})
    settings = {**VLLM_DEFAULTS, "max_num_seqs": kwargs["max_num_seqs"],
                "max_num_batched_tokens": kwargs["max_num_batched_tokens"],
                "tensor_parallel_size": kwargs["tensor_parallel_size"]}
    for key in ("block_size", "gpu_memory_utilization", "enable_prefix_caching"):
        if key in kv:
            settings[key] = kv[key]
    if kwargs.get("max_model_len"):
        settings["max_model_len"] = kwargs["max_model_len"]
    dp, ep = kwargs["data_parallel_size"], bool(kwargs["enable_expert_parallel"])
    model = MODELS[meta["model"]]
    alternatives: list[tuple[str, dict]] = []
    if dp == 1:
        representation = f"1 replica, TP {settings['tensor_parallel_size']}"
    else:
        if settings["tensor_parallel_size"] != 1 or not ep:
            raise SystemExit(f"{folder}/vllm/meta.json: data_parallel_size {dp} with TP "
                             f"{settings['tensor_parallel_size']}, EP {ep}; allowed: DP x EP at TP 1 (the one "
                             "layout this page maps)")
        # vLLM DP x EP at TP 1: dp engines in lockstep, each with its scheduler, attention and KV cache for its own
        # requests; the experts split over the dp GPUs, each MoE layer an all-gather of the ranks' hidden states
        # and a reduce-scatter of the outputs (all2all_backend allgather_reducescatter). kvplan has no replica
        # group sharing an expert pool. One TP-dp replica with dp x the limits matches it per rank: each GPU
        # streams 1/dp of every layer's experts for the union of the tokens (the same bytes and FLOPs as 1/dp of
        # the experts whole), its requests' share of the KV reads, one step for all ranks (lockstep), and two
        # collectives of the step's hidden states per layer (all-reduces where vLLM has an all-gather and a
        # reduce-scatter); it splits the attention weights, which DP replicates (~3 GB of 61 GB here).
        representation = (f"DP {dp} x EP {dp} as 1 replica of TP {dp}, max_num_seqs and max_num_batched_tokens "
                          f"x {dp} (see the section on DP x EP)")
        alternatives = [
            (f"{dp} replicas of TP 1, least-outstanding router (each replica prices all experts for its own "
             "tokens; no collective, no lockstep)", {"replicas": dp, "router": "least_outstanding",
                                                      "tensor_parallel_size": 1,
                                                      "max_num_seqs": settings["max_num_seqs"],
                                                      "max_num_batched_tokens": settings["max_num_batched_tokens"]}),
            (f"1 replica of TP {dp} with --enable-expert-parallel, limits x {dp} (kvplan's EP law: an all-to-all "
             "of k copies of each token)", {"tensor_parallel_size": dp, "enable_expert_parallel": True,
                                              "max_num_seqs": dp * settings["max_num_seqs"],
                                              "max_num_batched_tokens": dp * settings["max_num_batched_tokens"]})]
        settings.update(tensor_parallel_size=dp, max_num_seqs=dp * settings["max_num_seqs"],
                        max_num_batched_tokens=dp * settings["max_num_batched_tokens"])
    measured_blocks = kv.get("num_gpu_blocks")
    if measured_blocks:
        alternatives.append((f"vLLM's reported KV capacity ({measured_blocks:,} blocks) instead of the derived one "
                             "(a what-if read from this run: not a prediction)", {"num_blocks": measured_blocks}))
    return Run(name, folder, meta, model, HARDWARE[name.split("/")[0]], settings, 1, "round_robin",
               representation, measured_blocks, alternatives)


def sim_spec(run: Run, **overrides):
    from kvplan.sim.spec import SimSpec

    fields = {"replicas": run.replicas, "router": run.router, **run.settings, **overrides}
    return SimSpec(model=run.model, hardware=run.hardware, cost="analytic", **fields)


def cli_command(run: Run) -> str:
    """The `kvplan simulate` command line of the same simulation."""
    s = run.settings
    flags = [f"--trace {run.folder.relative_to(run.folder.parents[1])}/vllm/requests.jsonl",
             f"--model {run.model}", f"--hardware {run.hardware}", f"--max-num-seqs {s['max_num_seqs']}",
             f"--max-num-batched-tokens {s['max_num_batched_tokens']}"]
    if s["tensor_parallel_size"] > 1:
        flags.append(f"--tensor-parallel-size {s['tensor_parallel_size']}")
    if "max_model_len" in s:
        flags.append(f"--max-model-len {s['max_model_len']}")
    if run.replicas > 1:
        flags.append(f"--replicas {run.replicas} --router {run.router}")
    return "kvplan simulate " + " ".join(flags)


@dataclass(slots=True)
class RunResult:
    run: Run
    measured: dict
    reported_vllm: dict
    llmservingsim: dict
    kvplan: dict
    rows: list[dict]
    info: dict
    summary: dict
    wall_s: float
    requests: pd.DataFrame
    what_ifs: list[tuple[str, dict[str, float]]]  # (alternative, signed error of each metric's mean, %)
    concurrency: dict[str, float]  # median running requests while busy; the run's length (s)


def evaluate(run: Run) -> RunResult:
    from kvplan.sim.run import simulate
    from kvplan.traces import load
    from kvplan.traces.loaders.vllm_bench import read_timings

    path = run.folder / "vllm" / "requests.jsonl"
    timings = read_timings(path)
    measured = per_request_stats(timings.ttft_s * 1e3, timings.tpot_s * 1e3, timings.e2e_s * 1e3)
    reported_vllm, llmservingsim = read_summary(run.folder / "validation" / "summary.txt")
    trace = load(path, format="vllm-bench")
    start = time.perf_counter()
    result = simulate(trace, sim_spec(run))
    wall = time.perf_counter() - start
    table = result.requests
    measured_series = pd.read_csv(run.folder / "vllm" / "timeseries.csv")
    measured_series = measured_series[measured_series["running"] > 0]
    concurrency = {"running_sim": median_running(result.series),
                   "running_vllm": float(measured_series["running"].median()),
                   "span_sim": float(table["finish_s"].max() - table["arrival_s"].min()),
                   "span_vllm": float(timings_span(timings))}
    kvplan = per_request_stats(table["ttft_ms"].to_numpy(), table["tpot_ms"].to_numpy(), table["e2el_ms"].to_numpy())
    rows = comparison_rows(measured, kvplan, llmservingsim)
    what_ifs = []
    for label, overrides in run.alternatives:
        variant = simulate(trace, sim_spec(run, **overrides))
        other, series = variant.requests, variant.series
        stats = per_request_stats(other["ttft_ms"].to_numpy(), other["tpot_ms"].to_numpy(),
                                  other["e2el_ms"].to_numpy())
        errors = {m: signed_error_pct(stats[m]["mean"], measured[m]["mean"]) for m in METRICS}
        errors.update(running=median_running(series),
                      span=float(other["finish_s"].max() - other["arrival_s"].min()))
        what_ifs.append((label, errors))
    return RunResult(run, measured, reported_vllm, llmservingsim, kvplan, rows, result.info, result.summary, wall,
                     table, what_ifs, concurrency)


def median_running(series: pd.DataFrame, tick_s: float = 1.0) -> float:
    """The median number of running requests on a 1 s grid (vLLM's timeseries ticks), every replica's together
    (as vLLM's timeseries counts every DP rank's), over the ticks at which any request runs. Each replica samples
    at its own step ends: its count at a tick is its last sample at or before it."""
    end = float(series["time_s"].max())
    grid = np.arange(0.0, end + tick_s, tick_s)
    total = np.zeros(len(grid))
    for _, replica in series.sort_values("time_s", kind="stable").groupby("replica"):
        times, running = replica["time_s"].to_numpy(), replica["running"].to_numpy()
        index = np.searchsorted(times, grid, side="right") - 1
        total += np.where(index >= 0, running[np.maximum(index, 0)], 0)
    busy = total[total > 0]
    return float(np.median(busy)) if len(busy) else 0.0


def queue_lag_ms(run: Run) -> float:
    """Mean delay from arrival to queued_ts, the two clocks tied by the smallest (queued - arrival) of the run."""
    stamps = pd.DataFrame([json.loads(line) for line in
                           (run.folder / "vllm" / "requests.jsonl").read_text().splitlines() if line])
    offset = stamps["queued_ts"] - stamps["arrival_time"]
    return float((offset - offset.min()).mean() * 1e3)


def timings_span(timings) -> float:
    """From the first request queued to the last token: the run's length on the engine's clock."""
    return float(np.max(timings.queued_s + timings.e2e_s) - np.min(timings.queued_s))


def reproduces(measured: dict, reported: dict) -> float:
    """The largest relative difference between our recomputation and summary.txt's vLLM column (printed to 0.1 ms)."""
    return max(abs(measured[m][s] - reported[m][s]) / max(abs(reported[m][s]), 0.05)
               for m in METRICS for s in STATS)


# -- diagnosis: the decode step at the measured batch sizes, and the prefill of an idle engine ----------------------
@dataclass(slots=True)
class DecodeTick:
    """One 1-second tick of vllm/timeseries.csv with no prompt tokens computed (pure decode)."""

    t: float
    running: float  # the mean of the tick's two ends, every DP rank together
    context: float  # mean tokens attended per running request, rebuilt from requests.jsonl at the tick's middle
    measured_ms: float  # running / generated tokens per second: one decode step
    model_ms: float = math.nan


def decode_ticks(run: Run) -> list[DecodeTick]:
    """Pure-decode ticks with the engine busy at both ends and a steady batch (the ends within 10% of each other).
    The tick clock starts at meta.json's started_at (wall); the stamps are monotonic: wall and monotonic clocks
    are tied by the earliest queued_ts - arrival_time (the request queued with the least delay)."""
    from datetime import datetime

    series = pd.read_csv(run.folder / "vllm" / "timeseries.csv")
    rows = [json.loads(line) for line in (run.folder / "vllm" / "requests.jsonl").read_text().splitlines() if line]
    req = pd.DataFrame(rows)
    to_mono = float((req["queued_ts"] - req["arrival_time"]).min())
    started = datetime.fromisoformat(run.meta["started_at"].replace("Z", "+00:00")).timestamp()
    first, last = req["first_token_ts"].to_numpy(), req["last_token_ts"].to_numpy()
    prompt, output = req["input_toks"].to_numpy(), req["output_toks"].to_numpy()
    ticks = []
    running = series["running"].to_numpy(dtype=np.float64)
    for i in range(1, len(series)):
        row = series.iloc[i]
        ends = running[i - 1], running[i]
        if row["prompt_throughput"] != 0 or min(ends) < 1 or row["gen_throughput"] <= 0 or \
                abs(ends[0] - ends[1]) > 0.1 * max(ends):
            continue
        middle = started + float(row["t"]) - 0.5 + to_mono
        active = (first <= middle) & (middle < last)
        if not active.any():
            continue
        done = (middle - first[active]) / np.maximum(last[active] - first[active], 1e-9) * (output[active] - 1)
        context = float(np.mean(prompt[active] + done + 1))
        n = float(np.mean(ends))
        ticks.append(DecodeTick(float(row["t"]), n, context, n / float(row["gen_throughput"]) * 1e3))
    return ticks


def decode_features(requests: int, context: float, block_size: int):
    """A pure-decode step of `requests` requests attending `context` tokens each."""
    from kvplan.sim.cost import StepFeatures

    c = max(round(context), 1)
    return StepFeatures(num_requests=requests, prefill_tokens=0, prefill_attention2=0, decode_requests=requests,
                        decode_context=requests * c, decode_context_max=c,
                        blocks_touched=requests * -(-c // block_size), sampled=requests, batched=int(requests >= 2))


def price_ticks(run: Run, ticks: list[DecodeTick]) -> None:
    """The cost model's decode step at each tick's batch and context, the batch split over the replicas (one
    replica here: the DP x EP run is replayed as one TP replica)."""
    from kvplan.sim.run import build_cost

    cost, _ = build_cost(sim_spec(run))
    for tick in ticks:
        per_rank = max(round(tick.running / run.replicas), 1)
        tick.model_ms = float(cost.step_times(decode_features(per_rank, tick.context, run.settings["block_size"])))
        tick.model_ms *= 1e3


def step_parts(run: Run, requests: int, context: float) -> dict[str, float]:
    """The model's decode step split by differencing its features (no cost-model internals read): the step of one
    request at context 1 (weights streamed once + the fixed per-step cost), what N requests add at context 1
    (per-token element-wise work, per-request overhead, GEMM rows), and what their context adds (attention's KV
    reads); beside it the datasheet floor: weights + KV bytes at 100% of the datasheet bandwidth."""
    from kvplan.sim.run import build_cost
    from kvplan.sim.specs.hardware import get_hardware
    from kvplan.sim.specs.models import get_model

    cost, _ = build_cost(sim_spec(run))
    block = run.settings["block_size"]
    one = float(cost.step_times(decode_features(1, 1, block)))
    batch = float(cost.step_times(decode_features(requests, 1, block)))
    full = float(cost.step_times(decode_features(requests, context, block)))
    model, hardware = get_model(run.model), get_hardware(run.hardware)
    tp = run.settings["tensor_parallel_size"]
    floor = math.nan
    if not model.is_moe:
        kv = model.kv_bytes_per_token(None, tp, 1) * requests * context
        floor = (model.weight_bytes / tp + kv) / hardware.hbm_bandwidth
    return {"fixed_ms": one * 1e3, "batch_ms": (batch - one) * 1e3, "attention_ms": (full - batch) * 1e3,
            "model_ms": full * 1e3, "floor_ms": floor * 1e3,
            "collectives_ms": tp_collectives_s(cost, model, hardware, tp, requests) * 1e3}


def tp_collectives_s(cost, model, hardware, tp: int, tokens: int) -> float:
    """What the step's TP all-reduces cost in the model: two per layer of the step's hidden states, priced by
    `sim.cost.parallel.allreduce_time` at the cost's link efficiency. NaN where the law's interface is not this
    one (another helper may be rewriting it): the column then says '-' rather than stopping the page."""
    if tp == 1:
        return 0.0
    from kvplan.sim.cost import parallel

    efficiency = getattr(cost, "link_efficiency", None)
    law = getattr(parallel, "allreduce_time", None)
    if efficiency is None or law is None:
        return math.nan
    try:
        one = float(law(tokens * model.hidden_size * model.dtype_bytes, tp, hardware, efficiency))
    except TypeError:
        return math.nan
    return 2 * model.num_layers * one


def first_request_ttft(run: Run, result: RunResult) -> dict[str, float]:
    """The first request meets an idle engine: its TTFT is its prefill (with the chunks of the requests that
    arrive meanwhile beside its last one) - the cleanest prefill-speed comparison the runs offer. Also the
    fraction of the datasheet BF16 peak vLLM reached over that TTFT, as a range: the GEMM FLOPs (2 per active
    parameter per token, per GPU) of the first request's prompt alone, and of every prompt token scheduled
    before its first token (at most its steps' full token budgets)."""
    from kvplan.sim.specs.hardware import get_hardware
    from kvplan.sim.specs.models import get_model
    from kvplan.traces.loaders.vllm_bench import read_timings

    timings = read_timings(run.folder / "vllm" / "requests.jsonl")
    table = result.requests.sort_values("arrival_s", kind="stable")
    stamps = pd.DataFrame([json.loads(line) for line in
                           (run.folder / "vllm" / "requests.jsonl").read_text().splitlines() if line])
    first_token = float(stamps["first_token_ts"].iloc[0])
    budget = run.settings["max_num_batched_tokens"]
    own = int(timings.prompt_tokens[0])
    steps = -(-own // budget)
    scheduled = int(stamps.loc[stamps["scheduled_ts"] < first_token, "input_toks"].sum())
    model, hardware = get_model(run.model), get_hardware(run.hardware)
    gpus = run.settings["tensor_parallel_size"]
    ttft = float(timings.ttft_s[0])
    peak = hardware.peak_flops * ttft * gpus
    flops_per_token = 2.0 * model.active_layer_params
    return {"tokens": own, "measured_ms": ttft * 1e3, "kvplan_ms": float(table["ttft_ms"].iloc[0]),
            "achieved_low": flops_per_token * own / peak,
            "achieved_high": flops_per_token * min(scheduled, steps * budget) / peak}


# -- the page ------------------------------------------------------------------------------------------------------
def kvplan_commit() -> str:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "kvplan"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return commit + (" (with uncommitted changes under kvplan/)" if dirty else "")


def cost_constants(run: Run) -> str:
    """The step model's main constants as this checkout has them: the per-op laws' fitted efficiencies and
    latencies (sim/profiles/gpu_laws.json, docs/gpu_fidelity.md), the attention law (docs/attention.md) and the
    engine core's measured CPU work (docs/host_overhead.md)."""
    from kvplan.sim.cost.analytic import AnalyticCost
    from kvplan.sim.gpu import attention
    from kvplan.sim.run import build_cost

    cost, _ = build_cost(sim_spec(run))
    assert isinstance(cost, AnalyticCost)
    laws = cost.resolved_laws
    return (f"GEMM compute efficiency {laws.gemm_compute_efficiency:.3f}, GEMM memory efficiency "
            f"{laws.gemm_memory_efficiency:.3f}, GEMM floor {laws.gemm_floor_s * 1e6:.2f} us, all-reduce latency "
            f"{laws.allreduce_latency_s * 1e6:.1f} us at efficiency {laws.allreduce_efficiency:.3f} (fitted on "
            f"Vidur's A100/A40 profiles); attention KV-read efficiency {attention.DECODE_ETA:.3f}, kernel floor "
            f"{attention.KERNEL_S * 1e6:.2f} us per layer (fitted on published H100 timings); engine-core CPU work "
            f"{cost.step_overhead_s * 1e6:.1f} us per step + {cost.request_overhead_s * 1e6:.2f} us per request "
            f"(measured on vLLM's scheduler), async scheduling {'on' if cost.async_scheduling else 'off'}")


def alternative_medians(results: list[RunResult]) -> str:
    """The headline median with a run replayed in one of its other representations instead (a representation is a
    choice: the reader sees what the others would give). What-ifs read from a run (its reported capacity) are not
    representations and are left out."""
    parts = []
    for r in results:
        for label, errors in r.what_ifs:
            if "what-if" in label:
                continue
            tables = {o.run.name: o.rows for o in results if o is not r}
            tables[r.run.name] = [{"stat": "mean", "kvplan_err_pct": errors[m]} for m in METRICS]
            parts.append(f"{median_abs_mean_error(tables):.1f}% with {r.run.name} as {label.split(' (')[0]}")
    return (" Representations are a choice: " + "; ".join(parts) + " (the section on DP x EP says why the headline "
            "uses the one it does).") if parts else ""


def hardware_rows(results: list[RunResult]) -> list[str]:
    """The datasheet entries the replays used, and the device memory a run reports where it does."""
    from kvplan.sim.specs.hardware import get_hardware

    out = ["| hardware | BF16 dense TFLOP/s | memory bandwidth GB/s | memory GB (entry / device as torch saw it) "
           "| SMs | GPU-GPU link GB/s |", "|---|---:|---:|---|---:|---:|"]
    for name in dict.fromkeys(r.run.hardware for r in results):
        hw = get_hardware(name)
        reported = {r.run.meta.get("hardware", {}).get("device_total_memory_bytes") for r in results
                    if r.run.hardware == name} - {None}
        device = f"{min(reported) / 1e9:.2f}" if reported else "not reported"
        link = f"{hw.link_bandwidth / 1e9:.0f}" if hw.link_bandwidth else "none"
        out.append(f"| {name} | {hw.peak_flops / 1e12:.1f} | {hw.hbm_bandwidth / 1e9:.0f} | "
                   f"{hw.memory_bytes / 1e9:.2f} / {device} | {hw.sm_count} | {link} |")
    return out


def page(results: list[RunResult], diagnosis: dict[str, dict]) -> str:
    tables = {r.run.name: r.rows for r in results}
    kv_median = median_abs_mean_error(tables)
    lss_median = median_abs_mean_error(tables, "llmservingsim_err_pct")
    out = ["# End-to-end validation on four vLLM serving runs", "",
           f"Generated by `{COMMAND}` (kvplan commit {kvplan_commit()}); every figure below comes from that run. "
           "Do not edit by hand.", "",
           "Data: `../shared/data/llmservingsim-rtx` - four public vLLM 0.19.0 runs from LLMServingSim 2.0's "
           "validation (github.com/casys-kaist/LLMServingSim, `bench/examples/`, MIT): 300 ShareGPT requests, "
           "Poisson arrivals at ~10.3 req/s, offline engine (`python -m bench run`: no API server, so every latency "
           "is engine-internal: TTFT = first token - queued, E2E = last token - queued, TPOT = (last - first) / "
           "(output - 1)). kvplan replays each run's `vllm/requests.jsonl` (trace format `vllm-bench`: arrival and "
           "token counts; the prompts are unknown, so there is no prefix sharing to hit) with the run's engine "
           "settings (`vllm/meta.json`: max_num_seqs, max_num_batched_tokens, TP, DP; vLLM 0.19 defaults for the "
           "rest: block 16, chunked prefill and prefix caching on, gpu_memory_utilization 0.9, bf16), on the "
           "datasheet hardware entry (`kvplan/sim/specs/hardware.py`) and the built-in model spec, with the "
           "analytic cost model as this commit has it. **Nothing is fitted on these runs.** LLMServingSim's "
           "column is its own simulation of the same runs (`validation/summary.txt`), priced from per-layer "
           "profiles measured on these very GPUs - a measured-table simulator, not a transferred one.", "",
           f"Cost constants in this commit: {cost_constants(results[0].run)}. Hardware entries used:", "",
           *hardware_rows(results), "",
           "## Headline", "",
           f"**Median |error| of the means over the 12 (run x metric) means: kvplan {kv_median:.1f}%** "
           f"(LLMServingSim {lss_median:.1f}%). Goal: <= 10%.{alternative_medians(results)}", "",
           "| run | parallelism | TTFT mean | TPOT mean | E2E mean | KV blocks (kvplan / vLLM) | kvplan "
           "preemptions | running, median (kvplan / vLLM) | run length s (kvplan / vLLM) |",
           "|---|---|---:|---:|---:|---|---:|---|---|"]
    for r in results:
        means = {row["metric"]: row["kvplan_err_pct"] for row in r.rows if row["stat"] == "mean"}
        blocks = f"{r.info['num_blocks']:,} / " + (f"{r.run.measured_blocks:,}" if r.run.measured_blocks else
                                                   "not reported")
        out.append(f"| {r.run.name} | {r.run.representation} | {format_pct(means['ttft'])} | "
                   f"{format_pct(means['tpot'])} | {format_pct(means['e2e'])} | {blocks} | "
                   f"{r.summary['num_preemptions']} | {r.concurrency['running_sim']:.0f} / "
                   f"{r.concurrency['running_vllm']:.0f} | {r.concurrency['span_sim']:.1f} / "
                   f"{r.concurrency['span_vllm']:.1f} |")
    out += ["", "The vLLM column is recomputed here from `requests.jsonl`; it reproduces `summary.txt`'s vLLM "
            "column to within " + f"{max(reproduces(r.measured, r.reported_vllm) for r in results) * 100:.2f}% "
            "(summary.txt prints 0.1 ms).", ""]
    for r in results:
        out += [f"## {r.run.name}", "", f"`{cli_command(r.run)}` ({r.run.representation}).", "",
                markdown_table(r.rows), ""]
    out += diagnosis_section(results, diagnosis)
    return "\n".join(out) + "\n"


def diagnosis_section(results: list[RunResult], diagnosis: dict[str, dict]) -> list[str]:
    out = ["## Where it is worse, and why", "",
           "Four effects decide these runs, all at or past saturation: the decode step time (TPOT, and through it "
           "how fast the queue drains), the prefill speed (TTFT of an idle engine, and the share of each step that "
           "prefill chunks take), the KV capacity (only the RTX 4090 run fills it: preemptions, and how many "
           "requests run at once) and queueing (TTFT at saturation is mostly waiting: a step-time error compounds "
           "over the backlog).", "",
           "### Decode step at the measured batch sizes", "",
           "From `vllm/timeseries.csv`: the 1-second ticks in which no prompt token was computed and the batch was "
           "steady; the measured step is running / generated tokens per second; the context per request is "
           "rebuilt from `requests.jsonl` at the tick's middle. The model's step is the cost model's price of a "
           "pure-decode step of that batch at that context (the DP x EP run: both ranks' requests in one TP 2 step, "
           "as it is replayed).", "",
           "| run | decode ticks | running (median) | context (median) | measured step ms (median) | model step "
           "ms (median) | median step error |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        d = diagnosis[r.run.name]
        ticks = d["ticks"]
        if not ticks:
            out.append(f"| {r.run.name} | 0 | - | - | - | - | - |")
            continue
        errors = [signed_error_pct(t.model_ms, t.measured_ms) for t in ticks]
        out.append(f"| {r.run.name} | {len(ticks)} | {np.median([t.running for t in ticks]):.0f} | "
                   f"{np.median([t.context for t in ticks]):.0f} | {np.median([t.measured_ms for t in ticks]):.1f} | "
                   f"{np.median([t.model_ms for t in ticks]):.1f} | {format_pct(float(np.median(errors)))} |")
    out += ["", "The model's step at the median tick, split by differencing its own features (one request at "
            "context 1: the weights streamed once plus the fixed per-step cost; what the batch adds at context 1; "
            "what the context adds: attention's KV reads), beside the datasheet floor (weights + KV bytes at 100% "
            "of the datasheet bandwidth; dense models only):", "",
            "| run | batch (one step) | context | fixed + weights | + batch | + attention | model step | of which TP "
            "all-reduces | measured | datasheet floor |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        parts = diagnosis[r.run.name]["parts"]
        if parts is None:
            continue
        out.append(f"| {r.run.name} | {parts['requests']} | {parts['context']:.0f} | {parts['fixed_ms']:.1f} | "
                   f"{parts['batch_ms']:.1f} | {parts['attention_ms']:.1f} | {parts['model_ms']:.1f} | "
                   f"{format_ms(parts['collectives_ms'])} | {parts['measured_ms']:.1f} | "
                   f"{format_ms(parts['floor_ms'])} |")
    out += ["", "### Prefill of an idle engine", "",
            "The first request of each run (2358 or 2361 prompt tokens) arrives at an idle engine; the next ones "
            "arrive 0.2-0.4 s later and may share its second chunk's step. The replay has the same arrivals, so "
            "its TTFT compares the prefill speed of the first chunks:", "",
            "| run | prompt tokens | measured TTFT ms | kvplan TTFT ms | error | vLLM's GEMM FLOP/s, share of the "
            "datasheet peak |", "|---|---:|---:|---:|---:|---|"]
    for r in results:
        f = diagnosis[r.run.name]["first"]
        out.append(f"| {r.run.name} | {f['tokens']} | {f['measured_ms']:.1f} | {f['kvplan_ms']:.1f} | "
                   f"{format_pct(signed_error_pct(f['kvplan_ms'], f['measured_ms']))} | "
                   f"{f['achieved_low']:.0%} - {f['achieved_high']:.0%} |")
    out += ["", "### What-ifs and other representations", "",
            "The same replay with one thing changed; signed error of each mean against vLLM, and the simulated "
            "concurrency and run length (vLLM's are in the headline table):", "",
            "| run | variant | TTFT mean | TPOT mean | E2E mean | running, median | run length s |",
            "|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        for label, errors in r.what_ifs:
            out.append(f"| {r.run.name} | {label} | {format_pct(errors['ttft'])} | {format_pct(errors['tpot'])} | "
                       f"{format_pct(errors['e2e'])} | {errors['running']:.0f} | {errors['span']:.1f} |")
    out += ["", *diagnosis[results[0].run.name]["prose"]]
    return out


def diagnose(result: RunResult) -> dict:
    run = result.run
    ticks = decode_ticks(run)
    price_ticks(run, ticks)
    parts = None
    if ticks:
        middle = sorted(ticks, key=lambda t: t.running)[len(ticks) // 2]
        per_rank = max(round(middle.running / run.replicas), 1)
        parts = {**step_parts(run, per_rank, middle.context), "requests": per_rank, "context": middle.context,
                 "measured_ms": middle.measured_ms}
    return {"ticks": ticks, "parts": parts, "first": first_request_ttft(run, result), "prose": []}


def capacity_note(result: RunResult) -> str | None:
    """Where the derived KV capacity and the run's reported one part: vLLM's budget is utilization x the memory
    torch reports; what it keeps besides weights and KV is the rest."""
    from kvplan.sim.specs.hardware import get_hardware
    from kvplan.sim.specs.models import get_model

    run = result.run
    device = run.meta.get("hardware", {}).get("device_total_memory_bytes")
    if not (run.measured_blocks and device):
        return None
    model, hardware = get_model(run.model), get_hardware(run.hardware)
    util, block = run.settings["gpu_memory_utilization"], run.settings["block_size"]
    per_block = model.kv_bytes_per_token(None, 1, 1) * block
    vllm_other = device * util - model.weight_bytes - run.measured_blocks * per_block
    kvplan_other = hardware.memory_bytes * util - model.weight_bytes - result.info["num_blocks"] * per_block
    return (f"**KV capacity ({run.name}).** kvplan derives {result.info['num_blocks']:,} blocks, vLLM reported "
            f"{run.measured_blocks:,} ({signed_error_pct(result.info['num_blocks'], run.measured_blocks):+.1f}%). "
            f"Two causes: the datasheet entry's memory ({hardware.memory_bytes / 1e9:.2f} GB) is more than the "
            f"{device / 1e9:.2f} GB the device reports to torch, on which vLLM applies gpu_memory_utilization "
            f"({(hardware.memory_bytes - device) * util / per_block:,.0f} blocks at {util:g}); and vLLM keeps "
            f"{vllm_other / 1e9:.2f} GB besides weights and KV (profiled activations, CUDA graphs, the CUDA "
            f"context and library workspaces) where kvplan's activation reserve keeps "
            f"{kvplan_other / 1e9:.2f} GB. This run fills its KV cache, so the capacity moves every metric: the "
            "what-if below replays it at vLLM's block count.")


def prose(results: list[RunResult], diagnosis: dict[str, dict]) -> list[str]:
    """The findings, every figure computed from this run."""
    out = ["### What the numbers say", ""]
    for r in results:
        note = capacity_note(r)
        if note:
            means = {row["metric"]: row["kvplan_err_pct"] for row in r.rows if row["stat"] == "mean"}
            at_vllm = next((e for label, e in r.what_ifs if "KV capacity" in label), None)
            if at_vllm is not None:
                note += (f" At vLLM's block count the errors are TTFT {at_vllm['ttft']:+.1f}%, TPOT "
                         f"{at_vllm['tpot']:+.1f}%, E2E {at_vllm['e2e']:+.1f}% (derived capacity: "
                         f"{means['ttft']:+.1f}%, {means['tpot']:+.1f}%, {means['e2e']:+.1f}%): fewer blocks run "
                         "fewer requests at once, so TPOT improves, but the slow step then drains the queue "
                         "slower - the extra capacity was partly hiding the step-time error in TTFT and E2E.")
            out += [note, ""]
    steps = {r.run.name: float(np.median([signed_error_pct(t.model_ms, t.measured_ms)
                                          for t in diagnosis[r.run.name]["ticks"]]))
             for r in results if diagnosis[r.run.name]["ticks"]}
    firsts = {name: signed_error_pct(d["first"]["kvplan_ms"], d["first"]["measured_ms"])
              for name, d in diagnosis.items()}
    means = {r.run.name: {row["metric"]: row["kvplan_err_pct"] for row in r.rows if row["stat"] == "mean"}
             for r in results}
    floors = {name: d["parts"]["floor_ms"] / d["parts"]["measured_ms"] for name, d in diagnosis.items()
              if d["parts"] is not None and not math.isnan(d["parts"]["floor_ms"])}
    out += ["**Decode step.** At the measured batch sizes the model's pure-decode step is off by "
            + ", ".join(f"{v:+.1f}% ({k})" for k, v in steps.items()) + ". The datasheet floor (weights and KV "
            "read once at the full datasheet bandwidth) is "
            + ", ".join(f"{v:.0%} of the measured step ({k})" for k, v in floors.items()) + ": on one GPU vLLM "
            "(CUDA graphs) reaches most of the datasheet bandwidth and pays little per step, where the model "
            "derates the bandwidth by a fixed memory efficiency and adds a fixed per-step overhead (the constants "
            "above) - too slow on the RTX 4090, closer on the RTX PRO 6000, whose step at 128 requests carries "
            "more per-request work. With TP 2 over PCIe the model's step is a little fast; the PCIe all-reduce "
            "(a hand-set latency, the link efficiency fitted on NVLink) is the part of it no datasheet entry "
            "fixes. On the MoE run the expert GEMMs dominate the step (the '+ batch' column).", "",
            "**Prefill.** The first requests' TTFT (the engine starts idle; the same arrivals are replayed) is off "
            "by " + ", ".join(f"{v:+.1f}% ({k})" for k, v in firsts.items()) + ": on one GPU the model's "
            "2048-token chunks run faster than measured: vLLM's GEMM FLOP/s over that TTFT (last column: the "
            "first prompt alone, or every prompt token scheduled before its first token) is at most about half of "
            "the datasheet peak, below the large-GEMM efficiency the model assumes (the constants above; fitted on "
            "an A100); with TP 2 the model is slower, its PCIe all-reduces of 2048-token hidden states weighing "
            "more than vLLM's; on the MoE "
            "run the routed-expert kernels are much slower than the active-parameter "
            "FLOPs at that efficiency.", "",
            "**Queueing.** Every run is at or past saturation, so TTFT is mostly waiting for a slot "
            "(max_num_seqs) or for KV blocks, and a slot frees at the rate requests finish: a TPOT error becomes "
            "a larger TTFT error over the backlog (TPOT / TTFT mean errors: "
            + ", ".join(f"{k} {v['tpot']:+.1f}% / {v['ttft']:+.1f}%" for k, v in means.items()) + ").", "",
            "**Where TTFT starts.** The replay starts a request's clock at its arrival (arrival_time); vLLM's "
            "offline engine at queued_ts, when its loop takes the request in, at the end of the step in flight. "
            "Against the earliest-queued request's clock offset, vLLM queued requests a mean of "
            + ", ".join(f"{queue_lag_ms(r.run):.0f} ms ({r.run.name})" for r in results) + " after arrival: "
            "that much of kvplan's TTFT (and E2E) is time vLLM's stamps leave out - negligible beside TTFTs of "
            "seconds, a visible share of the DP x EP run's median TTFT.", "",
            "### The DP x EP run", "",
            "vLLM runs two engines in lockstep, each with its own scheduler (max_num_seqs 128, 2048 tokens), "
            "attention and KV cache for its own requests; the 128 experts are split 64 per GPU, and every MoE "
            "layer all-gathers the two ranks' hidden states and reduce-scatters the outputs "
            "(all2all_backend allgather_reducescatter, vLLM 0.19's default, as the RTX 4090 run's resolved config "
            "shows; this run's meta.json states no resolved config). kvplan has no replica group that shares an "
            "expert pool, so "
            "the page replays it as one replica of TP 2 with both engines' limits (256 sequences, 4096 tokens): "
            "per GPU that streams half of every layer's experts for the union of the tokens (the same bytes and "
            "FLOPs as half the experts whole), half of the KV reads, one step for both ranks (the lockstep), and "
            "two collectives of the step's hidden states per layer (all-reduces where vLLM has an all-gather and "
            "a reduce-scatter: the same count, twice the bytes). What it approximates: one FCFS queue instead of "
            "vLLM's load balancer over two, and attention weights split instead of replicated (about 3 GB of the "
            "61 GB). The two other ways kvplan could take the run are in the what-if table: two independent "
            "replicas price all 128 experts per replica for half the tokens (twice the expert bytes per decode "
            "step) with no collective; kvplan's `--enable-expert-parallel` law prices an all-to-all of k = 8 "
            "copies of every token each way (a DeepEP-style dispatch), which over PCIe is far slower than the "
            "all-gather vLLM 0.19 runs by default. All three were run while writing this page; the headline uses "
            "the one whose per-GPU work matches vLLM's for the reasons above, and it is also the closest to the "
            "measurement - the headline states the median with either of the others instead.", ""]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="the llmservingsim-rtx folder")
    parser.add_argument("--out", type=Path, default=DOC, help="the page to write")
    parser.add_argument("--print", action="store_true", help="print the page instead of writing it")
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        print(f"{args.data}: no such folder; allowed: the llmservingsim-rtx data folder (--data)", file=sys.stderr)
        return 2
    start = time.perf_counter()
    results = [evaluate(load_run(name, args.data)) for name in RUNS]
    diagnosis = {r.run.name: diagnose(r) for r in results}
    diagnosis[results[0].run.name]["prose"] = prose(results, diagnosis)
    text = page(results, diagnosis)
    if args.print:
        print(text, end="")
    else:
        args.out.write_text(text)
        tables = {r.run.name: r.rows for r in results}
        walls = ", ".join(f"{r.run.name} {r.wall_s:.2f} s" for r in results)
        print(f"simulations: {walls}")
        print(f"wrote {args.out} in {time.perf_counter() - start:.1f} s: median |error| of the means "
              f"{median_abs_mean_error(tables):.1f}% (LLMServingSim "
              f"{median_abs_mean_error(tables, 'llmservingsim_err_pct'):.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
