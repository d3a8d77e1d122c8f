"""`kvplan validate --from-results FILE`: a benchmark tool's own result file as the measurement. The file's
workload (kvplan.measured.simulate) is simulated on the given hardware and each figure the file states is printed
beside the simulator's, with the error and the model error statement (`sim.gpu.model_error`, as `kvplan simulate`
prints it). Every fact the file lacks comes from a flag (--hardware, --tensor-parallel-size, --block-size, ...) or
is the simulator's default, printed as GUESSED. A file's model name is mapped to a built-in model
(`measured.simulate.builtin_model`); --model overrides it, and is needed when it maps to none."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvplan.errors import UserError
from kvplan.measured.formats import FORMATS

# Facts a simulation rests on that a user should know were not measured: listed as GUESSED when neither the file
# nor a flag gave them. (The rest of the settings are vLLM's defaults too, and `--explain`-style detail.)
KEY_SETTINGS = ("vllm_version", "tensor_parallel_size", "pipeline_parallel_size", "block_size",
                "gpu_memory_utilization", "kv_cache_dtype", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                "enable_prefix_caching", "enable_chunked_prefill", "entry_point")
DEFAULT_HARDWARE = "h100-sxm"  # `kvplan simulate`'s default
WIDTH = 100  # terminal lines


def add_results_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of the --from-results mode; `validate` has the shared serving settings already (engine flags)."""
    from kvplan.arg_types import REPLICAS
    from kvplan.engine.core.settings import for_side
    from kvplan.settings_cli import add_setting_flags

    g = p.add_argument_group("--from-results: a benchmark tool's result file as the measurement")
    g.add_argument("--from-results", metavar="FILE", default=None,
                   help="a result file of vllm bench serve (--save-result), GuideLLM, AIPerf or inference-perf: "
                        "simulate its workload and compare (no live run; --trace, --configs and --endpoint do "
                        "not apply)")
    g.add_argument("--format", choices=list(FORMATS), default=None,
                   help="--from-results: the file's format (default: detected)")
    g.add_argument("--hardware", default=None,
                   help=f"--from-results: the GPU the file was measured on (default: {DEFAULT_HARDWARE}, guessed), "
                        "or cpu-local")
    g.add_argument("--cost", default="analytic", help="--from-results: cost model (as `kvplan simulate --cost`)")
    g.add_argument("--gpu-profile", default=None, metavar="DIR",
                   help="--from-results: a Vidur-format per-op profile of --hardware (as `kvplan simulate`)")
    g.add_argument("--replicas", type=REPLICAS, default=1,
                   help="--from-results: the replicas the measured endpoint balanced over (default 1)")
    g.add_argument("--router", default="round_robin", help="--from-results: how requests were spread over "
                   "--replicas: round_robin, least_outstanding, least_kv_usage or prefix_aware")
    have = {a.dest for a in p._actions}
    add_setting_flags(g, "sim", names=[s.name for s in for_side("sim") if s.name not in have])


def check_mode(args: argparse.Namespace, live_only: list[tuple[str, str, object]]) -> None:
    """--from-results runs no live engine: a live run's flag beside it is refused, named as typed."""
    from kvplan.engine.core.settings import SETTINGS
    from kvplan.settings_cli import given_flags

    for dest, flag, default in live_only:
        if getattr(args, dest, default) != default:
            raise UserError(f"{flag}: belongs to a live validation, not --from-results; allowed: --from-results "
                            "FILE with simulator flags, or a live run without --from-results")
    for name, typed in given_flags(args).items():
        if "sim" not in SETTINGS[name].sides:
            raise UserError(f"{typed}: configures the live engine only, not the simulator; allowed with "
                            "--from-results: the simulator's settings (`kvplan simulate --help`)")


def resolve_model(args: argparse.Namespace, run) -> tuple[str, str | None]:
    """(the model the simulator prices, a GUESSED line or None)."""
    from kvplan.measured.simulate import builtin_model
    from kvplan.sim.specs.models import MODELS

    if args.model is not None:
        return args.model, None
    found = builtin_model(run.model)
    if found is None:
        named = f"model {run.model!r} is no built-in model" if run.model else "no model recorded"
        raise UserError(f"{run.source}: {named}; allowed: --model NAME (a built-in: {', '.join(sorted(MODELS)[:6])}"
                        ", ...) or a path to its HF config.json")
    return found, None if found == run.model else f"model {found} for the file's {run.model!r} (--model)"


def build_spec(args: argparse.Namespace, run, model: str):
    """(the SimSpec, the KEY_SETTINGS it took as the simulator's default): a flag, else the file's recorded
    setting, else the default."""
    from kvplan.engine.core.settings import for_side
    from kvplan.settings_cli import check_flag_needs, given_flags
    from kvplan.sim.spec import SimSpec

    given = given_flags(args)
    settings, defaulted = {}, []
    for s in for_side("sim"):
        if s.name in given:
            settings[s.name] = getattr(args, s.name)
        elif s.name in run.settings:
            settings[s.name] = run.settings[s.name]
        else:
            settings[s.name] = s.default_on("sim")
            defaulted += [s.name] if s.name in KEY_SETTINGS else []
    if "enable_prefix_caching" not in given and "enable_prefix_caching" not in run.settings:
        settings["enable_prefix_caching"] = settings["allocator"] == "paged"  # as `kvplan simulate`
    check_flag_needs(args, settings)
    try:
        spec = SimSpec(model=model, hardware=args.hardware or DEFAULT_HARDWARE, cost=args.cost,
                       profile=args.profile, gpu_profile=args.gpu_profile, replicas=args.replicas,
                       router=args.router, **settings)
    except UserError as exc:
        raise UserError(f"{run.source}: a recorded setting: {exc}") from None
    return spec, defaulted


def guessed_lines(args: argparse.Namespace, spec, defaulted: list[str], info: dict) -> list[str]:
    """What the simulation assumed, one item each, with the value it took (`info`: the simulation's, where a
    setting left unset was derived: max_model_len, the batch limits)."""
    from kvplan.engine.core.settings import SETTINGS

    lines = [] if args.hardware is not None else [f"hardware {spec.hardware} (--hardware)"]
    for name in defaulted:
        value = info.get(name, getattr(spec, name))
        lines.append(f"{name} {value} ({SETTINGS[name].flag})")
    return lines


def run(args: argparse.Namespace, live_only: list[tuple[str, str, object]]) -> int:
    from kvplan.measured.compare import compare
    from kvplan.measured.load import read_runs
    from kvplan.measured.simulate import simulate_workload, workload
    from kvplan.output import atomic_dir, check_out_dir, check_paths, json_text, print_json
    from kvplan.sim.gpu.model_error import model_error_for

    check_mode(args, live_only)
    if args.out is not None:
        check_out_dir(args.out)
        check_paths({"--from-results": args.from_results, "--profile": args.profile,
                     "--gpu-profile": args.gpu_profile}, {"--out": args.out})
    fmt, runs = read_runs(args.from_results, args.format)
    entries, results = [], []
    for index, measured_run in enumerate(runs):
        model, model_note = resolve_model(args, measured_run)
        spec, defaulted = build_spec(args, measured_run, model)
        work = workload(measured_run, args.seed)
        result = simulate_workload(work, spec, args.seed)
        measured_run.guessed += [model_note] if model_note else []
        measured_run.guessed += guessed_lines(args, spec, defaulted, result.info)
        results.append(result)
        rows = compare(measured_run, result)
        error = model_error_for(spec)
        entries.append({
            "run": measured_run.run_label or f"run {index + 1}", "tool": measured_run.tool,
            "model": {"file": measured_run.model, "simulated": model}, "hardware": spec.hardware,
            "replicas": spec.replicas,
            "vllm_version": getattr(spec, "vllm_version", None), "workload": work.how,
            "comparison": [r.to_json() for r in rows], "model_error": error.to_json(),
            "model_error_line": error.one_line(), "guessed": list(measured_run.guessed),
            "notes": list(measured_run.notes) + _rejections(result, len(work.trace)),
            "simulated": {"completed": result.summary["completed"], "duration_s": result.summary["duration_s"],
                          "num_blocks": result.info["num_blocks"], "rejected": result.info["rejected"]},
            "_rows": rows})
    doc = {"source": str(args.from_results), "format": fmt, "seed": args.seed,
           "runs": [{k: v for k, v in e.items() if k != "_rows"} for e in entries]}
    if args.out is not None:
        from kvplan.results.serving_result import write_tables

        options = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
                   if k != "handler" and not k.startswith("_")}
        with atomic_dir(args.out, {"command": "validate --from-results", "options": options}) as tmp:
            (tmp / "comparison.json").write_text(json_text(doc))
            for index, result in enumerate(results):
                write_tables(result, tmp / f"run{index + 1}" if len(results) > 1 else tmp, "parquet")
    if args.json:
        print_json(doc)
    else:
        print(report_text(doc["source"], entries))
        if args.out is not None:
            print(f"\nwrote {args.out}: comparison.json and the simulation's per-request table and time series")
    return 0


def _rejections(result, total: int) -> list[str]:
    from kvplan.commands.simulate import rejection_notes

    return rejection_notes(result.info, total)


def report_text(source: str, entries: list[dict]) -> str:
    """The comparison as the terminal shows it: at most WIDTH columns a line."""
    import textwrap

    from kvplan.measured.compare import TABLE_HEADERS, table_rows
    from kvplan.output import format_table

    def wrapped(text: str, indent: str = "") -> list[str]:
        return textwrap.wrap(text, WIDTH, subsequent_indent=indent + "  ", initial_indent=indent,
                             break_on_hyphens=False)

    lines: list[str] = []
    for entry in entries:
        head = f"{source}: {entry['tool']}" + (f", {entry['run']}" if len(entries) > 1 else "")
        model = entry["model"]
        shown = model["simulated"] if model["file"] in (None, model["simulated"]) else \
            f"{model['file']} as {model['simulated']}"
        version = f" as vLLM {entry['vllm_version']}" if entry.get("vllm_version") else ""
        where = entry["hardware"] if entry["replicas"] == 1 else f"{entry['replicas']} x {entry['hardware']}"
        lines += [*wrapped(head), *wrapped(f"simulated: {shown} on {where}{version}"),
                  *wrapped(f"workload: {entry['workload']}"), ""]
        lines += format_table(TABLE_HEADERS, table_rows(entry["_rows"])).splitlines()
        lines += ["", "latencies in ms; error = (simulated - measured) / measured", ""]
        lines += wrapped(entry["model_error_line"])
        if entry["guessed"]:
            lines += wrapped("GUESSED (not in the file, no flag): " + "; ".join(entry["guessed"]))
        lines += [w for note in entry["notes"] for w in wrapped(f"note: {note}")]
        lines.append("")
    return "\n".join(lines).rstrip()
