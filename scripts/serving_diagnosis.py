"""The diagnosis section of docs/serving_validation.md: where kvplan's replay of the vLLM serving runs is worse,
and why. The decode step at the batch sizes vLLM ran (its pure-decode 1-second ticks), the model's step split into
parts beside the datasheet floor, the TP all-reduces, the prefill of an idle engine (each run's first request),
the KV capacity against the run's reported one, and the prose that quotes these figures. Every figure is computed
from the runs and the cost model of this checkout.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.append(str(Path(__file__).resolve().parent))  # the sibling scripts, also when this file is loaded by path
from serving_replay import Run, RunResult, format_ms, format_pct, signed_error_pct, sim_spec


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
    """What the step's TP all-reduces cost in the model: two per layer of the step's hidden states, priced by the
    cost's fitted all-reduce law (`sim.gpu.laws.GpuLaws.allreduce_time`)."""
    if tp == 1:
        return 0.0
    one = float(cost.resolved_laws.allreduce_time(tokens * model.hidden_size * model.dtype_bytes, tp, hardware))
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


def queue_lag_ms(run: Run) -> float:
    """Mean delay from arrival to queued_ts, the two clocks tied by the smallest (queued - arrival) of the run."""
    stamps = pd.DataFrame([json.loads(line) for line in
                           (run.folder / "vllm" / "requests.jsonl").read_text().splitlines() if line])
    offset = stamps["queued_ts"] - stamps["arrival_time"]
    return float((offset - offset.min()).mean() * 1e3)



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
