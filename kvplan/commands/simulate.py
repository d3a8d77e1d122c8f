"""`kvplan simulate`: replay a trace on simulated replicas (the shared scheduler, a cost model for time)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kvplan.output import format_table, json_text, print_json, write_atomic

TABLE = (("block", "block_size"), ("kv_blocks", "num_blocks"), ("done", "completed"),
         ("req/s", "request_throughput"), ("out_tok/s", "output_throughput"), ("ttft_ms", "mean_ttft_ms"),
         ("p99_ttft", "p99_ttft_ms"), ("tpot_ms", "mean_tpot_ms"), ("p99_itl", "p99_itl_ms"),
         ("kv_mean", "kv_usage_mean"), ("kv_peak", "kv_usage_peak"), ("tok_util", "kv_token_utilization"),
         ("hit_rate", "prefix_cache_hit_rate"), ("preempt", "num_preemptions"), ("evicted", "num_evicted_blocks"))


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser("simulate", help="simulate serving a trace on N replicas", description=__doc__)
    p.add_argument("--trace", required=True, help="trace file (any format `kvplan trace` reads)")
    p.add_argument("--trace-format", default=None, help="trace format, when detection is not enough")
    p.add_argument("--model", default="llama-3-8b", help="built-in model spec or a path to an HF config.json")
    p.add_argument("--hardware", default="h100-sxm",
                   help="built-in hardware (a100-40gb, h100-sxm, l4, ...), or cpu-local: this kind of 2-core CPU "
                        "through the shipped calibrated profile of --model (llama-100m, smollm2-135m)")
    p.add_argument("--cost", default="analytic", help="cost model: analytic, calibrated (--profile P.yaml) or recorded "
                   "(--profile steps.jsonl of a live replay of this trace)")
    p.add_argument("--profile", default=None, help="calibrated profile YAML, or a replay's steps.jsonl")
    p.add_argument("--block-size", type=int, nargs="+", default=[16],
                   help="KV block size; several values run one simulation each and compare them")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--router", default="round_robin",
                   help="round_robin, least_outstanding, least_kv_usage or prefix_aware")
    p.add_argument("--num-blocks", type=int, default=None, help="KV capacity in blocks (default: analytic estimate)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--kv-dtype", default=None, help="KV cache dtype (float16, bfloat16, float8, int8, float32)")
    p.add_argument("--allocator", default="paged", help="paged, or a reservation baseline: max, pow2, oracle")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--eviction", default="lru", help="lru, fifo, lfu or s3fifo")
    p.add_argument("--cpu-blocks", type=int, default=0, help="CPU swap space in blocks")
    p.add_argument("--max-model-len", type=int, default=None, help="default: the trace's longest request")
    p.add_argument("--sink-tokens", type=int, default=0)
    p.add_argument("--window-tokens", type=int, default=0)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--no-chunked-prefill", action="store_true")
    p.add_argument("--policy", default="fcfs", help="fcfs or priority")
    p.add_argument("--preemption", default="recompute", help="recompute or swap")
    p.add_argument("--victim", default="newest", help="newest, lowest_priority or longest_remaining")
    p.add_argument("--schedule", default="mixed",
                   help="mixed (decodes first, prefill chunks fill the budget: vLLM V1) or prefill_first (a step "
                        "of prefills runs alone: vLLM V0)")
    p.add_argument("--sample-interval", type=float, default=None, help="seconds between time-series samples")
    p.add_argument("--no-fast-path", action="store_true", help="step by step (identical results, slower)")
    p.add_argument("--out", type=Path, default=None, help="write the per-request table and time series here")
    p.add_argument("--format", choices=["parquet", "csv"], default="parquet", help="table format for --out")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def spec_from_args(args: argparse.Namespace, block_size: int):
    from sim.run import SimSpec

    return SimSpec(
        model=args.model, hardware=args.hardware, cost=args.cost, profile=args.profile, replicas=args.replicas,
        router=args.router, block_size=block_size, num_blocks=args.num_blocks,
        gpu_memory_utilization=args.gpu_memory_utilization, kv_dtype=args.kv_dtype, allocator=args.allocator,
        enable_prefix_caching=not args.no_prefix_caching and args.allocator == "paged",
        eviction_policy=args.eviction, num_cpu_blocks=args.cpu_blocks, max_model_len=args.max_model_len,
        sink_tokens=args.sink_tokens, window_tokens=args.window_tokens,
        max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
        enable_chunked_prefill=not args.no_chunked_prefill, policy=args.policy, preemption_mode=args.preemption,
        victim_policy=args.victim, schedule=args.schedule, sample_interval_s=args.sample_interval,
        fast_path=not args.no_fast_path)


def run(args: argparse.Namespace) -> int:
    import traces
    from sim.run import check_trace, simulate

    trace = traces.load(args.trace, args.trace_format)
    check_trace(trace, str(args.trace))
    runs = []
    for block_size in args.block_size:
        start = time.perf_counter()
        result = simulate(trace, spec_from_args(args, block_size))
        wall = time.perf_counter() - start
        if args.out is not None:
            where = args.out / f"block{block_size}" if len(args.block_size) > 1 else args.out
            write_tables(result, where, args.format)
        runs.append({"block_size": block_size, "summary": result.summary,
                     "info": {**result.info, "wall_s": round(wall, 3)}})
    if args.json:
        print_json(runs[0] if len(runs) == 1 else {"runs": runs})
        return 0
    print(f"{args.trace}: {len(trace)} requests on {args.replicas} x {args.model} / {args.hardware} "
          f"({args.cost} cost, router {args.router}, eviction {args.eviction}, preemption {args.preemption})\n")
    rows = [[{**r["summary"], **r["info"]}[key] for _, key in TABLE] for r in runs]
    print(format_table([h for h, _ in TABLE], rows))
    print(f"\nsimulated {runs[0]['summary']['duration_s']:.1f} s per run; wall "
          + ", ".join(f"{r['info']['wall_s']:.2f} s" for r in runs))
    return 0


def write_tables(result, out: Path, fmt: str) -> None:
    import io

    for name, frame in (("requests", result.requests), ("series", result.series)):
        buffer = io.BytesIO()
        if fmt == "parquet":
            frame.to_parquet(buffer, index=False)
        else:
            frame.to_csv(buffer, index=False)
        write_atomic(out / f"{name}.{fmt}", buffer.getvalue())
    write_atomic(out / "summary.json", json_text({"summary": result.summary, "info": result.info}))
