"""`kvplan validate`: for each engine configuration, replay the trace live N times (the run-to-run noise band)
and simulate it; print live vs simulated percentiles with the error and the band, and the policy counters side by
side; write a markdown report, CDF overlays and every run's tables.

Modes: `policy` - the simulator is priced by each live run's own step durations, so every token time must match
exactly (the proof that the simulator's policy layer is the engine's); `timing` - the simulator uses a calibrated
profile (the error a user gets); `both` (default).

With --prefill-replicas 1 --decode-replicas 1 the live side is a prefill/decode pair - two engine processes, KV over
kvplan's loopback transport, this process as vLLM's proxy - and the simulator the P/D one: policy identity per
instance and of every request's TTFT parts, timing error with the parts (kvplan.commands.validate_pd).

With --endpoint URL the live runs are replays against an OpenAI-compatible server (`kvplan replay --endpoint`)
and the mode is timing: a black box shows no steps to price a policy check with. The server's kind is detected
(or --server) and the simulator takes the KV configuration it publishes (vLLM's cache_config_info, SGLang's
/get_server_info, TGI's /info, llama.cpp's /props: slots and context per slot), else --block-size, --num-blocks,
...; every check happens before the first request. Repeats are labelled cold or warm and the verdict uses cold
ones only; a drift probe around each repeat gives the speed factor against calibration
(kvplan.commands.validate_endpoint). --model names the model the simulator prices (and the `model` sent, unless
--served-model)."""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict
from itertools import pairwise
from pathlib import Path

import numpy as np

from kvplan.arg_types import integer, out_path
from kvplan.commands.replay import add_trace_arguments, load_trace
from kvplan.commands.validate_report import ADJUSTED, print_report, write_report
from kvplan.endpoint.session import add_endpoint_arguments, within_duration
from kvplan.engine_args import (
    add_engine_arguments,
    add_lora_modules,
    load_configs,
    lora_modules_from_args,
    options_from_args,
)
from kvplan.errors import UserError
from kvplan.output import atomic_dir, check_out_dir, check_paths
from kvplan.results.serving_result import write_tables

MODES = ("policy", "timing", "both")
RESULTS_DOC = ("no live run: the file's workload is simulated on --hardware and its figures printed beside the "
               "simulator's (kvplan.commands.validate_results).")
# The simulations a timing validation compares, beside the profile as calibrated: the profile scaled by a machine
# speed factor measured independently around the live runs (the speed probe), and by the speed the live runs'
# own steps show against the profile (an oracle for the machine's speed, not a prediction: what remains is
# the model's error): kvplan.commands.validate_report.ADJUSTED.


def register(verbs: argparse._SubParsersAction) -> None:
    from kvplan.commands.validate_results import add_results_arguments

    p = verbs.add_parser("validate", help="live runs vs the simulator: policy identity and timing error; or a "
                         "benchmark tool's result file vs the simulator (--from-results)",
                         description=__doc__ + "\n\nWith --from-results FILE: " + RESULTS_DOC)
    add_trace_arguments(p, model_required=False)  # both needed by a live run: checked in `run`
    shared = {a.dest for a in p._actions}
    add_engine_arguments(p)
    p.add_argument("--profile", default=None,
                   help="calibrated profile (default: the shipped cpu-local profile of --model, if any)")
    shared |= {a.dest for a in p._actions}
    add_lora_modules(p)  # the adapters a LoRA trace's rows name (live runs; the simulator prices max_lora_rank)
    p.add_argument("--configs", default=None, help="YAML list of named configurations overriding the options")
    p.add_argument("--repeats", type=integer(1, 100), default=2, help="live runs per configuration (the noise band)")
    p.add_argument("--mode", choices=MODES, default="both")
    p.add_argument("--no-speed-probe", dest="speed_probe", action="store_false",
                   help="timing: skip the speed probe around each live run (and the speed-adjusted comparison)")
    add_endpoint_arguments(p)
    from kvplan.sim.pd_spec import add_pd_flags

    add_pd_flags(p)  # a live prefill/decode pair (kvplan.commands.validate_pd)
    p.add_argument("--out", type=out_path, default=None,
                   help="result directory (replaced whole on success; required for a live run)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    for action in p._actions:
        if action.dest == "trace":
            action.required = False  # a live run's input: --from-results replaces it (checked in `run`)
    # What only a live run reads: refused beside --from-results, named as typed (the trace options, the live
    # runs' own and the endpoint's; the serving settings and --model/--seed/--profile/--out/--json are shared).
    live_only = [(a.dest, a.option_strings[0], a.default) for a in p._actions
                 if a.option_strings and a.dest not in shared | {"help", "out", "json"}]
    live_only += [(a.dest, a.option_strings[0], a.default) for a in p._actions
                  if a.dest in ("trace", "trace_format", "rate_scale", "temperature")]
    add_results_arguments(p)
    p.set_defaults(handler=run, _live_only=live_only)


def check_endpoint_args(args: argparse.Namespace) -> None:
    """--endpoint validates timing against one server: its configuration is the server's own."""
    if args.mode == "policy":
        raise UserError("--mode policy: needs the in-process engine's step profile; allowed with --endpoint: "
                         "--mode timing")
    if args.configs:
        raise UserError("--configs: an endpoint runs one configuration (the server's); allowed with --endpoint: "
                         "no --configs (validate each server separately)")
    args.mode = "timing"
    args.speed_probe = False  # the in-process probe measures this machine; the endpoint has its drift probe
    args.reset_prefix_cache = True  # every live run starts from a cold cache, as each simulation does


def resolve_profile(args: argparse.Namespace) -> str | None:
    if args.mode == "policy":
        return None
    if args.profile is not None:
        from kvplan.sim.cost.calibrated import load_profile
        from kvplan.sim.specs.profiles import profile_mismatch

        why = profile_mismatch(load_profile(args.profile).meta.get("model"), args.model)  # bad ones fail now
        if why:
            print(f"note: --profile {args.profile}: {why}", file=sys.stderr)
        return args.profile
    from kvplan.sim.specs.profiles import shipped_profile

    try:
        return str(shipped_profile(args.model))
    except ValueError as exc:
        raise UserError(f"--profile: needed for --mode {args.mode}: {exc}; or --mode policy") from None


def run(args: argparse.Namespace) -> int:
    if args.from_results is not None:
        from kvplan.commands.validate_results import run as run_from_results

        return run_from_results(args, args._live_only)
    for flag, value in (("--trace", args.trace), ("--model", args.model), ("--out", args.out)):
        if value is None:
            raise UserError(f"{flag}: required for a live validation; allowed: --model, --trace and --out, or "
                            "--from-results FILE (a benchmark tool's result file)")
    if args.repeats < 1:
        raise UserError(f"--repeats: must be >= 1, got {args.repeats}")
    check_out_dir(args.out)
    check_paths({"--trace": args.trace, "--profile": args.profile, "--configs": args.configs}, {"--out": args.out})
    from kvplan.sim.pd_spec import disaggregation_from_args

    pd = disaggregation_from_args(args)
    if pd is not None:
        from kvplan.commands.validate_pd import run_pd

        return run_pd(args, pd)
    if args.endpoint is not None:
        check_endpoint_args(args)
    profile = resolve_profile(args)
    trace = within_duration(load_trace(args), args.duration)
    base = options_from_args(args)
    configs = load_configs(args.configs, base) if args.configs else [("default", base)]
    plan = None
    if args.endpoint is not None:
        from kvplan.commands.validate_endpoint import endpoint_plan

        plan = endpoint_plan(args, trace, base, profile)  # every configuration check, before any request
    results = []
    with atomic_dir(args.out) as out:
        for name, options in configs:
            results.append(validate_config(args, trace, name, options, profile, out / name, plan))
        doc = {"trace": str(args.trace), "requests": len(trace), "model": args.model, "mode": args.mode,
               "profile": profile, "repeats": args.repeats, "duration_s": args.duration, "configs": results}
        stopped = [f"{r['name']}: {r['stopped']}" for r in results if r.get("stopped")]
        if stopped:
            doc["partial"] = stopped
        if args.mode != "policy":
            from kvplan.validation import MetricRow, target_summary

            for key, rows in (("targets", "timing"), *((t, k) for _, k, t, _, _ in ADJUSTED)):
                if results and all(rows in r for r in results):
                    doc[key] = target_summary({r["name"]: [MetricRow(**m) for m in r[rows]] for r in results})
        write_report(out, doc)
    print_report(doc, args.json, f"wrote {args.out}/report.md, validation.json, and per configuration: live runs, "
                 "simulations, cdf.png")
    if stopped:  # what was measured is printed and kept; the exit status says it is not the whole validation
        from kvplan.commands.validate_endpoint import PartialValidation

        raise PartialValidation(f"--endpoint: stopped early ({'; '.join(stopped)}); what was measured is in "
                                f"{args.out} (validation.json: partial)")
    return 0


def validate_config(args, trace, name: str, options, profile: str | None, out: Path, plan=None) -> dict:
    from kvplan.live import replay
    from kvplan.sim.cost.calibrated import load_profile
    from kvplan.validation import counters

    cost = load_profile(profile) if profile is not None and (args.speed_probe or plan is not None) else None
    probes, checks, meta, entry = [], [], {}, {"name": name}
    if plan is not None:
        from kvplan.commands.validate_endpoint import endpoint_repeats, frontend_entry, speed_entry

        options, meta = plan.options, plan.meta
        done = endpoint_repeats(args, trace, plan, out, name)
        lives, runs = done.lives, done.runs
        drift, probes = speed_entry(plan, done)
        entry.update({"server": plan.server.to_json(), "drift": drift, "frontend": frontend_entry(done)})
        if done.stopped:
            entry["stopped"] = done.stopped
    else:
        probes = [probe(args, options, cost, name)] if cost is not None else []
        lives, runs = [], []
        for r in range(args.repeats):
            print(f"  {name}: live run {r + 1}/{args.repeats}", file=sys.stderr)
            where = out / f"live-{r + 1}"
            live, meta = replay(args.model, trace, options, seed=args.seed, temperature=args.temperature,
                                steps_path=where / "steps.jsonl", lora_modules=lora_modules_from_args(args))
            write_tables(live, where, "parquet")
            lives.append(live)
            runs.append({"repeat": r + 1, "state": "cold", "why": "a fresh engine", "reset": None})
            if cost is not None:
                probes.append(probe(args, options, cost, name))
            if args.mode != "timing":
                checks.append(check_policy(trace, live, options, meta, where / "steps.jsonl"))
    entry.update({"options": asdict(options), "num_blocks": int(meta["num_blocks"]) if meta else None,
                  "runs": runs, "busy_fraction": [rounded(r.info["busy_fraction"]) for r in lives],
                  "live_counters": [counters(r) for r in lives],
                  "approximate_gap_requests": [r.info.get("approximate_gap_requests", 0) for r in lives]})
    if checks:
        entry["policy"] = [{"identical": c.identical, "sequences": c.sequences, "max_token_diff_s": c.max_token_diff_s,
                            "differences": c.differences, "live_counters": a, "sim_counters": b}
                           for c, a, b in checks]
    cold = [live for live, run in zip(lives, runs, strict=True) if run["state"] == "cold"]
    warm = [live for live, run in zip(lives, runs, strict=True) if run["state"] == "warm"]
    spec = measured_acceptance_config(options) if profile is not None and plan is None else None
    if profile is not None and spec is not None:
        profile, cost = with_measured_acceptance(profile, spec, out, len(lives), entry)
    sims = {}
    if profile is not None and cold:
        simulations = [("calibrated", "timing", profile)]
        if probes:
            # the in-run speed needs the profile's price of each recorded step: a LoRA run's records lack the
            # steps' adapter rows, so it has none
            in_run = plan is None and len(probes) > len(lives) and not options.enable_lora
            simulations += adjusted_profiles(entry, probes, runs, cost, profile, out, in_run=in_run)
        for label, key, path in simulations:
            sim = simulate_as(trace, options, meta, path)
            write_tables(sim, out / f"sim-{label}", "parquet")
            sims[label] = sim
            entry[key] = timing_entry(cold, sim)  # the verdict's rows: cold repeats only
        if warm:  # beside them, never in their band
            entry["timing_warm"] = timing_entry(warm, sims["calibrated"])
        entry["sim_counters"] = counters(sims["calibrated"])
    if lives:
        (out / "cdf.png").write_bytes(cdf_plot_of(lives, sims, f"{name}: {len(lives)} live run(s) vs simulation"))
    return entry


def measured_acceptance_config(options):  # -> SpeculativeConfig | None
    """The speculative config when speculative decoding is on with no acceptance given (the timing simulation then
    takes the one the live runs measured), else None."""
    from kvplan.engine.core.speculative import parse_speculative_config

    spec = parse_speculative_config(options.speculative_config, "--speculative-config")
    return spec if spec is not None and spec.acceptance is None and spec.acceptance_rate is None else None


def with_measured_acceptance(profile: str, spec, out: Path, repeats: int, entry: dict):
    """The profile with the live runs' draft acceptance (their verifications, all repeats) as its `speculative`
    section, written beside the runs; the section also goes in the report."""
    from kvplan.sim.cost.calibrated import load_profile, save_profile
    from kvplan.sim.cost.recorded import read_step_profile
    from kvplan.sim.spec_decode import acceptance_model, measured_section, verification_counts

    counts: dict[tuple[int, int], int] = {}
    for r in range(repeats):
        for key, n in verification_counts(read_step_profile(out / f"live-{r + 1}" / "steps.jsonl")[1]).items():
            counts[key] = counts.get(key, 0) + n
    cost = load_profile(profile)
    cost.meta["speculative"] = measured_section(spec.method, spec.num_speculative_tokens, counts,
                                                f"the {repeats} live run(s) of this validation")
    model = acceptance_model(spec.num_speculative_tokens, None, None, cost.meta["speculative"], spec.method)
    entry["acceptance"] = {"source": "measured by the live runs", "acceptance_rate": rounded(model.acceptance_rate),
                           "mean_acceptance_length": rounded(1 + model.mean_accepted),
                           "verifications": sum(counts.values())}
    path = out / "profile-acceptance.yaml"
    save_profile(cost, path, f"{profile}, with the draft acceptance the live runs measured")
    return str(path), cost


def rounded(value: float | None) -> float | None:
    """A report's figure to 3 places; None for none, or NaN (a server without a running gauge)."""
    return None if value is None or math.isnan(value) else round(value, 3)


def simulate_as(trace, options, meta: dict, profile: str):
    from kvplan.live import sample_interval, sim_spec
    from kvplan.sim.run import simulate

    return simulate(trace, sim_spec(options, meta, cost="calibrated", profile=profile,
                                    interval=sample_interval(trace)))


def cdf_plot_of(lives, sims, title: str) -> bytes:
    from kvplan.validation import cdf_plot

    return cdf_plot(lives, sims, title)


def adjusted_profiles(entry: dict, probes: list, runs: list, cost, profile: str, out: Path, *,
                      in_run: bool) -> list[tuple[str, str, str]]:
    """The profile scaled by the speed probe (each run at the mean of the probes either side of it; the
    simulation at the cold runs' mean) and, in-process, by the live runs' own step speed."""
    from kvplan.sim.cost.calibrated import save_profile

    factors = [(a.factor + b.factor) / 2 for a, b in pairwise(probes)]
    cold = [f for f, run in zip(factors, runs, strict=False) if run["state"] == "cold"] or factors
    speed = {"probe_factors": [round(p.factor, 4) for p in probes], "run_factors": [round(f, 4) for f in factors],
             "factor": float(np.mean(cold))}
    if in_run:
        in_runs = [in_run_factor(cost, out / f"live-{r + 1}" / "steps.jsonl") for r in range(len(runs))]
        speed.update({"in_run_factors": [round(f, 4) for f in in_runs], "in_run_factor": float(np.mean(in_runs))})
    entry["speed"] = speed
    out_list = []
    for (label, key, _, _, title), factor in zip(ADJUSTED, ("factor", "in_run_factor"), strict=True):
        if factor not in speed:
            continue
        adjusted = out / f"profile-{label}.yaml"
        save_profile(cost.scaled(speed[factor]), adjusted, f"{profile}, {title}: x{speed[factor]:.4f}")
        out_list.append((label, key, str(adjusted)))
    return out_list


def probe(args, options, cost, name: str):
    from kvplan.calibration.probe import speed_probe

    result = speed_probe(args.model, cost, block_size=options.block_size, dtype=options.dtype, seed=args.seed,
                         temperature=args.temperature)
    print(f"  {name}: speed probe: {result.measured_s:.3f} s measured, {result.predicted_s:.3f} s by the profile "
          f"(x{result.factor:.3f})", file=sys.stderr)
    return result


def in_run_factor(cost, steps_path: Path) -> float:
    """How fast a live run's own steps went against the profile: Σ measured / Σ profile-predicted."""
    from kvplan.calibration.probe import predicted_seconds
    from kvplan.sim.cost.recorded import read_step_profile

    steps = read_step_profile(steps_path)[1]
    return float(sum(s.duration_s for s in steps) / predicted_seconds(cost, steps).sum())


def timing_entry(lives, sim, keys: tuple[str, ...] | None = None) -> list[dict]:
    from kvplan.validation import timing_rows

    rows = timing_rows(lives, sim) if keys is None else timing_rows(lives, sim, keys)
    return [{"metric": m.metric, "live": m.live, "band_pct": m.band_pct, "simulated": m.simulated,
             "error_pct": m.error_pct} for m in rows]


def check_policy(trace, live, options, meta: dict, steps: Path) -> tuple:
    """(PolicyCheck, live counters, simulated counters) for the simulator priced by this run's own steps."""
    from kvplan.live import sample_interval, sim_spec
    from kvplan.sim.cost.recorded import PolicyDivergence
    from kvplan.sim.run import simulate
    from kvplan.validation import PolicyCheck, counters, policy_check

    try:
        recorded = simulate(trace, sim_spec(options, meta, cost="recorded", profile=str(steps),
                                            interval=sample_interval(trace), record_tokens=True))
    except PolicyDivergence as exc:
        return PolicyCheck(False, len(live.token_times), float("nan"), [str(exc)]), counters(live), {}
    return policy_check(live, recorded), counters(live), counters(recorded)
