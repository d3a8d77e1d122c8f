"""`kvplan calibrate`: drive the live engine through a designed set of steps at each block size, fit the
calibrated cost model, and write a profile (YAML) with its measured KV capacity, fit quality and provenance,
plus a residual plot (PNG) beside it. With --from-replay DIR, fit what a black-box server allows instead: the
engine steps reconstructed from the token times of `kvplan replay --endpoint URL --out DIR` (no engine runs)."""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from kvplan.arg_types import BLOCK_SIZE, SEED, integer, number, out_path
from kvplan.engine_args import MODEL_DTYPES, parse_bytes
from kvplan.errors import UserError
from kvplan.output import check_out_file, check_paths, format_table, print_json, short, write_atomic

PHASE_NAMES = ("prefill", "decode", "mixed", "transfers")
# The live measurement's options (None on the command line means not given): --from-replay measures nothing.
LIVE_DEFAULTS = {"kv_cache_memory": 64 << 20, "phases": list(PHASE_NAMES), "repeats": 1, "temperature": 1.0,
                 "steps_out": None}


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser("calibrate", help="fit a cost profile from the live engine or an endpoint replay",
                          description=__doc__)
    p.add_argument("--model", required=True, help="smollm2-135m, llama-100m, tiny-llama or a local HF directory "
                                                  "(with --from-replay the model the profile is for: a built-in "
                                                  "model or an HF config.json, as simulate --model takes)")
    p.add_argument("--from-replay", type=Path, metavar="DIR", default=None,
                   help="fit from an endpoint replay's token times (kvplan replay --endpoint ... --out DIR)")
    p.add_argument("--block-sizes", type=BLOCK_SIZE, nargs="+", default=None,
                   help="default 8 16 32; with --from-replay one, when the server does not state it (else 16)")
    p.add_argument("--dtype", help="model dtype: bfloat16 (default), float16 or float32 (with --from-replay a label)")
    p.add_argument("--kv-cache-memory", type=parse_bytes,
                   help="KV cache size whose capacity in blocks the profile records (default 64MiB)")
    p.add_argument("--phases", nargs="+", choices=PHASE_NAMES, help="default: all")
    p.add_argument("--repeats", type=integer(1, 100), help="recorded passes over each phase (default 1)")
    p.add_argument("--temperature", type=number(low=0),
                   help="sampling temperature of the designed requests: as the traffic samples (0: greedy; "
                        "default 1)")
    p.add_argument("--device-name", help="the `device` the profile is for (default cpu-local; with --from-replay "
                                         "the endpoint)")
    p.add_argument("--max-lora-rank", type=integer(1, 512), default=None,
                   help="also measure the live engine's LoRA cost at this adapter rank (profile's `lora` section)")
    p.add_argument("--max-loras", type=integer(1, 64), default=None,
                   help="with --max-lora-rank: adapters measured at once, 1..N active per step (default 4)")
    p.add_argument("--speculative-config", metavar="JSON", default=None,
                   help="also measure draft acceptance with this config (profile's `speculative` section)")
    p.add_argument("--acceptance-corpus", type=Path, metavar="FILE", default=None,
                   help="with --speculative-config: UTF-8 text whose paragraphs (blank-line separated) are prompts")
    p.add_argument("--acceptance-max-tokens", type=integer(1, 512), default=None,
                   help="with --speculative-config: tokens generated per corpus prompt (default 64)")
    p.add_argument("--profile", type=Path, metavar="BASE", default=None,
                   help="add the measured section(s) to this profile, keeping its fit (no main calibration)")
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--out", type=out_path, required=True, help="profile YAML (the plot goes beside it as .png)")
    p.add_argument("--steps-out", type=out_path, default=None, help="also keep every recorded step (JSONL)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    check_outputs(args)
    check_sections(args)
    if args.from_replay is not None:
        return run_from_replay(args)
    for key, default in LIVE_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, default)
    if args.profile is not None:
        return run_sections(args)
    args.block_sizes = args.block_sizes or [8, 16, 32]
    args.dtype = args.dtype or "bfloat16"
    if args.dtype not in MODEL_DTYPES:  # a label only with --from-replay; here the engine runs it
        raise UserError(f"argument --dtype: {short(args.dtype)}; allowed: {', '.join(MODEL_DTYPES)}")
    args.device_name = args.device_name or "cpu-local"
    if args.repeats < 1:
        raise UserError(f"--repeats: must be >= 1, got {args.repeats}")
    if not 0.0 <= args.temperature < float("inf"):
        raise UserError(f"--temperature: must be a finite number >= 0, got {args.temperature}")
    if any(b < 1 for b in args.block_sizes):
        raise UserError(f"--block-sizes: each must be >= 1, got {args.block_sizes}")
    from kvplan.calibration.fitting import calibrate_steps, residual_plot
    from kvplan.sim.cost.calibrated import save_profile
    from kvplan.sim.cost.recorded import read_step_profile

    primary = 16 if 16 in args.block_sizes else args.block_sizes[0]
    steps, capacity, meta = [], None, {}
    with tempfile.TemporaryDirectory() as tmp:
        for block_size in args.block_sizes:
            for kind, phases in (("main", [p for p in args.phases if p != "transfers"]),
                                 ("transfers", [p for p in args.phases if p == "transfers"])):
                if not phases:
                    continue
                path = Path(tmp) / f"block{block_size}-{kind}.jsonl"
                blocks, meta = measure(args, block_size, tuple(phases), path, transfers=kind == "transfers")
                if kind == "main" and block_size == primary:
                    capacity = blocks
                steps += read_step_profile(path)[1]
                print(f"  block {block_size} {kind}: {len(steps)} steps so far", file=sys.stderr)
            if args.steps_out is not None:
                write_atomic(args.steps_out, "".join(p.read_text() for p in sorted(Path(tmp).glob("*.jsonl"))))
    cal = calibrate_steps(steps, primary, args.seed)
    cost = cal.cost
    cost.kv_capacity_blocks = capacity
    cost.meta["fit"]["temperature"] = args.temperature
    cost.meta.update({"model": args.model, "device": args.device_name, "dtype": args.dtype, "block_size": primary,
                      "block_sizes": list(args.block_sizes), "provenance": provenance(meta, args)})
    measured_sections(args, cost)
    save_profile(cost, args.out, f"kvplan calibrate profile: {args.model} on {args.device_name}\n"
                 "Regenerate with the command under provenance.command.")
    write_atomic(plot_path(args.out), residual_plot(cal, f"{args.model} ({args.dtype}) on "
                                                                   f"{args.device_name}"))
    table = cal.residual_table()
    if args.json:
        print_json({**cost.to_dict(), "residuals": [dict(zip(HEADERS, row, strict=True)) for row in table]})
        return 0
    print(f"{args.out}: {len(steps)} steps at block sizes {args.block_sizes}; KV capacity {capacity} blocks of "
          f"{primary}")
    print(json.dumps(cost.meta["fit"]))
    print(format_table(HEADERS, table))
    print("coefficients (s): " + ", ".join(f"{k}={v:.3g}" for k, v in cost.coefficients.items()))
    return 0


def check_sections(args: argparse.Namespace) -> None:
    """The measured sections' options: each with the flag that turns its measurement on, none from a replay."""
    needs = {"max_loras": "max_lora_rank", "acceptance_corpus": "speculative_config",
             "acceptance_max_tokens": "speculative_config", "speculative_config": "acceptance_corpus"}
    for key, needed in needs.items():
        if getattr(args, key) is not None and getattr(args, needed) is None:
            raise UserError(f"--{key.replace('_', '-')}: allowed: with --{needed.replace('_', '-')}")
    if args.max_lora_rank is not None:  # before any work: a rank the engine (vLLM) serves
        from kvplan.engine.core.lora import check_max_lora_rank

        check_max_lora_rank(args.max_lora_rank)
    sections = [k for k in ("max_lora_rank", "speculative_config") if getattr(args, k) is not None]
    if args.profile is not None and not sections:
        raise UserError("--profile: adds a measured section; allowed: with --max-lora-rank or --speculative-config")
    if args.from_replay is not None and sections:
        raise UserError(f"--{sections[0].replace('_', '-')}: measures the live engine; allowed: without "
                         "--from-replay")


def measured_sections(args: argparse.Namespace, cost) -> None:
    """The optional measured sections: LoRA cost (--max-lora-rank) and draft acceptance (--speculative-config)."""
    if args.speculative_config is not None:
        from kvplan.calibration.acceptance import measure_acceptance

        section, stats = measure_acceptance(args.model, args.speculative_config, args.acceptance_corpus,
                                            dtype=args.dtype, seed=args.seed, temperature=args.temperature,
                                            max_tokens=args.acceptance_max_tokens or 64)
        cost.meta["speculative"] = section
        rate, length = stats["acceptance_rate"], stats["mean_acceptance_length"]
        print(f"draft acceptance ({section['method']}, k={section['num_speculative_tokens']}): rate {rate:.3f}, "
              f"mean acceptance length {length:.3f} over {stats['num_drafts']} verifications", file=sys.stderr)
    if args.max_lora_rank is None:
        return
    from kvplan.calibration.lora import measure_lora

    with tempfile.TemporaryDirectory() as tmp:
        fit = measure_lora(args.model, args.max_lora_rank, args.max_loras or 4, cost, dtype=args.dtype,
                           block_size=int(cost.meta.get("block_size") or 16), seed=args.seed,
                           temperature=args.temperature, repeats=args.repeats, work=Path(tmp))
    cost.meta["lora"] = fit.section()
    print(f"LoRA rank {fit.rank}: {fit.seconds_per_slot * 1e3:.3g} ms per active adapter + "
          f"{fit.seconds_per_row_rank * 1e6:.3g} us per adapter row x rank; " + json.dumps(fit.fit),
          file=sys.stderr)


def run_sections(args: argparse.Namespace) -> int:
    """--profile BASE: the base profile with the measured section(s) added; its fit and coefficients kept."""
    from kvplan.sim.cost.calibrated import load_profile, save_profile

    cost = load_profile(args.profile)
    if cost.meta.get("model") != args.model:
        raise UserError(f"--profile: {args.profile} is for model {short(cost.meta.get('model'))}; allowed: a profile "
                         f"of --model {args.model}")
    args.dtype = args.dtype or str(cost.meta.get("dtype") or "bfloat16")
    measured_sections(args, cost)
    command = " ".join(["kvplan calibrate", *sys.argv[2:]]) if sys.argv[1:2] == ["calibrate"] else \
        f"kvplan calibrate --model {args.model} --profile {args.profile} --max-lora-rank {args.max_lora_rank}"
    cost.meta["provenance"] = {**cost.meta.get("provenance", {}), "sections_command": command}
    from kvplan.sim.cost.calibrated import SIGNATURE

    # the base's own header kind: only a profile calibrate wrote whole keeps the signature (its completeness check)
    signed = args.profile.read_bytes().startswith(SIGNATURE)
    save_profile(cost, args.out, (f"kvplan calibrate profile: {args.model} on {cost.meta.get('device')}\n"
                                  if signed else f"{args.profile.name} with measured sections\n") +
                 "Regenerate with the command under provenance.command (provenance.sections_command adds the "
                 "measured sections).")
    if args.json:
        print_json(cost.to_dict())
    else:
        print(f"{args.out}: {args.profile} with " + ", ".join(k for k in ("lora", "speculative") if k in cost.meta))
    return 0


def plot_path(out: Path) -> Path:
    """The residual plot beside the profile."""
    return out.with_suffix(".png")


def check_outputs(args: argparse.Namespace) -> None:
    """Before any work: the profile, its plot and --steps-out are writable files, apart from each other and from
    the replay being read (a profile named prof.png would be overwritten by its own plot)."""
    check_out_file(args.out)
    plot = plot_path(args.out)
    if plot == args.out:
        raise UserError(f"--out: {args.out}: the residual plot is written beside the profile as {plot.name}, the same "
                         "file; allowed: a profile path not ending in .png (e.g. profile.yaml)")
    check_out_file(plot, "--out (its plot)")
    if args.steps_out is not None:
        check_out_file(args.steps_out, "--steps-out")
    check_paths({"--from-replay": args.from_replay},
                {"--out": args.out, "--out (its plot)": plot, "--steps-out": args.steps_out})


HEADERS = ("steps", "count", "median_abs_err_%", "p90_abs_err_%", "bias_%", "mean_ms")


def run_from_replay(args: argparse.Namespace) -> int:
    """Fit a profile from an endpoint replay's directory: no engine, no torch."""
    from kvplan.calibration.fitting import residual_plot
    from kvplan.calibration.from_replay import calibrate_from_replay
    from kvplan.sim.cost.calibrated import save_profile

    live = [key for key in LIVE_DEFAULTS if getattr(args, key) is not None]
    if live:
        raise UserError(f"--{live[0].replace('_', '-')}: an option of the live measurement; allowed: without "
                         "--from-replay")
    if args.block_sizes is not None and len(args.block_sizes) > 1:
        raise UserError(f"--block-sizes: one with --from-replay (the server's), got {args.block_sizes}")
    from kvplan.sim.specs.models import get_model

    get_model(args.model)  # the profile prices this model (simulate --profile compares shapes): a known one
    result = calibrate_from_replay(args.from_replay, (args.block_sizes or [None])[0], args.seed)
    cal = result.calibration
    cost = cal.cost
    device = args.device_name or f"endpoint {result.url or args.from_replay}"
    # the drift probe's time at calibration (validate --endpoint divides by it): a fact of the conditions the
    # profile was measured under, so in its provenance
    reference = _probe_seconds(args.from_replay / "probe.json")
    cost.meta.update({"model": args.model, "device": device, **({"dtype": args.dtype} if args.dtype else {}),
                      "provenance": {**provenance(None, args), "endpoint_probe_s": reference,
                                     "source": f"endpoint replay {args.from_replay} (url {result.url})"}})
    save_profile(cost, args.out, f"kvplan calibrate profile: {args.model} on {device}, fitted from the token "
                 f"times of a replay\nRegenerate with the command under provenance.command.")
    write_atomic(plot_path(args.out), residual_plot(cal, f"{args.model} via {device}"))
    table = cal.residual_table()
    if args.json:
        print_json({**cost.to_dict(), "residuals": [dict(zip(HEADERS, row, strict=True)) for row in table]})
        return 0
    fit = cost.meta["fit"]
    print(f"{args.out}: {fit['steps']} busy steps of {result.clusters} token clusters in {args.from_replay}; KV "
          f"capacity {cost.kv_capacity_blocks or 'unknown'} blocks of {cost.meta['block_size']}")
    print(json.dumps({k: v for k, v in fit.items() if k != "unidentified"}))
    print(format_table(HEADERS, table))
    print("coefficients (s): " + ", ".join(f"{k}={v:.3g}" for k, v in cost.coefficients.items()))
    print(f"drift probe at calibration: {reference:.3f} s" if reference is not None else
          "drift probe at calibration: none (replay --endpoint --drift-probe records one)")
    for note in fit.get("warnings", []):
        print(f"warning: {note}")
    print("unidentified (fixed at 0):\n" + "\n".join(f"  {k}: {v}" for k, v in fit["unidentified"].items()))
    return 0


def _probe_seconds(path: Path) -> float | None:
    """The replay's drift-probe seconds (probe.json of `replay --endpoint --drift-probe`), None without one."""
    if not path.is_file():
        return None
    from kvplan.strict_json import loads

    try:
        seconds = loads(path.read_text(errors="replace")).get("seconds")
    except (ValueError, AttributeError) as exc:
        raise UserError(f"{path}: not a drift probe ({exc}); allowed: the probe.json `replay --endpoint "
                         "--drift-probe` writes") from None
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise UserError(f"{path}: seconds {short(seconds)}; allowed: a positive number or null")
    return float(seconds)


def measure(args: argparse.Namespace, block_size: int, phases: tuple[str, ...], path: Path, *,
            transfers: bool) -> tuple[int, dict]:
    """Run the phases on a fresh engine; returns its KV blocks and profile meta. The transfer phases run on a
    small pool under swap preemption, so that they actually swap."""
    from kvplan.calibration.design import SWAP_POOL_TOKENS, run_phases
    from kvplan.engine.llm import LLM
    from kvplan.engine.profiler import StepProfiler

    # The designed requests are at most ~600 tokens: a shorter max_model_len lets a small KV budget hold one.
    extra = dict(preemption_mode="swap", num_blocks=-(-SWAP_POOL_TOKENS // block_size),
                 max_model_len=256) if transfers else dict(kv_cache_memory=args.kv_cache_memory, max_model_len=1024)
    llm = LLM(args.model, block_size=block_size, dtype=args.dtype, max_num_batched_tokens=512, seed=args.seed,
              **extra)
    profiler = StepProfiler(path, llm.profile_meta)
    try:
        run_phases(llm, phases, profiler, args.repeats, args.seed, args.temperature)
    except BaseException:
        profiler.discard()
        raise
    profiler.close()
    return llm.num_kv_blocks, llm.profile_meta


def provenance(meta: dict | None, args: argparse.Namespace) -> dict:
    """Where and how the profile was made; `meta` is the live engine's (None: fitted from a replay, where the
    machine measured is the server's and this one only fitted, so no versions or CPU of this machine)."""
    doc: dict = {"machine": platform.node()}
    if args.from_replay is not None:
        command = f"kvplan calibrate --from-replay {args.from_replay} --model {args.model} --out {args.out}"
    else:
        import torch
        import transformers

        doc.update({"cpu": _cpu_model(), "platform": platform.platform(), "python": platform.python_version(),
                    "torch": str(torch.__version__), "transformers": str(transformers.__version__),
                    "threads": meta.get("threads")})
        command = f"kvplan calibrate --model {args.model} --block-sizes {' '.join(map(str, args.block_sizes))}"
    return {**doc, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "git_revision": _git_revision(),
            "command": " ".join(["kvplan calibrate", *sys.argv[2:]]) if sys.argv[1:2] == ["calibrate"] else command}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_revision() -> str | None:
    """HEAD, with '+dirty' when the working tree has uncommitted changes (the code measured is not HEAD's)."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=here)
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True, timeout=5, cwd=here)
    except (OSError, subprocess.SubprocessError):
        return None
    revision = head.stdout.strip()
    return (revision + ("+dirty" if status.stdout.strip() else "")) if revision else None
