"""`kvplan simulate`: replay a trace on simulated replicas (the shared scheduler, a cost model for time).

Every answer states its model error (`sim.gpu.model_error`): which source priced the steps, its validation error
per op family (or step kind) and the step-time band, as `model_error` in --json and one line after the table. A
single replay reports the band itself (a capacity range needs a search: `kvplan run` with `search:`).

Every answer states its cost too (`sim.dollars`, docs/cost.md): $/hour of the replicas' GPUs, $ per million input
and output tokens at the run's sustained rate, and completed requests per dollar, at the built-in dated prices
or `--prices FILE` / `--price-kind` - as `cost` in --json and one line after the table."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from kvplan.arg_types import (
    MAX_TOKENS,
    POSITIVE,
    REPLICAS,
    SEED,
    integer,
    number,
    out_path,
)
from kvplan.errors import UserError
from kvplan.output import atomic_dir, check_out_dir, check_paths, format_table, print_json
from kvplan.results.serving_result import write_tables
from kvplan.settings_cli import GIVEN, add_setting_flags, check_flag_needs, settings_from_args
from kvplan.trace_options import UNTIMED_NOTE, add_arrival_options, add_load_options, load_trace, retime_spec

if TYPE_CHECKING:
    from kvplan.sim.specs.prices import PriceTable

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
    p.add_argument("--lora-adapters", type=integer(1, 100_000), default=None, metavar="N",
                   help="spread the trace's sessions over N LoRA adapters lora-1 .. lora-N (with --enable-lora)")
    p.add_argument("--lora-skew", type=number(low=0, high=100), default=0.0, metavar="S",
                   help="Zipf exponent of the adapters' popularity (adapter i ~ i^-S; default 0: uniform)")
    p.add_argument("--seed", type=SEED, default=0, help="seed for --rate / --retime arrivals and --lora-adapters "
                   "(default 0)")
    from kvplan.sim.specs.models import MODELS

    p.add_argument("--model", default="llama-3-8b", help="a built-in model spec (" + ", ".join(sorted(MODELS))
                   + ") or a path to an HF config.json")
    p.add_argument("--hardware", default="h100-sxm",
                   help="built-in hardware (a100-40gb, h100-sxm, l4, ...), or cpu-local: this kind of 2-core CPU "
                        "through the shipped calibrated profile of --model (llama-100m, smollm2-135m)")
    p.add_argument("--cost", default="analytic", help="cost model: analytic, calibrated (--profile P.yaml) or recorded "
                   "(--profile steps.jsonl of a live replay of this trace)")
    p.add_argument("--profile", default=None, help="calibrated profile YAML, or a replay's steps.jsonl")
    p.add_argument("--gpu-profile", default=None, metavar="DIR",
                   help="--cost analytic: a Vidur-format per-op profile directory measured on --hardware; its "
                        "measured table prices the ops it covers, the fitted laws the rest (docs/gpu_fidelity.md)")
    p.add_argument("--replicas", type=REPLICAS, default=1)
    p.add_argument("--router", default="round_robin",
                   help="round_robin, least_outstanding, least_kv_usage or prefix_aware")
    # Every serving setting the simulator reads (engine.core.settings); several --block-size values run one
    # simulation each and compare them.
    # Prefix caching defaults to on for the paged allocator and off for a reservation baseline, which has none.
    add_setting_flags(p, "sim", multiple=["block_size"], defaults={"enable_prefix_caching": None})
    from kvplan.sim.pd_spec import add_pd_flags

    add_pd_flags(p)  # --prefill-replicas N --decode-replicas M ...: a disaggregated deployment (sim.pd_spec)
    p.add_argument("--sample-interval", type=POSITIVE, default=None, help="seconds between time-series samples")
    p.add_argument("--no-fast-path", action="store_true", help="step by step (identical results, slower)")
    p.add_argument("--workers", type=integer(1, 256), default=1,
                   help="processes to spread the replicas of a round-robin run over (identical results; a run "
                        "too short to pay for starting them runs in one, with a note; default 1)")
    p.add_argument("--out", type=out_path, default=None, help="write the per-request table and time series here")
    p.add_argument("--format", choices=["parquet", "csv"], default="parquet", help="table format for --out")
    add_price_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def add_price_options(p: argparse.ArgumentParser) -> None:
    """--prices and --price-kind: what the cost fields are computed with (docs/cost.md)."""
    p.add_argument("--prices", default=None, metavar="FILE",
                   help="a YAML or JSON price table over the built-in one: kind: on_demand|reserved and GPU: "
                        "$/GPU-hour or GPU: {on_demand, reserved, source, date} (docs/cost.md)")
    p.add_argument("--price-kind", choices=("on_demand", "reserved"), default=None,
                   help="which price column the cost uses (default: the file's kind, else on_demand)")


def prices_from_args(args: argparse.Namespace, base: PriceTable | None = None) -> PriceTable:
    """The price table the cost fields use: --prices FILE (over the built-in table; it replaces an experiment's
    `prices:` block), else `base` (that block's table), else the built-ins; --price-kind over either's kind."""
    from kvplan.sim.specs.prices import price_table, with_kind

    table = price_table(str(args.prices), "--prices") if args.prices is not None else base or price_table(None)
    return table if args.price_kind is None else with_kind(table, args.price_kind)


def spec_from_args(args: argparse.Namespace, block_size: int):
    from kvplan.sim.pd_spec import disaggregation_from_args
    from kvplan.sim.spec import SimSpec

    settings = settings_from_args(args, "sim")
    if settings["enable_prefix_caching"] is None:  # not given: on, except for a reservation allocator (none to use)
        settings["enable_prefix_caching"] = settings["allocator"] == "paged"
    check_flag_needs(args, settings)
    pd = disaggregation_from_args(args)
    if pd is not None and args.replicas != 1:
        raise UserError(f"--replicas: {args.replicas} with --prefill-replicas / --decode-replicas, which give the "
                        "pools' sizes; allowed: 1 (unset) in a disaggregated run")
    return SimSpec(model=args.model, hardware=args.hardware, cost=args.cost, profile=args.profile,
                   gpu_profile=args.gpu_profile, replicas=args.replicas, router=args.router,
                   **{**settings, "block_size": block_size},
                   sample_interval_s=args.sample_interval, fast_path=not args.no_fast_path,
                   disaggregation=pd)


def run(args: argparse.Namespace) -> int:
    from kvplan.sim.dollars import cost_fields, pools_cost_fields
    from kvplan.sim.run import check_trace, simulate

    if args.out is not None:
        check_out_dir(args.out)
        check_paths({"--trace": args.trace, "--profile": args.profile, "--gpu-profile": args.gpu_profile},
                    {"--out": args.out})
    prices = prices_from_args(args)  # before any run: a bad price file fails fast
    trace, notes = prepare_trace(args)
    check_trace(trace, str(args.trace))
    notes += profile_notes(args)
    runs, results = [], []
    from kvplan.sim.vllm_defaults import explain

    specs = [spec_from_args(args, block_size) for block_size in args.block_size]
    notes += explain(specs[0])
    for spec in specs:
        start = time.perf_counter()
        result = simulate(trace, spec, processes=args.workers)
        wall = time.perf_counter() - start
        results.append(result)
        gpus = spec.replicas * spec.tensor_parallel_size * spec.pipeline_parallel_size
        entry = {"block_size": spec.kv_block_size, "summary": result.summary,
                 "info": {**result.info, "wall_s": round(wall, 3)}}
        if spec.disaggregation is None:
            entry["cost"] = cost_fields(prices, spec.hardware, gpus, result.summary, result.info)
        else:  # each pool priced on its hardware (sim.dollars), and the per-request TTFT parts (sim.pd_run)
            pools = [(p["hardware"], p["gpus"], p["busy_s"], p["prefill_busy_s"])
                     for p in result.info["disaggregation"]["pools"]]
            entry["cost"] = pools_cost_fields(prices, pools, result.summary)
            entry["requests"] = pd_requests(result.requests)
        runs.append(entry)
    from kvplan.sim.gpu.model_error import model_error_for

    model_error = model_error_for(specs[0])  # the block size has no bearing
    if args.out is not None:  # one result set, swapped in whole: never half this run and half an earlier one
        options = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
                   if k not in ("handler", GIVEN)}
        with atomic_dir(args.out, {"command": "simulate", "options": options}) as tmp:
            for run_of, result in zip(runs, results, strict=True):
                write_tables(result, tmp / f"block{run_of['block_size']}" if len(results) > 1 else tmp, args.format)
    notes += rejection_notes(runs[0]["info"], len(trace))
    from kvplan.sim.frontend import saturation_note

    busy = saturation_note(runs[0]["info"].get("frontend"))
    notes += [busy] if busy is not None else []
    from kvplan.sim.lora import lora_note
    from kvplan.sim.spec_decode import speculation_note

    notes += [n for n in (speculation_note(runs[0]["info"]), lora_note(runs[0]["info"])) if n is not None]
    if args.workers > 1:
        from kvplan.sim.parallel import why_not_parallel

        why = why_not_parallel(args.router, args.replicas, False, len(trace), bool(args.kv_shared_blocks))
        if why is not None:
            notes.append(f"--workers {args.workers}: ran in one process: {why}")
    if args.json:
        print_notes(notes)  # stderr: stdout stays one strict JSON object
        print_json({**runs[0], "model_error": model_error.to_json(), "notes": notes} if len(runs) == 1 else
                   {"runs": runs, "model_error": model_error.to_json(), "notes": notes})
        return 0
    tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
    shape = f" at TP {tp} x PP {pp} ({args.replicas * tp * pp} GPUs in all)" if tp * pp > 1 else ""
    pd_info = runs[0]["info"].get("disaggregation")
    if pd_info is not None:
        shape = " disaggregated: " + " + ".join(
            f"{pd_info[f'{role}_replicas']} {role} ({pd_info[f'{role}_hardware']}, TP {pd_info[f'{role}_tp']}"
            f"{'' if pd_info.get(f'{role}_pp', 1) == 1 else ' x PP ' + str(pd_info[f'{role}_pp'])})"
            for role in ("prefill", "decode")
        ) + f" over {pd_info['kv_link']}"
    from kvplan.sim.specs.profiles import PROFILED_DEVICES

    # (a profiled device is priced by its calibrated profile whatever --cost says: sim.run.build_cost)
    cost = "calibrated" if args.hardware in PROFILED_DEVICES and args.cost == "analytic" else args.cost
    print(f"{args.trace}: {len(trace)} requests on {args.replicas} x {args.model} / {args.hardware}{shape} "
          f"({cost} cost, router {args.router}, eviction {args.eviction_policy}, "
          f"preemption {args.preemption_mode})\n")
    rows = [[{**r["summary"], **r["info"]}[key] for _, key in TABLE] for r in runs]
    print(format_table([h for h, _ in TABLE], rows))
    print(f"\nsimulated {runs[0]['summary']['duration_s']:.1f} s per run; wall "
          + ", ".join(f"{r['info']['wall_s']:.2f} s" for r in runs))
    if pd_info is not None:
        from kvplan.sim.pd_run import PARTS

        summary = runs[0]["summary"]
        print("TTFT parts, mean ms: " + ", ".join(f"{part.removesuffix('_ms')} {summary['mean_' + part]:.2f}"
                                                  for part in PARTS))
    print(model_error.one_line())
    from kvplan.sim.dollars import cost_line

    for r in runs:  # one line per run: the table stays as narrow as it was
        print(cost_line(r["cost"]) + (f" (block {r['block_size']})" if len(runs) > 1 else ""))
    sys.stdout.flush()
    print_notes(notes)
    return 0


def pd_requests(table) -> list[dict]:
    """A disaggregated run's per-request TTFT parts, for --json (sim.pd_run's columns)."""
    from kvplan.sim.pd_run import PARTS

    keys = ("request_id", "prefill_replica", "replica", "ttft_ms", *PARTS, "kv_transfer_bytes")
    return [{k: v.item() if hasattr(v, "item") else v for k, v in zip(keys, row, strict=True)}
            for row in table[list(keys)].itertuples(index=False, name=None)]


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
    from kvplan.traces.transforms import assign_adapters, clip_to_context, retime

    trace = load_trace(str(args.trace), args)
    arrivals = retime_spec(args)
    if arrivals is not None:
        trace = retime(trace, arrivals, args.seed, "--rate" if args.rate is not None else "--retime")
    if args.clip_context is not None:
        context = args.clip_context or args.max_model_len or model_context(args.model)
        if context is None:
            raise UserError(f"--clip-context: {args.model} states no context length; allowed: --clip-context TOKENS")
        trace = clip_to_context(trace, context)
    if args.lora_adapters is not None:
        trace = assign_adapters(trace, args.lora_adapters, args.lora_skew, seed=args.seed)
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


