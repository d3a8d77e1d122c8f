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

The replay and the comparison tables are in scripts/serving_replay.py, the diagnosis section in
scripts/serving_diagnosis.py; this file writes the page.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))  # the sibling scripts, also when this file is loaded by path
from serving_diagnosis import diagnose, diagnosis_section, prose
from serving_replay import (
    DATA,
    METRICS,
    ROOT,
    RUNS,
    Run,
    RunResult,
    cli_command,
    evaluate,
    format_pct,
    load_run,
    markdown_table,
    median_abs_mean_error,
    reproduces,
    sim_spec,
)

DOC = ROOT / "docs" / "serving_validation.md"
COMMAND = "PYTHONPATH=. python scripts/serving_validation.py"


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
