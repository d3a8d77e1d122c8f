"""`kvplan validate`: for each engine configuration, replay the trace live N times (the run-to-run noise band)
and simulate it; print live vs simulated percentiles with the error and the band, and the policy counters side by
side; write a markdown report, CDF overlays and every run's tables.

Modes: `policy` - the simulator is priced by each live run's own step durations, so every token time must match
exactly (the proof that the simulator's policy layer is the engine's); `timing` - the simulator uses a calibrated
profile (the error a user gets); `both` (default).

With --endpoint URL the live runs are replays against an OpenAI-compatible server (`kvplan replay --endpoint`)
and the mode is timing: a black box shows no steps to price a policy check with. The simulator takes the
server's KV configuration from its vllm:cache_config_info where exposed (else --block-size, --num-blocks, ...);
--model names the model the simulator prices (and the `model` sent, unless --served-model)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from itertools import pairwise
from pathlib import Path

import numpy as np

from kvplan.arg_types import integer, out_path
from kvplan.commands.replay import add_trace_arguments, load_trace
from kvplan.endpoint.session import add_endpoint_arguments
from kvplan.engine_args import add_engine_arguments, load_configs, options_from_args
from kvplan.errors import UserError
from kvplan.output import atomic_dir, check_out_dir, format_table, json_text, print_json
from kvplan.serving_result import write_tables

MODES = ("policy", "timing", "both")
# The simulations a timing validation compares, beside the profile as calibrated: the profile scaled by a machine
# speed factor measured independently around the live runs (the speed probe), and by the speed the live runs'
# own steps show against the profile (an oracle for the machine's speed, not a prediction: what remains is
# the model's error). (label, timing key, target key, column, title)
ADJUSTED = (("speed-adjusted", "timing_speed_adjusted", "targets_speed_adjusted", "probe_adj",
             "profile scaled by the speed probe"),
            ("in-run-speed", "timing_in_run_speed", "targets_in_run_speed", "in_run_adj",
             "profile scaled by the live runs' own step speed"))


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser("validate", help="live runs vs the simulator: policy identity and timing error",
                         description=__doc__)
    add_trace_arguments(p)
    add_engine_arguments(p)
    p.add_argument("--profile", default=None,
                   help="calibrated profile (default: the shipped cpu-local profile of --model, if any)")
    p.add_argument("--configs", default=None, help="YAML list of named configurations overriding the options")
    p.add_argument("--repeats", type=integer(1, 100), default=2, help="live runs per configuration (the noise band)")
    p.add_argument("--mode", choices=MODES, default="both")
    p.add_argument("--no-speed-probe", dest="speed_probe", action="store_false",
                   help="timing: skip the speed probe around each live run (and the speed-adjusted comparison)")
    add_endpoint_arguments(p)
    p.add_argument("--out", type=out_path, required=True, help="result directory (replaced whole on success)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def check_endpoint_args(args: argparse.Namespace) -> None:
    """--endpoint validates timing against one server: its configuration is the server's own."""
    if args.mode == "policy":
        raise UserError("--mode policy: needs the in-process engine's step profile; allowed with --endpoint: "
                         "--mode timing")
    if args.configs:
        raise UserError("--configs: an endpoint runs one configuration (the server's); allowed with --endpoint: "
                         "no --configs (validate each server separately)")
    args.mode = "timing"
    args.speed_probe = False  # the probe measures this machine, not the server's
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
    if args.repeats < 1:
        raise UserError(f"--repeats: must be >= 1, got {args.repeats}")
    check_out_dir(args.out)
    if args.endpoint is not None:
        check_endpoint_args(args)
    profile = resolve_profile(args)
    trace = load_trace(args)
    base = options_from_args(args)
    configs = load_configs(args.configs, base) if args.configs else [("default", base)]
    results = []
    with atomic_dir(args.out) as out:
        for name, options in configs:
            results.append(validate_config(args, trace, name, options, profile, out / name))
        doc = {"trace": str(args.trace), "requests": len(trace), "model": args.model, "mode": args.mode,
               "profile": profile, "repeats": args.repeats, "configs": results}
        if args.mode != "policy":
            from kvplan.validation import MetricRow, target_summary

            for key, rows in (("targets", "timing"), *((t, k) for _, k, t, _, _ in ADJUSTED)):
                if all(rows in r for r in results):
                    doc[key] = target_summary({r["name"]: [MetricRow(**m) for m in r[rows]] for r in results})
        (out / "validation.json").write_text(json_text(doc))
        (out / "report.md").write_text(report_markdown(doc))
    if args.json:
        print_json(doc)
    else:
        print(report_text(doc))
        print(f"\nwrote {args.out}/report.md, validation.json, and per configuration: live runs, simulations, cdf.png")
    return 0


def validate_config(args, trace, name: str, options, profile: str | None, out: Path) -> dict:
    from kvplan.live import replay, sample_interval, sim_spec
    from kvplan.sim.cost.calibrated import load_profile, save_profile
    from kvplan.sim.run import simulate
    from kvplan.validation import cdf_plot, counters

    cost = load_profile(profile) if profile is not None and args.speed_probe else None
    probes = [probe(args, options, cost, name)] if cost is not None else []
    lives, checks, meta = [], [], {}
    for r in range(args.repeats):
        print(f"  {name}: live run {r + 1}/{args.repeats}", file=sys.stderr)
        where = out / f"live-{r + 1}"
        if args.endpoint is not None:
            live, options, meta = endpoint_run(args, trace, options, where)
        else:
            live, meta = replay(args.model, trace, options, seed=args.seed, temperature=args.temperature,
                                steps_path=where / "steps.jsonl")
            write_tables(live, where, "parquet")
        lives.append(live)
        if cost is not None:
            probes.append(probe(args, options, cost, name))
        if args.mode != "timing":
            checks.append(check_policy(trace, live, options, meta, where / "steps.jsonl"))
    entry = {"name": name, "options": asdict(options), "num_blocks": int(meta["num_blocks"]),
             "busy_fraction": [round(r.info["busy_fraction"], 3) for r in lives],
             "live_counters": [counters(r) for r in lives]}
    sims = {}
    if checks:
        entry["policy"] = [{"identical": c.identical, "sequences": c.sequences, "max_token_diff_s": c.max_token_diff_s,
                            "differences": c.differences, "live_counters": a, "sim_counters": b}
                           for c, a, b in checks]
    if profile is not None:
        simulations = [("calibrated", "timing", profile)]
        if probes:
            # Each live run at the mean of the probes either side of it; the simulation at the runs' mean.
            factors = [(a.factor + b.factor) / 2 for a, b in pairwise(probes)]
            in_run = [in_run_factor(cost, out / f"live-{r + 1}" / "steps.jsonl") for r in range(len(lives))]
            entry["speed"] = {"probe_factors": [round(p.factor, 4) for p in probes],
                              "run_factors": [round(f, 4) for f in factors], "factor": float(np.mean(factors)),
                              "in_run_factors": [round(f, 4) for f in in_run], "in_run_factor": float(np.mean(in_run))}
            for (label, key, _, _, title), factor in zip(ADJUSTED, ("factor", "in_run_factor"), strict=True):
                adjusted = out / f"profile-{label}.yaml"
                save_profile(cost.scaled(entry["speed"][factor]), adjusted,
                             f"{profile}, {title}: x{entry['speed'][factor]:.4f}")
                simulations.append((label, key, str(adjusted)))
        for label, key, path in simulations:
            sim = simulate(trace, sim_spec(options, meta, cost="calibrated", profile=path,
                                           interval=sample_interval(trace)))
            write_tables(sim, out / f"sim-{label}", "parquet")
            sims[label] = sim
            entry[key] = timing_entry(lives, sim)
        entry["sim_counters"] = counters(sims["calibrated"])
    (out / "cdf.png").write_bytes(cdf_plot(lives, sims, f"{name}: {len(lives)} live run(s) vs simulation"))
    return entry


def endpoint_run(args, trace, options, where: Path):
    """One replay against the endpoint, and the simulator's configuration read from the server."""
    from kvplan.endpoint.session import endpoint_options, replay_endpoint, simulator_config
    from kvplan.live import sample_interval

    where.mkdir(parents=True, exist_ok=True)
    live, load = replay_endpoint(endpoint_options(args), trace, seed=args.seed, temperature=args.temperature,
                                 out=where, sample_interval_s=sample_interval(trace))
    if load.prefix_cache_reset != "reset":
        print(f"  warning: prefix cache {load.prefix_cache_reset}", file=sys.stderr)
    live.info["prefix_cache_reset"] = load.prefix_cache_reset
    if live.info["failed"]:
        raise UserError(f"--endpoint: {live.info['failed']} of {len(trace)} requests failed (first: "
                         f"{live.info['rejected_first'][0]}); a timing comparison needs every request served")
    options, meta = simulator_config(load.cache_config, options, args.model)
    live.info["num_blocks"] = meta["num_blocks"]
    return live, options, meta


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


def timing_entry(lives, sim) -> list[dict]:
    from kvplan.validation import timing_rows

    return [{"metric": m.metric, "live": m.live, "band_pct": m.band_pct, "simulated": m.simulated,
             "error_pct": m.error_pct} for m in timing_rows(lives, sim)]


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


def policy_sentence(p: dict) -> str:
    verdict = "identical" if p["identical"] else "DIFFERENT: " + "; ".join(p["differences"])
    counts = {side: ", ".join(f"{k}={v}" for k, v in p[f"{side}_counters"].items()) for side in ("live", "sim")}
    return (f"{p['sequences']} sequences, token times {verdict} (max diff {p['max_token_diff_s']:.2g} s); "
            f"counters live {counts['live']}, simulated {counts['sim']}")


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def timing_table(c: dict) -> tuple[tuple[str, ...], list[list[str]]]:
    """Per metric: live (median of runs), noise band, simulated and error; then the speed-adjusted pair."""
    headers = ("metric", "live", "band_%", "simulated", "error_%")
    rows = [[m["metric"], _fmt(m["live"]), f"±{m['band_pct']:.1f}", _fmt(m["simulated"]), f"{m['error_pct']:+.1f}"]
            for m in c["timing"]]
    for _, key, _, column, _ in ADJUSTED:
        if key in c:
            headers += (column, f"{column}_err_%")
            for row, m in zip(rows, c[key], strict=True):
                row += [_fmt(m["simulated"]), f"{m['error_pct']:+.1f}"]
    return headers, rows


def counter_table(c: dict) -> tuple[tuple[str, ...], list[list[object]]]:
    keys = list(c["sim_counters"])
    rows = [[f"live {i + 1}", *(lc.get(k) for k in keys)] for i, lc in enumerate(c["live_counters"])]
    rows.append(["simulated", *(c["sim_counters"][k] for k in keys)])
    return ("run", *keys), rows


def target_tables(doc: dict) -> list[tuple[str, tuple[str, ...], list[list[str]]]]:
    titles = {"targets": "as calibrated", **{target: title for _, _, target, _, title in ADJUSTED}}
    headers = ("metric", "median_|err|_%", "noise_band_%", "target_%", "met")
    return [(f"across configurations, {title} (median |error| %)", headers,
             [[t["metric"], f"{t['median_abs_error_pct']:.2f}", f"{t['median_noise_band_pct']:.2f}",
               f"{t['target_pct']:.0f}", "yes" if t["met"] else "NO"] for t in doc[key]])
            for key, title in titles.items() if key in doc]


def speed_sentence(c: dict) -> str:
    s = c["speed"]
    return (f"machine speed vs profile (>1 = slower): speed probe {', '.join(f'{f:.3f}' for f in s['probe_factors'])}"
            f" around the live runs (probe_adj at x{s['factor']:.3f}); the live runs' own steps "
            f"{', '.join(f'{f:.3f}' for f in s['in_run_factors'])} (in_run_adj at x{s['in_run_factor']:.3f})")


def report_text(doc: dict) -> str:
    parts = [f"{doc['trace']}: {doc['requests']} requests, {doc['model']}, {doc['repeats']} live run(s) per "
             f"configuration, mode {doc['mode']}"]
    for c in doc["configs"]:
        parts.append(f"\n== {c['name']} ({c['num_blocks']} KV blocks, engine busy "
                     f"{', '.join(f'{b:.0%}' for b in c['busy_fraction'])})")
        parts += [f"policy (live run {i + 1}): {policy_sentence(p)}" for i, p in enumerate(c.get("policy", []))]
        if "speed" in c:
            parts.append(speed_sentence(c))
        if "timing" in c:
            parts.append(format_table(*timing_table(c)))
            parts.append(format_table(*counter_table(c)))
    for title, headers, rows in target_tables(doc):
        parts += [f"\n{title}:", format_table(headers, rows)]
    return "\n".join(parts)


def markdown_table(headers, rows) -> list[str]:
    return ["| " + " | ".join(map(str, headers)) + " |", "|---" * len(headers) + "|",
            *("| " + " | ".join(map(str, row)) + " |" for row in rows)]


def report_markdown(doc: dict) -> str:
    lines = ["# kvplan validate report", "",
             f"Trace `{doc['trace']}` ({doc['requests']} requests), model `{doc['model']}`, {doc['repeats']} live "
             f"run(s) per configuration, mode `{doc['mode']}`, profile `{doc['profile']}`.", "",
             "Error = (simulated − live) / live, live = the median of the live runs; the noise band is half the "
             "live runs' range. Policy: the simulator priced by each live run's own step durations. probe_adj: "
             "the profile scaled by the speed probe's measure of how fast the machine ran around the live runs "
             "(measured ÷ profile-predicted time of a fixed workload); in_run_adj: scaled by the live runs' own "
             "steps (measured ÷ profile-predicted), an oracle for the machine's speed that leaves the model's "
             "error.", ""]
    for title, headers, rows in target_tables(doc):
        lines += [f"## {title[0].upper()}{title[1:]}", "", *markdown_table(headers, rows), ""]
    for c in doc["configs"]:
        lines += [f"## {c['name']}", "", f"Options: `{json.dumps(c['options'])}`; {c['num_blocks']} KV blocks; "
                  f"engine busy {', '.join(f'{b:.0%}' for b in c['busy_fraction'])}.", ""]
        lines += [f"- Policy, live run {i + 1}: {policy_sentence(p)}." for i, p in enumerate(c.get("policy", []))]
        if "speed" in c:
            lines.append(f"- {speed_sentence(c)[0].upper()}{speed_sentence(c)[1:]}.")
        if "timing" in c:
            lines += ["", *markdown_table(*timing_table(c)), "", *markdown_table(*counter_table(c))]
        lines += ["", f"![CDFs]({c['name']}/cdf.png)", ""]
    return "\n".join(lines)
