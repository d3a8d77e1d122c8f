"""Loading and replaying the four public vLLM 0.19 serving runs of ../shared/data/llmservingsim-rtx, and the
comparison tables: each run's engine settings mapped onto kvplan's simulator (datasheet hardware entry, built-in
model spec, nothing fitted on these runs), its requests replayed, and TTFT, TPOT and E2E set beside what vLLM
measured and what LLMServingSim 2.0 simulated. scripts/serving_validation.py writes the page from these;
scripts/serving_diagnosis.py explains the errors.

All latencies are engine-internal (the runs are offline-engine benches): TTFT = first_token_ts - queued_ts,
E2E = last_token_ts - queued_ts, TPOT = (last - first) / (output - 1).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "llmservingsim-rtx"

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


def timings_span(timings) -> float:
    """From the first request queued to the last token: the run's length on the engine's clock."""
    return float(np.max(timings.queued_s + timings.e2e_s) - np.min(timings.queued_s))


def reproduces(measured: dict, reported: dict) -> float:
    """The largest relative difference between our recomputation and summary.txt's vLLM column (printed to 0.1 ms)."""
    return max(abs(measured[m][s] - reported[m][s]) / max(abs(reported[m][s]), 0.05)
               for m in METRICS for s in STATS)
