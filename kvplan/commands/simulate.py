"""`kvplan simulate`: replay a trace on simulated replicas (the shared scheduler, a cost model for time)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kvplan.arg_types import (
    BLOCK_SIZE,
    BLOCKS,
    CPU_BLOCKS,
    FRACTION,
    MAX_TOKENS,
    POSITIVE,
    POSITIVE_TOKENS,
    REPLICAS,
    SEED,
    TOKENS,
    integer,
    out_path,
)
from kvplan.output import atomic_dir, check_out_dir, format_table, json_text, print_json, write_atomic
from kvplan.trace_options import UNTIMED_NOTE, add_arrival_options, add_load_options, load_trace, retime_spec

TABLE = (("block", "block_size"), ("kv_blocks", "num_blocks"), ("done", "completed"),
         ("req/s", "request_throughput"), ("out_tok/s", "output_throughput"), ("ttft_ms", "mean_ttft_ms"),
         ("p99_ttft", "p99_ttft_ms"), ("tpot_ms", "mean_tpot_ms"), ("p99_itl", "p99_itl_ms"),
         ("kv_mean", "kv_usage_mean"), ("kv_peak", "kv_usage_peak"), ("tok_util", "kv_token_utilization"),
         ("hit_rate", "prefix_cache_hit_rate"), ("preempt", "num_preemptions"), ("evicted", "num_evicted_blocks"),
         ("rejected", "num_rejected"))


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser("simulate", help="simulate serving a trace on N replicas", description=__doc__)
    p.add_argument("--trace", required=True, help="trace file (any format `kvplan trace` reads, plain or compressed)")
    add_load_options(p, "--trace-format")
    add_arrival_options(p)
    p.add_argument("--clip-context", nargs="?", type=integer(2, MAX_TOKENS), const=0, default=None, metavar="TOKENS",
                   help="clip requests to TOKENS (default: max_model_len) instead of rejecting those beyond it")
    p.add_argument("--seed", type=SEED, default=0, help="seed for --rate / --retime arrivals (default 0)")
    p.add_argument("--model", default="llama-3-8b", help="built-in model spec or a path to an HF config.json")
    p.add_argument("--hardware", default="h100-sxm",
                   help="built-in hardware (a100-40gb, h100-sxm, l4, ...), or cpu-local: this kind of 2-core CPU "
                        "through the shipped calibrated profile of --model (llama-100m, smollm2-135m)")
    p.add_argument("--cost", default="analytic", help="cost model: analytic, calibrated (--profile P.yaml) or recorded "
                   "(--profile steps.jsonl of a live replay of this trace)")
    p.add_argument("--profile", default=None, help="calibrated profile YAML, or a replay's steps.jsonl")
    p.add_argument("--block-size", type=BLOCK_SIZE, nargs="+", default=[16],
                   help="KV block size; several values run one simulation each and compare them")
    p.add_argument("--replicas", type=REPLICAS, default=1)
    p.add_argument("--router", default="round_robin",
                   help="round_robin, least_outstanding, least_kv_usage or prefix_aware")
    p.add_argument("--num-blocks", type=BLOCKS, default=None, help="KV capacity in blocks (default: analytic estimate)")
    p.add_argument("--gpu-memory-utilization", type=FRACTION, default=0.9)
    p.add_argument("--kv-dtype", default=None, help="KV cache dtype (float16, bfloat16, float8, int8, float32)")
    p.add_argument("--allocator", default="paged", help="paged, or a reservation baseline: max, pow2, oracle")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--eviction", default="lru", help="lru, fifo, lfu or s3fifo")
    p.add_argument("--cpu-blocks", type=CPU_BLOCKS, default=0, help="CPU swap space in blocks")
    p.add_argument("--max-model-len", type=integer(2, MAX_TOKENS), default=None,
                   help="longest request served, at most the model's context (default: the shorter of the two "
                        "and the trace's longest request); longer requests are rejected and counted")
    p.add_argument("--sink-tokens", type=TOKENS, default=0)
    p.add_argument("--window-tokens", type=TOKENS, default=0)
    p.add_argument("--max-num-batched-tokens", type=POSITIVE_TOKENS, default=2048)
    p.add_argument("--max-num-seqs", type=integer(1, 1_000_000), default=256)
    p.add_argument("--no-chunked-prefill", action="store_true")
    p.add_argument("--policy", default="fcfs", help="fcfs or priority")
    p.add_argument("--preemption", default="recompute", help="recompute or swap")
    p.add_argument("--victim", default="newest", help="newest, lowest_priority or longest_remaining")
    p.add_argument("--schedule", default="mixed",
                   help="mixed (decodes first, prefill chunks fill the budget: vLLM V1) or prefill_first (a step "
                        "of prefills runs alone: vLLM V0)")
    p.add_argument("--scheduler-reserve-full-isl", action=argparse.BooleanOptionalAction, default=True,
                   help="admit a waiting request only when its whole prompt fits in the free KV blocks (vLLM's "
                        "default); --no-scheduler-reserve-full-isl: a first chunk that fits is enough (vLLM <= 0.10)")
    p.add_argument("--sample-interval", type=POSITIVE, default=None, help="seconds between time-series samples")
    p.add_argument("--no-fast-path", action="store_true", help="step by step (identical results, slower)")
    p.add_argument("--out", type=out_path, default=None, help="write the per-request table and time series here")
    p.add_argument("--format", choices=["parquet", "csv"], default="parquet", help="table format for --out")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def spec_from_args(args: argparse.Namespace, block_size: int):
    from kvplan.sim.run import SimSpec

    return SimSpec(
        model=args.model, hardware=args.hardware, cost=args.cost, profile=args.profile, replicas=args.replicas,
        router=args.router, block_size=block_size, num_blocks=args.num_blocks,
        gpu_memory_utilization=args.gpu_memory_utilization, kv_dtype=args.kv_dtype, allocator=args.allocator,
        enable_prefix_caching=not args.no_prefix_caching and args.allocator == "paged",
        eviction_policy=args.eviction, num_cpu_blocks=args.cpu_blocks, max_model_len=args.max_model_len,
        sink_tokens=args.sink_tokens, window_tokens=args.window_tokens,
        max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
        enable_chunked_prefill=not args.no_chunked_prefill, policy=args.policy, preemption_mode=args.preemption,
        victim_policy=args.victim, schedule=args.schedule,
        scheduler_reserve_full_isl=args.scheduler_reserve_full_isl, sample_interval_s=args.sample_interval,
        fast_path=not args.no_fast_path)


def run(args: argparse.Namespace) -> int:
    from kvplan.sim.run import check_trace, simulate

    if args.out is not None:
        check_out_dir(args.out)
    trace, notes = prepare_trace(args)
    check_trace(trace, str(args.trace))
    notes += profile_notes(args)
    runs, results = [], []
    for block_size in args.block_size:
        start = time.perf_counter()
        result = simulate(trace, spec_from_args(args, block_size))
        wall = time.perf_counter() - start
        results.append(result)
        runs.append({"block_size": block_size, "summary": result.summary,
                     "info": {**result.info, "wall_s": round(wall, 3)}})
    if args.out is not None:  # one result set, swapped in whole: never half this run and half an earlier one
        options = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "handler"}
        with atomic_dir(args.out, {"command": "simulate", "options": options}) as tmp:
            for block_size, result in zip(args.block_size, results, strict=True):
                write_tables(result, tmp / f"block{block_size}" if len(results) > 1 else tmp, args.format)
    notes += rejection_notes(runs[0]["info"], len(trace))
    if args.json:
        print_notes(notes)  # stderr: stdout stays one strict JSON object
        print_json({**runs[0], "notes": notes} if len(runs) == 1 else {"runs": runs, "notes": notes})
        return 0
    print(f"{args.trace}: {len(trace)} requests on {args.replicas} x {args.model} / {args.hardware} "
          f"({args.cost} cost, router {args.router}, eviction {args.eviction}, preemption {args.preemption})\n")
    rows = [[{**r["summary"], **r["info"]}[key] for _, key in TABLE] for r in runs]
    print(format_table([h for h, _ in TABLE], rows))
    print(f"\nsimulated {runs[0]['summary']['duration_s']:.1f} s per run; wall "
          + ", ".join(f"{r['info']['wall_s']:.2f} s" for r in runs))
    sys.stdout.flush()
    print_notes(notes)
    return 0


def profile_notes(args: argparse.Namespace) -> list[str]:
    """A calibrated profile of another model prices this one with that model's step times: said, not silent."""
    if args.cost != "calibrated" or args.profile is None:
        return []
    from kvplan.sim.cost.calibrated import load_profile
    from kvplan.sim.specs.profiles import profile_mismatch

    why = profile_mismatch(load_profile(args.profile).meta.get("model"), args.model)
    return [f"--profile {args.profile}: {why}"] if why else []


def print_notes(notes: list[str]) -> None:
    for note in notes:
        print(f"note: {note}", file=sys.stderr)


def prepare_trace(args: argparse.Namespace):  # -> (traces.Trace, notes)
    """The trace as loaded, re-timed (--rate / --retime) and clipped (--clip-context) when asked, with a note
    for everything the user should know about it: what the load changed, and a length-only trace's burst."""
    from kvplan.sim.run import model_context
    from kvplan.traces.transforms import clip_to_context, retime

    trace = load_trace(str(args.trace), args)
    arrivals = retime_spec(args)
    if arrivals is not None:
        trace = retime(trace, arrivals, args.seed, "--rate" if args.rate is not None else "--retime")
    if args.clip_context is not None:
        context = args.clip_context or args.max_model_len or model_context(args.model)
        if context is None:
            raise ValueError(f"--clip-context: {args.model} states no context length; allowed: --clip-context TOKENS")
        trace = clip_to_context(trace, context)
    notes = list(trace.report.lines())
    if not trace.timed:
        notes.append(f"{args.trace} " + UNTIMED_NOTE.format(n=len(trace)))
    return trace, notes


def rejection_notes(info: dict, total: int) -> list[str]:
    """Requests never served, by cause, so that a summary over the served ones is never mistaken for the whole."""
    rejected = info["rejected"]
    if not rejected:
        return []
    causes = []
    if info["rejected_over_length"]:
        causes.append(f"{info['rejected_over_length']} longer than max_model_len {info['max_model_len']} (prompt + "
                      "output; --clip-context clips them instead)")
    if info["rejected_failed"]:
        causes.append(f"{info['rejected_failed']} failed requests of the trace (0 tokens)")
    other = rejected - info["rejected_over_length"] - info["rejected_failed"]
    if other:
        causes.append(f"{other} that can never run in this configuration, e.g. {info['rejected_first'][0]}")
    return [f"{rejected} of {total} requests rejected, never served (not in the latencies): " + "; ".join(causes)]


def write_tables(result, out: Path, fmt: str) -> None:
    import io

    from kvplan.sim.rejections import with_rejected

    # the written table holds the never-served requests too (reason, no latencies): a report's request_id is in it
    requests = with_rejected(result.requests, getattr(result, "rejected", None))
    for name, frame in (("requests", requests), ("series", result.series)):
        buffer = io.BytesIO()
        if fmt == "parquet":
            frame.to_parquet(buffer, index=False)
        else:
            frame.to_csv(buffer, index=False)
        write_atomic(out / f"{name}.{fmt}", buffer.getvalue())
    write_atomic(out / "summary.json", json_text({"summary": result.summary, "info": result.info}))
