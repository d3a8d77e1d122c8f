"""`kvplan bench TARGET`: performance benchmarks that report ratios against a baseline from the same run."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from kvplan.arg_types import BLOCK_SIZE, POSITIVE, REPLICAS, SEED, integer, number, out_path
from kvplan.errors import UserError
from kvplan.output import format_table, print_json, short, write_atomic
from kvplan.settings_cli import add_setting_flags


def register(verbs: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser("bench", help="run a benchmark", description=__doc__)
    targets = parser.add_subparsers(dest="target", metavar="TARGET", required=True)
    core = _target(targets, _bench_core, "core", help="serving core: memory efficiency and scheduler cycle time",
                   description="Paged allocation vs contiguous reservation (Max, Pow2, Oracle) on a ShareGPT-like "
                               "workload, and the wall time of one schedule+update cycle with 256 and 1024 running "
                               "decode requests.")
    core.add_argument("--requests", type=integer(1, 1_000_000, "each is held in memory"), default=600,
                      help="requests in the memory workload (default 600)")
    core.add_argument("--seed", type=SEED, default=0)
    engine = _target(targets, _bench_engine, "engine",
                     help="live engine vs HF generate (static batches) and generate_batch",
                     description="The mixed workload (64 requests, prompts 32-512, outputs 16-256 tokens) on a random "
                                 "~100M-parameter Llama: useful output tokens/s of the engine, HF generate with "
                                 "static batches of 8 and 16, and HF continuous batching, plus the engine's KV "
                                 "token utilization. Takes minutes on CPU.")
    add_setting_flags(engine, "engine", names=("dtype",))
    engine.add_argument("--requests", type=integer(1, 100_000, "each runs on the live engine"), default=64)
    sim = _target(
        targets, _bench_sim, "sim",
        help="simulator speed in each regime: prefix caching off/on, 4x load, Mooncake, a burst, a million requests, "
             "a steady-state capacity search",
        description="Simulated seconds per wall second, fast-path share and peak memory, each regime in its own "
                    "process on llama-3-8b / h100-sxm: the one-hour Azure LLM conversation trace (2023) with prefix "
                    "caching off, on, and at 4x its rate; the Mooncake FAST'25 conversation trace; a burst of 20,000 "
                    "lengths-only arXiv requests at t = 0; a seeded million ShareGPT-like requests on 16 replicas; "
                    "the quickstart's steady-state capacity search (first seed). Beside each row, the machine's "
                    "speed on a fixed pure-Python workload measured around it (Mops/s), to compare runs. "
                    "The public traces are read from ../shared/data (a row is reported as skipped when missing). "
                    "Targets: >= 2000x real time; the burst <= 10 s; the million <= 60 s and 1 GB. Takes minutes.")
    sim.add_argument("--data", type=Path, default=None, help="shared data directory (default ../shared/data)")
    sim.add_argument("--requests", type=integer(1, 10_000_000), default=1_000_000,
                     help="synthetic requests (default 1,000,000)")
    sim.add_argument("--replicas", type=REPLICAS, default=16, help="replicas for the synthetic run (default 16)")
    sim.add_argument("--seed", type=SEED, default=0)
    sim.add_argument("--regimes", nargs="+", choices=sim_regimes(), default=None, metavar="REGIME",
                     help=f"run only these (default all: {', '.join(sim_regimes())})")
    kernels = _target(
        targets, _bench_kernels, "kernels", help="paged Triton kernels vs torch SDPA (needs a CUDA GPU)",
        description="Paged decode and prefill attention over a grid of batch sizes, context lengths and "
                    "block sizes 8-128, against torch SDPA on a contiguous cache: time, achieved HBM "
                    "bandwidth, fraction of the device's peak, and the ratio to SDPA. Writes the grid as CSV "
                    "for calibration. Without a CUDA GPU it says so and exits 0.")
    kernels.add_argument("--csv", type=out_path, default=Path("results/bench_kernels.csv"),
                         help="where to write the grid (default results/bench_kernels.csv)")
    kernels.add_argument("--peak-gbps", type=POSITIVE, default=None,
                         help="peak HBM bandwidth in GB/s, overriding the built-in table of devices")
    serve = _target(
        targets, _bench_serve, "serve", help="load test of kvplan serve: saturation point, then held there",
        description="Start `kvplan serve` on a free loopback port, ramp a closed-loop client (1, 2, 4, ... requests "
                    "in flight) until requests/s stops growing, then hold the saturation point for --hold seconds. "
                    "Reports requests/s, output tokens/s and p50/p99 TTFT at each level and in the hold, and checks "
                    "that nothing failed, the server counted every request and no KV block leaked.")
    serve.add_argument("--model", default="smollm2-135m", help="served model (default smollm2-135m)")
    serve.add_argument("--hold", type=POSITIVE, default=60.0, help="seconds at the saturation point (default 60)")
    serve.add_argument("--ramp", type=POSITIVE, default=5.0, help="seconds per ramp level (default 5)")
    serve.add_argument("--prompt-tokens", type=integer(1, 8192), default=128)
    serve.add_argument("--output-tokens", type=integer(1, 8192), default=32)
    serve.add_argument("--max-concurrency", type=integer(1, 4096), default=128, help="the ramp's last level")
    serve.add_argument("--seed", type=SEED, default=0)
    serve.add_argument("--engine-args", default="", help="extra `kvplan serve` options, e.g. '--block-size 32'")
    serve.add_argument("--timeout", type=number(above=0, high=86400), default=300.0,
                       help="seconds: the server must answer /health within this of its start (else the last "
                            "lines of its log, exit 2), and each request and /metrics scrape must complete within "
                            "it, from connecting to the last byte (default 300)")
    trace_load = _target(
        targets, _bench_traces, "traces", help="loading a 1M-request trace against the 10 s / 1 GB budgets",
        description="Generate (seeded, in a temporary directory) an Azure-2023-layout CSV and a Mooncake-like "
                    "JSONL with 512-token hash_ids, load each with traces.load in a fresh process, and report "
                    "rows/s, wall seconds, the loaded Trace's array bytes and the load's peak RSS increase "
                    "(VmHWM), with ratios to the budgets (10 s, 1 GB).")
    trace_load.add_argument("--rows", type=integer(1, 10_000_000), default=1_000_000,
                            help="requests per file (default 1000000)")
    trace_load.add_argument("--seed", type=SEED, default=0)
    beam = _target(
        targets, _bench_beam, "beam", help="memory saved by copy-on-write sharing: beam search, parallel sampling",
        description="Beam widths 2, 4, 6 and parallel sampling n = 2, 4, 6 on the live engine, over prompts of "
                    "~19 tokens cut from a real text with ~58-token outputs (the vLLM paper's Alpaca shape): "
                    "blocks held with sharing against blocks the same sequences would hold unshared, after every "
                    "step; saving = 1 - held / independent, per step and overall.")
    beam.add_argument("--model", default="smollm2-135m", help="model (default smollm2-135m)")
    beam.add_argument("--text", type=Path, default=None,
                      help="UTF-8 text the prompts are cut from (default /usr/share/common-licenses/GPL-3)")
    beam.add_argument("--requests", type=integer(1, 256), default=16, help="requests per run (default 16)")
    beam.add_argument("--block-size", type=BLOCK_SIZE, default=16)
    beam.add_argument("--seed", type=SEED, default=0)


    fidelity = _target(
        targets, _bench_fidelity, "fidelity", help="the shipped per-op GPU model against a Vidur-format profile",
        description="Evaluates the shipped per-op model (sim/profiles/gpu_laws.json, on the --hardware datasheet) on "
                    "every row of a Vidur-format profile directory, without fitting on it: per op family (gemm, "
                    "elementwise, attention, allreduce, send_recv) the rows, median and p90 |error|, mean and "
                    "median signed error.")
    fidelity.add_argument("--profiles", type=Path, required=True, metavar="DIR",
                          help="a Vidur-format profile directory (compute/<gpu>/<org>/<model>/mlp.csv, "
                               "network/<name>/all_reduce.csv, ...)")
    fidelity.add_argument("--hardware", required=True, metavar="NAME", help="the GPU the profile was measured on")


def sim_regimes() -> tuple[str, ...]:
    from kvplan.bench.sim import REGIMES  # numpy only: the CLI still starts without torch

    return REGIMES


def _target(targets: argparse._SubParsersAction, handler: Callable[[argparse.Namespace], int], name: str,
            **kwargs: str) -> argparse.ArgumentParser:
    """A benchmark target: every one prints one JSON object with --json."""
    parser = targets.add_parser(name, **kwargs)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=handler)
    return parser


def _report(args: argparse.Namespace, result: dict, show: Callable[[dict], None]) -> int:
    """One JSON object with --json, else the human-readable form."""
    if args.json:
        print_json(result)
    else:
        show(result)
    return 0


def _bench_fidelity(args: argparse.Namespace) -> int:
    from kvplan.bench import fidelity

    return _report(args, fidelity.run(args.profiles, args.hardware), _show_fidelity)


def _show_fidelity(result: dict) -> None:
    print(f"{result['profiles']} on {result['hardware']} (the shipped model; this command fits nothing): "
          f"{result['rows']} rows\n")
    print(format_table(["family", "rows", "median_abs_%", "p90_abs_%", "mean_signed_%", "median_signed_%"],
                       [[f["family"], f["rows"], f["median_abs_err_pct"], f["p90_abs_err_pct"], f["bias_pct"],
                         f["median_signed_err_pct"]] for f in result["families"]]))


def _bench_core(args: argparse.Namespace) -> int:
    from kvplan.bench import core

    result = core.run(args.requests, args.seed)
    return _report(args, result, _show_core)


def _show_core(result: dict) -> None:
    w = result["workload"]
    print(f"Memory: {w['requests']} ShareGPT-like requests (mean prompt {w['mean_prompt']:.0f}, output "
          f"{w['mean_output']:.0f}, max {w['max_len']}), {w['kv_slots']} KV token slots, averaged over steps\n")
    rows = [[name, m["kv_token_utilization"], m["utilization_vs_paged"], m["token_states"], m["reserved_unused"],
             m["internal_fragmentation"], m["external_fragmentation"], m["free"], m["mean_batch"]]
            for name, m in result["memory"].items()]
    print(format_table(["allocator", "util", "vs_paged", "tokens", "reserved", "internal", "external", "free",
                        "batch"], rows))
    c = result["cycle"]
    print(f"\nScheduler cycle (schedule+update, all decoding, block 16; budget {result['cycle_budget_ms']} ms):")
    print(format_table(["running", "ms", "vs_budget"], [
        ["256", c["decode_cycle_256_ms"], c["decode_cycle_256_vs_budget"]],
        ["256 (token ids)", c["decode_cycle_256_token_ids_ms"], c["decode_cycle_256_token_ids_vs_budget"]],
        ["1024", c["decode_cycle_1024_ms"], c["decode_cycle_1024_vs_budget"]],
    ]))


def _bench_engine(args: argparse.Namespace) -> int:
    from kvplan.bench import engine

    result = engine.run(args.dtype, args.requests)
    return _report(args, result, _show_engine)


def _show_engine(result: dict) -> None:
    print(f"{result['requests']} requests, {result['useful_tokens']} useful output tokens, {result['model']} "
          f"({result['dtype']}, {result['threads']} threads)\n")
    rows = [[name, r["seconds"], r["useful_tokens_per_s"]] for name, r in result["results"].items()]
    print(format_table(["system", "seconds", "useful_tok/s"], rows))
    print(f"\nengine / best static batch: {result['ratio_vs_best_static']:.2f}x   "
          f"engine / generate_batch: {result['ratio_vs_generate_batch']:.2f}x   "
          f"KV token utilization (block 16): {result['results']['engine']['kv_token_utilization']:.3f}")


def _bench_sim(args: argparse.Namespace) -> int:
    from kvplan.bench import sim

    if args.data is not None and not args.data.is_dir():  # the default may be absent (regimes skipped), a given one
        raise UserError(f"--data: {args.data}: not a directory; allowed: the shared data directory (holding "
                        "azure-llm-2023/ and the other public traces), or no --data")
    result = sim.run(args.data or sim.DATA_DIR, args.requests, args.replicas, seed=args.seed,
                     regimes=tuple(args.regimes or sim.REGIMES))
    return _report(args, result, _show_sim)


def _show_sim(result: dict) -> None:
    from kvplan.bench.sim import PLAIN_REQUESTS

    targets = {"speedup": f">= {result['speedup_target']:.0f}x", "wall_s": f"<= {result['burst_wall_target_s']:.0f} s",
               "wall_s+rss": "<= 60 s, 1 GB"}
    rows, skipped = [], []
    for name, row in result["regimes"].items():
        if row.get("skipped"):
            skipped.append(f"{name}: skipped - {row['reason']}")
            continue
        plain = row.get("plain") or {}
        rows.append([name, row["requests"], row["replicas"], row["prefix_caching"], row["wall_s"], row["simulated_s"],
                     f"{row['speedup']:.0f}x", f"{plain['vs_plain']:.2f}x" if plain else "-",
                     f"{plain['speedup']:.0f}x" if plain else "-", f"{row['fast_share']:.1%}", row["peak_rss_mb"],
                     row["reference_mops"], targets[row["target"]], "met" if row["target_met"] else "not met"])
    if rows:
        print(format_table(["regime", "requests", "replicas", "prefix", "wall_s", "simulated_s", "speedup",
                            "vs_plain", "plain_speedup", "fast_path", "peak_rss_mb", "ref_Mops/s", "target", ""],
                           rows))
        print("vs_plain: the plain step-by-step path's wall / the fast path's on a part of the row timed in its "
              f"process (replica 0's first {PLAIN_REQUESTS:,} requests on one replica; steady_search: its first "
              "probe); plain_speedup: the plain path's simulated / wall seconds on it")
    for name, row in result["regimes"].items():
        if row.get("plain") and not row["plain"]["identical"]:
            print(f"{name}: the fast and plain paths' results differ on {row['plain']['rule']}")
    if result.get("reference_mops") is not None:
        print(f"reference: {result['reference_mops']:.1f} Mops/s (a fixed pure-Python workload, measured around "
              "each row; ref_Mops/s is the row's own)")
    compiled = sorted({row["core_module"] for row in result["regimes"].values()
                       if not row.get("skipped") and not row.get("core_module", ".py").endswith(".py")})
    if compiled:  # a build first on PYTHONPATH (docs/compiled-core.md): say so, these rows are not the pure core's
        print(f"core: compiled, from {', '.join(str(Path(module).parent) for module in compiled)}")
    for line in skipped:
        print(line)
    for name, row in result["regimes"].items():
        if row.get("skipped"):
            continue
        print(f"\n{name}:")
        if "summary" in row:
            print(_summary_table(row["summary"]))
        else:  # the steady-state search: its probes and answers
            print(f"{row['probes']} probes ({row['overloaded_probes']} overloaded), seeds {row['seeds']}")
            print(format_table(["point", "capacity_rps"], [[k, v] for k, v in row["answers"].items()]))


def _summary_table(summary: dict) -> str:
    keys = ("completed", "request_throughput", "output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
            "p99_itl_ms", "kv_usage_mean", "kv_usage_peak", "num_preemptions")
    return format_table(list(keys), [[summary[k] for k in keys]])


def _bench_serve(args: argparse.Namespace) -> int:
    import sys

    from kvplan.bench import serve

    engine_args = _serve_arguments(args.model, args.engine_args)
    levels = (*(c for c in serve.LEVELS if c < args.max_concurrency), args.max_concurrency)
    print(f"bench serve: starting kvplan serve --model {args.model} (it must answer /health within "
          f"{args.timeout:g} s)", file=sys.stderr)
    result = serve.run(args.model, hold_s=args.hold, levels=levels, ramp_s=args.ramp,
                       prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens, seed=args.seed,
                       engine_args=engine_args, timeout_s=args.timeout)
    _report(args, result, _show_serve)
    return 0 if result["ok"] else 1


def _show_serve(result: dict) -> None:
    keys = ("concurrency", "requests", "failed", "wall_s", "requests_per_s", "output_tokens_per_s", "p50_ttft_ms",
            "p99_ttft_ms")
    print(f"kvplan serve {result['model']}: prompts {result['prompt_tokens']} tokens, outputs "
          f"{result['output_tokens']}, {result['num_kv_blocks']} KV blocks\n\nramp (closed loop):")
    print(format_table(list(keys), [[r[k] for k in keys] for r in result["ramp"]]))
    print(f"\nheld at the saturation point ({result['saturation_concurrency']} in flight) for "
          f"{result['hold']['wall_s']:.1f} s (target {result['hold_target_s']:g} s):")
    print(format_table(list(keys), [[result["hold"][k] for k in keys]]))
    verdict = "ok" if result["ok"] else "FAILED"
    print(f"\n{verdict}: {result['failed']} failed, {result['requests_counted_by_server']:.0f} of "
          f"{result['requests_sent']} requests counted by the server, {result['leaked_blocks']} leaked KV blocks, "
          f"{result['left_running']:.0f} running / {result['left_waiting']:.0f} waiting afterwards")


def _bench_kernels(args: argparse.Namespace) -> int:
    import torch  # imported here: the CLI must start without torch

    if not torch.cuda.is_available():
        reason = "no CUDA GPU: the kernel benchmark measures GPU HBM bandwidth, so nothing was measured"
        return _report(args, {"skipped": True, "reason": reason}, lambda r: print(f"kvplan bench kernels: {reason}"))
    from kvplan.bench import kernels

    result = kernels.run(torch.device("cuda"), peak_override=args.peak_gbps)
    write_atomic(args.csv, kernels.to_csv(result))
    result["csv"] = str(args.csv)
    return _report(args, result, _show_kernels)


def _show_kernels(result: dict) -> None:
    print(f"{result['device']} ({result['num_sms']} SMs), peak HBM {result['peak_gbps']} GB/s "
          f"({result['peak_source']}); grid written to {result['csv']}\n")
    print(format_table(
        ["kind", "batch", "context", "block", "splits", "ms", "sdpa_ms", "GB/s", "of_peak", "vs_sdpa",
         "TFLOP/s", "max_diff"],
        [[r["kind"], r["batch"], r["context"], r["block_size"], r["num_splits"], r["kernel_ms"], r["sdpa_ms"],
          r["gbps"], r["frac_peak"] if r["frac_peak"] is not None else "-", r["vs_sdpa"], r["tflops"],
          r["max_abs_diff"]] for r in result["rows"]]))
    t = result["target"]
    if t["measured"]:
        print(f"\nTarget (decode, batch {t['batch']}, context {t['context']}, block {t['block_size']}): "
              f"{t['frac_peak'] or 0:.1%} of peak (goal >= {t['min_frac_peak']:.0%}: "
              f"{'met' if t['frac_peak_ok'] else 'not met'}), {t['vs_sdpa']:.2f}x SDPA time "
              f"(goal <= {t['max_vs_sdpa']}x: {'met' if t['vs_sdpa_ok'] else 'not met'})")


def _serve_arguments(model: str, text: str) -> list[str]:
    """--engine-args split as a shell would and parsed by `kvplan serve`'s own parser here: a bad option is one
    line now, not a server that exits during start-up (a RuntimeError with its log)."""
    import io
    import shlex
    from contextlib import redirect_stderr

    from kvplan.cli import build_parser

    try:
        words = shlex.split(text)
    except ValueError as exc:  # No closing quotation
        raise UserError(f"--engine-args: {short(text)}: {str(exc).lower()}; allowed: options of `kvplan serve` as "
                        "a shell would split them") from None
    captured = io.StringIO()
    try:
        with redirect_stderr(captured):
            _, unknown = build_parser().parse_known_args(["serve", "--model", model or "x", *words])
    except SystemExit:
        why = captured.getvalue().strip().removeprefix("kvplan serve: error: ")
        raise UserError(f"--engine-args: {why}") from None
    if unknown:
        raise UserError(f"--engine-args: unrecognized {' '.join(short(w, 40) for w in unknown[:3])}; allowed: the "
                        "options `kvplan serve --help` lists")
    return words


def _bench_beam(args: argparse.Namespace) -> int:
    from kvplan.bench import beam
    from kvplan.commands.eval_ppl import read_text

    text = args.text or beam.DEFAULT_TEXT
    read_text(text)  # not UTF-8 or empty: one clear line before any model loads
    result = beam.run(args.model, text, args.requests, args.seed, args.block_size)
    return _report(args, result, _show_beam)


def _show_beam(result: dict) -> None:
    print(f"{result['requests']} requests, prompts {result['mean_prompt_tokens']:.1f} tokens, outputs "
          f"{result['mean_output_tokens']:.1f} tokens (mean), {result['model']}, block size {result['block_size']}\n")
    rows = [[r["kind"], r["width"], r["memory_saving"], r["min_step_saving"], r["max_step_saving"],
             r["copy_on_write_copies"], r["steps"]] for r in result["results"].values()]
    print(format_table(["sharing", "width", "saving", "min_step", "max_step", "cow_copies", "steps"], rows))


def _bench_traces(args: argparse.Namespace) -> int:
    from kvplan.bench import traces

    result = traces.run(args.rows, args.seed)
    return _report(args, result, _show_traces)


def _show_traces(result: dict) -> None:
    print(f"{result['rows']} requests per file (seed {result['seed']}); budgets: load <= "
          f"{result['load_budget_s']:g} s, held <= {result['memory_budget_bytes'] / 1e9:g} GB; peak RSS: "
          f"{result['peak_rss_method']}\n")
    mb = 1e6
    print(format_table(
        ["file", "file_MB", "hash_ids", "seconds", "cpu_s", "rows/s", "vs_10s", "held_MB", "vs_1GB", "peak_MB",
         "vs_1GB"],
        [[name, r["file_bytes"] / mb, r["hash_ids"], r["seconds"], r["cpu_seconds"], round(r["rows_per_s"]),
          r["seconds_vs_budget"],
          r["memory_bytes"] / mb, r["memory_vs_budget"], r["peak_rss_increase_bytes"] / mb, r["peak_rss_vs_budget"]]
         for name, r in result["loads"].items()]))
