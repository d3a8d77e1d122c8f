"""`kvplan replay`: the live engine serves a trace in real time (each request enters at its arrival time while
the engine steps continuously) and writes the same per-request table, time series and summary as `kvplan
simulate`, plus the step profile (steps.jsonl) that `kvplan validate --mode policy` and `--cost recorded` read.

With --endpoint URL the trace is replayed against an OpenAI-compatible server instead (vLLM, SGLang, TGI,
`kvplan serve`): each request is sent at its arrival time and streamed; the same tables are written from what
the client saw, plus every token's time (tokens.jsonl), failed requests (failed.jsonl) and the server's
vLLM counters over the run (endpoint.json). --model is then only the name sent (optional)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict

from kvplan.arg_types import POSITIVE, SEED, number, out_path
from kvplan.commands.simulate import TABLE, print_notes
from kvplan.endpoint.session import (
    add_endpoint_arguments,
    check_reachable,
    endpoint_options,
    replay_endpoint,
    within_duration,
)
from kvplan.engine_args import add_engine_arguments, add_lora_modules, lora_modules_from_args, options_from_args
from kvplan.errors import UserError
from kvplan.live import EngineOptions
from kvplan.output import atomic_dir, check_out_dir, check_paths, format_table, json_text, print_json
from kvplan.results.serving_result import write_tables


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser("replay", help="serve a trace on the live engine in real time", description=__doc__)
    add_trace_arguments(p, model_required=False)
    add_engine_arguments(p)
    add_lora_modules(p)
    add_endpoint_arguments(p)
    p.add_argument("--drift-probe", action="store_true", help="--endpoint: send the fixed drift-probe pattern "
                   "before and after the replay and write probe.json; `calibrate --from-replay` keeps it in the "
                   "profile, so that `validate --endpoint` can tell how much faster or slower the server runs")
    p.add_argument("--out", type=out_path, required=True, help="result directory (replaced whole on success)")
    p.add_argument("--format", choices=["parquet", "csv"], default="parquet", help="table format")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def add_trace_arguments(p: argparse.ArgumentParser, model_required: bool = True) -> None:
    p.add_argument("--model", required=model_required,
                   help="smollm2-135m, llama-100m, tiny-llama or a local HF directory")
    p.add_argument("--trace", required=True, help="trace file (any format `kvplan trace` reads)")
    p.add_argument("--trace-format", default=None, help="trace format, when detection is not enough")
    p.add_argument("--rate-scale", type=POSITIVE, default=1.0, help="multiply the arrival rate (2: twice as fast)")
    p.add_argument("--seed", type=SEED, default=0, help="prompt token ids and sampling")
    p.add_argument("--temperature", type=number(low=0), default=1.0, help="sampling temperature (outputs keep the "
                   "trace's lengths either way: ignore_eos)")


def load_trace(args: argparse.Namespace):
    import math

    from kvplan import traces
    from kvplan.sim.run import check_trace
    from kvplan.traces.transforms import scale_rate

    if not (math.isfinite(args.rate_scale) and args.rate_scale > 0):
        raise UserError(f"--rate-scale: must be a finite number > 0, got {args.rate_scale}")
    trace = traces.load(args.trace, args.trace_format)
    check_trace(trace, str(args.trace))
    print_notes([f"{args.trace}: {line}" for line in trace.report.lines()])  # e.g. fields the layout ignores
    try:
        return scale_rate(trace, args.rate_scale) if args.rate_scale != 1.0 else trace
    except ValueError as exc:
        raise UserError(f"--rate-scale: {exc}") from None


def check_no_engine_options(args: argparse.Namespace) -> None:
    """With --endpoint the server has its own configuration: engine options here would be silently unused."""
    given = options_from_args(args)
    if given != EngineOptions():
        changed = [k for k in EngineOptions.option_names() if getattr(given, k) != getattr(EngineOptions(), k)]
        raise UserError(f"--endpoint: engine options ({', '.join(changed)}) configure the in-process engine; "
                         "the endpoint's server has its own; allowed: --endpoint without engine options")


def run(args: argparse.Namespace) -> int:
    from kvplan.live import replay

    check_out_dir(args.out)
    check_paths({"--trace": args.trace}, {"--out": args.out})
    if args.endpoint is not None:
        return run_endpoint(args)
    if args.model is None:
        raise UserError("--model: required (the model the in-process engine runs), unless --endpoint is given")
    trace = within_duration(load_trace(args), args.duration)
    options = options_from_args(args)
    lora_modules = lora_modules_from_args(args)
    with atomic_dir(args.out, {"command": "replay", "model": args.model, "trace": str(args.trace),
                               "options": asdict(options)}) as out:
        result, meta = replay(args.model, trace, options, seed=args.seed, temperature=args.temperature,
                              steps_path=out / "steps.jsonl", lora_modules=lora_modules)
        write_tables(result, out, args.format)
        (out / "engine.json").write_text(json_text({"engine": meta, "options": asdict(options)}))
    if args.json:
        print_json({"summary": result.summary, "info": result.info})
        return 0
    print(f"{args.trace}: {len(trace)} requests replayed live on {args.model} ({options.dtype}, KV "
          f"{options.kv_cache_dtype}, block "
          f"{options.block_size}, {result.info['num_blocks']} KV blocks); engine busy "
          f"{result.info['busy_fraction']:.0%} of {result.summary['duration_s']:.1f} s\n")
    row = {**result.summary, **result.info}
    print(format_table([h for h, _ in TABLE], [[row[key] for _, key in TABLE]]))
    print(f"\nwrote {args.out}/: requests.{args.format}, series.{args.format}, summary.json, steps.jsonl")
    return 0


def run_endpoint(args: argparse.Namespace) -> int:
    from kvplan.live import sample_interval

    check_no_engine_options(args)
    options = endpoint_options(args)
    trace = within_duration(load_trace(args), options.duration_s)
    # before the line announcing the replay: a dead server is then the only line
    check_reachable(options.url, options.timeout_s)
    from kvplan.endpoint.servers import probe

    server = probe(options.url, options.server, options.timeout_s)
    print(f"{args.trace}: replaying {len(trace)} requests against {options.url}\n  {server.sentence()}",
          file=sys.stderr)
    with atomic_dir(args.out, {"command": "replay", "endpoint": options.url, "model": options.model,
                               "trace": str(args.trace)}) as out:
        result, load = replay_endpoint(options, trace, seed=args.seed, temperature=args.temperature, out=out,
                                       sample_interval_s=sample_interval(trace), server=server)
    if result.info["failed"] == len(trace):
        raise UserError(f"--endpoint: every request failed (first: {result.info['rejected_first'][0]}); each "
                         f"error is in {args.out}/failed.jsonl")
    if args.json:
        print_json({"summary": result.summary, "info": result.info})
        return 0
    info = result.info
    print(f"{args.trace}: {len(trace)} requests replayed against {options.url} in {load.wall_s:.1f} s; "
          f"{len(trace) - info['failed']} completed, {info['failed']} failed")
    for line in info["rejected_first"]:
        print(f"  failed: {line}")
    for what, fault in info["server_faults"].items():
        print(f"  excluded: {fault['count']} x {what} (first: {fault['first']})")
    if info["approximate_gap_requests"]:
        print(f"  {info['approximate_gap_requests']} requests' per-token gaps are approximate (text chunks without "
              "token ids that did not add up to the usage's count; --tokenizer counts them): left out of ITL")
    row = {**result.summary, **info}
    print(format_table([h for h, _ in ENDPOINT_TABLE], [[row[key] for _, key in ENDPOINT_TABLE]]))
    print(f"\nwrote {args.out}/: requests.parquet, series.parquet, summary.json, tokens.jsonl, failed.jsonl, "
          "endpoint.json")
    return 0


ENDPOINT_TABLE = (("done", "completed"), ("failed", "failed"), ("req/s", "request_throughput"),
                  ("tok/s", "output_throughput"), ("ttft_p50_ms", "median_ttft_ms"), ("ttft_p99_ms", "p99_ttft_ms"),
                  ("tpot_p50_ms", "median_tpot_ms"), ("itl_p99_ms", "p99_itl_ms"), ("e2e_p50_ms", "median_e2el_ms"),
                  ("kv_peak", "kv_usage_peak"), ("preempt", "num_preemptions"), ("hit_rate", "prefix_cache_hit_rate"))
