"""`kvplan trace stats|convert|synth|samples`: inspect, convert and generate request traces; list the bundled
samples."""

from __future__ import annotations

import argparse

from kvplan.arg_types import BLOCK_SIZE, FRACTION, POSITIVE, SECONDS, SEED, integer
from kvplan.limits import MAX_TOKENS
from kvplan.output import check_out_file, check_paths, format_table, print_json, write_atomic
from kvplan.trace_options import add_load_options, load_trace, retime_spec
from kvplan.traces.io import KINDS


def register(verbs: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser("trace", help="inspect, convert and generate request traces",
                              description=__doc__)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, summary, description, adders, handler in (
        ("stats", "summary statistics of a trace",
         "Request count, duration, rate, inter-arrival CV, prompt and output length percentiles, and the "
         "infinite-cache prefix reuse when the trace carries prefix hashes.", (_load_arguments,), _stats),
        ("convert", "any format to our JSONL / CSV / Parquet, with transforms",
         "Load a trace, apply the chosen transforms in the order listed below, and write it in our lossless "
         "interchange format.", (_load_arguments, _out_argument, _kind_argument, _transform_arguments),
         _convert),
        ("synth", "generate a synthetic trace from a YAML spec",
         "Generate a trace from SPEC.yaml (see traces/samples/*.yaml). Without --out, print its statistics "
         "only.", (_spec_arguments, _kind_argument), _synth),
        ("samples", "list the bundled sample traces and where they are installed",
         "The small project-made sample traces that ship with kvplan (each generated from the YAML spec beside "
         "it), with their paths: pass one as --trace.", (), _samples),
    ):
        action = actions.add_parser(name, help=summary, description=description)
        for add in adders:
            add(action)
        action.add_argument("--json", action="store_true", help="print one JSON object")
        action.set_defaults(handler=handler)


def _spec_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="YAML workload spec")
    parser.add_argument("-o", "--out", help="write the trace here (.jsonl, .csv or .parquet)")


def _out_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", help="output file (.jsonl, .csv or .parquet)")


def _kind_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--to", choices=KINDS, help="output format (default: from the extension)")


def _load_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="trace file, plain or gzip/bz2/xz/zstd-compressed")
    add_load_options(parser)


def _transform_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("transforms (applied in this order)")
    group.add_argument("--window", nargs=2, type=SECONDS, metavar=("START_S", "END_S"),
                       help="keep arrivals in [START_S, END_S), re-based to 0")
    group.add_argument("--sample", type=FRACTION, metavar="FRACTION", help="keep a random fraction of requests")
    group.add_argument("--rate-scale", type=POSITIVE, metavar="FACTOR",
                       help="multiply the request rate (> 1 compresses time, < 1 stretches it)")
    group.add_argument("--retime", metavar="YAML",
                       help="new arrivals keeping lengths, e.g. '{process: gamma, rate: 4, cv: 2}'")
    group.add_argument("--jitter", type=POSITIVE, metavar="QUANTUM_S",
                       help="spread timestamps quantized to QUANTUM_S (Mooncake: 3)")
    group.add_argument("--clip-context", type=integer(2, MAX_TOKENS), metavar="TOKENS",
                       help="fit requests in a model's context")
    group.add_argument("--expand-block", type=BLOCK_SIZE, metavar="BLOCK",
                       help="re-express prefix hashes at this block size (must divide the granularity)")
    group.add_argument("--seed", type=SEED, default=0,
                       help="seed for --sample, --retime and --jitter (default 0)")


def _load(args: argparse.Namespace):  # -> traces.Trace
    return load_trace(args.path, args)


def _transform(trace, args: argparse.Namespace):  # (Trace, args) -> Trace
    from kvplan.traces.transforms import apply_transforms

    steps = {"window": args.window, "sample": args.sample, "rate_scale": args.rate_scale,
             "retime": retime_spec(args), "jitter": args.jitter,
             "clip_context": args.clip_context, "expand_block": args.expand_block}
    return apply_transforms(trace, steps, args.seed)


def _write(trace, out: str, kind: str | None) -> str:
    from kvplan.traces.io import kind_of, render

    kind = kind_of(out, kind)
    write_atomic(out, render(trace, kind))
    return kind


def _stats(args: argparse.Namespace) -> int:
    from kvplan.traces.stats import summarize

    _show(summarize(_load(args)), args.json)
    return 0


def _convert(args: argparse.Namespace) -> int:
    from kvplan.traces.io import kind_of
    from kvplan.traces.stats import summarize

    check_out_file(args.out, "out")
    check_paths({"path": args.path}, {"out": args.out})
    kind_of(args.out, args.to)

    trace = _transform(_load(args), args)
    kind = _write(trace, args.out, args.to)
    _show(summarize(trace), args.json, {"written": args.out, "written_format": kind})
    return 0


def _synth(args: argparse.Namespace) -> int:
    from kvplan.traces.stats import summarize
    from kvplan.traces.synth import synthesize_file

    if args.out:
        check_out_file(args.out)
        check_paths({"spec": args.spec}, {"--out": args.out})
    trace = synthesize_file(args.spec)
    extra = {}
    if args.out:
        extra = {"written": args.out, "written_format": _write(trace, args.out, args.to)}
    _show(summarize(trace), args.json, extra)
    return 0


def _samples(args: argparse.Namespace) -> int:
    from kvplan import traces
    from kvplan.traces.samples import bundled_traces
    from kvplan.traces.stats import summarize

    rows = [{"name": name, "requests": summarize(traces.load(path))["requests"], "path": str(path)}
            for name, path in bundled_traces().items()]
    if args.json:
        print_json(rows)
    else:
        print(format_table(("name", "requests", "path"), [list(r.values()) for r in rows]))
    return 0


def _show(summary: dict, as_json: bool, extra: dict | None = None) -> None:
    summary = {**summary, **(extra or {})}
    if as_json:
        print_json(summary)
        return
    print(f"trace: {summary['source']} (format {summary['format']})")
    if "written" in summary:
        print(f"wrote: {summary['written']} ({summary['written_format']})")
    if summary["duration_s"] is None:
        timing = "no arrival times (length-only: re-time it with convert --retime)"
    else:
        rate, cv = _num(summary["mean_rate_rps"]), _num(summary["interarrival_cv"])
        timing = f"duration {summary['duration_s']:.1f} s, mean rate {rate} req/s, inter-arrival CV {cv}"
    print(f"requests: {summary['requests']}, {timing}")
    columns = ("mean", "p50", "p90", "p99", "max")
    print(format_table(["tokens", *columns],
                       [[name, *(_num(summary[f"{name}_tokens"][c], ".6g") for c in columns)]
                        for name in ("prompt", "output")]))
    prefix = summary["prefix"]
    if prefix:
        print(f"prefix reuse (infinite cache, {prefix['hash_granularity']}-token blocks): "
              f"{prefix['reuse_fraction']:.2%} of prompt tokens ({prefix['hit_tokens']} of "
              f"{prefix['prompt_tokens']}), {prefix['unique_blocks']} unique blocks")
    for line in summary["load_report"]:
        print(f"note: {line}")


def _num(value: float | None, spec: str = ".4g") -> str:
    return "n/a" if value is None else format(value, spec)
