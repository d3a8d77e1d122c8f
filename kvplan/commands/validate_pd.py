"""`kvplan validate --prefill-replicas 1 --decode-replicas 1`: a live prefill/decode pair (`kvplan.live_pd`: two
engine processes, KV over kvplan's loopback TCP transport, this process as vLLM's proxy) against the P/D simulator
(`sim.disagg`).

Policy: the simulator priced by each instance's own recorded steps (`RecordedCost` per pool), with each request's
hops, pull duration and export end taken from the live record (`sim.disagg.RecordedHandoffs`), must give every
request the live timeline: the prefill instance's token, every decode token, the counters of each instance, and the
TTFT parts (`sim.pd_run.PARTS`). A divergence names the instance, the step and what differed.

Timing: the simulator with the calibrated profile (both pools) and a KV link declared from this run's own pulls
(pull duration = latency + blocks x seconds per block, least squares over every repeat's pulls; kvplan's transport
runs `MAX_PULLS` pulls at once, so the link has that many lanes); percentile rows live vs simulated with the
error and the noise band over repeats, the TTFT parts included.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvplan.commands.validate import rounded
from kvplan.commands.validate_report import print_report, write_report
from kvplan.errors import UserError
from kvplan.output import atomic_dir, json_text
from kvplan.results.serving_result import ServingResult, write_tables
from kvplan.sim.pd_spec import OPTIONS, Disaggregation

TRANSPORT = "kvplan's NIXL-style pull over a loopback TCP socket, two processes on this machine"
PART_TOLERANCE_MS = 1e-6  # token times match to float rounding (validation.TOKEN_TIME_TOLERANCE_S)


def check_pd_args(args: argparse.Namespace, pd: Disaggregation, options) -> None:
    """What a live pair on this machine cannot be: refused in one line before anything starts."""
    if args.endpoint is not None:
        raise UserError("--endpoint: the P/D flags validate kvplan's own live pair; allowed: --endpoint without "
                        "--prefill-replicas/--decode-replicas (one server), or the P/D flags without --endpoint")
    if args.configs:
        raise UserError("--configs: a P/D validation runs one configuration; allowed: no --configs with the P/D flags")
    if (pd.prefill_replicas, pd.decode_replicas) != (1, 1):
        raise UserError(f"--prefill-replicas/--decode-replicas: {pd.prefill_replicas} x {pd.decode_replicas}; "
                        "allowed: 1 x 1 (the live pair is one prefill and one decode process)")
    fixed = [OPTIONS[name].flag for name in ("prefill_hardware", "decode_hardware", "prefill_tensor_parallel_size",
                                             "decode_tensor_parallel_size", "kv_link", "kv_link_bandwidth",
                                             "kv_link_latency_ms", "kv_link_concurrency")
             if getattr(pd, name) != getattr(Disaggregation(1, 1), name)]
    if fixed:
        raise UserError(f"{fixed[0]}: the live pair runs on this machine and its KV link is measured in the run; "
                        "allowed: only --prefill-replicas 1 --decode-replicas 1 (and the pool routers)")
    if options.window_tokens:
        raise UserError("--window-tokens: a sink+window cache releases blocks a decode instance would read; "
                        "allowed: no window with the P/D flags")


def run_pd(args: argparse.Namespace, pd: Disaggregation) -> int:
    from kvplan.commands.replay import load_trace
    from kvplan.commands.validate import resolve_profile
    from kvplan.endpoint.session import within_duration
    from kvplan.engine_args import options_from_args
    from kvplan.live_pd import run_pair

    options = options_from_args(args)
    check_pd_args(args, pd, options)
    profile = resolve_profile(args)
    trace = within_duration(load_trace(args), args.duration)
    if np.any(trace.n != 1):
        raise UserError("--trace: a request with n > 1; allowed with the P/D flags: n = 1 (vLLM's P/D proxy "
                        "sends n = 1)")
    with atomic_dir(args.out) as out:
        where = out / "default"
        runs, lives, policy, timeline = [], [], [], []
        for r in range(args.repeats):
            print(f"  live P/D pair: run {r + 1}/{args.repeats}", file=sys.stderr)
            run = run_pair(args.model, trace, options, where / f"live-{r + 1}", seed=args.seed,
                           temperature=args.temperature)
            live = live_result(trace, run)
            write_tables(live, where / f"live-{r + 1}", "parquet")
            (where / f"live-{r + 1}" / "pair.json").write_text(json_text(pair_record(run)))
            runs.append(run)
            lives.append(live)
            if args.mode != "timing":
                checks, parts = check_pair(trace, options, run)
                policy += [{"repeat": r + 1, **c} for c in checks]
                timeline.append({"repeat": r + 1, **parts})
        link = measured_link(runs)
        entry: dict = {"name": "default", "options": asdict(options), "num_blocks": int(runs[0].decode.meta[
            "num_blocks"]), "runs": [{"repeat": i + 1, "state": "cold", "why": "fresh instances", "reset": None}
                                     for i in range(len(runs))],
            "busy_fraction": [rounded(live.info["busy_fraction"]) for live in lives],
            "instances_busy_fraction": [{role: rounded(getattr(run, role).log.busy_s / live.info["duration_s"])
                                         for role in ("prefill", "decode")} for run, live in zip(runs, lives,
                                                                                                    strict=True)],
            "link": link}
        if policy:
            entry["policy"], entry["timeline"] = policy, timeline
        sims: dict[str, ServingResult] = {}
        if profile is not None:
            from kvplan.commands.validate import timing_entry
            from kvplan.sim.pd_run import PART_KEYS, simulate_disaggregated
            from kvplan.validation import LATENCY_KEYS, RATE_KEYS

            # (the pair has no API servers: that part is 0 on both sides, and left out)
            keys = (*LATENCY_KEYS, *RATE_KEYS, *(k for k in PART_KEYS if not k.endswith("_api_servers_ms")))
            entry["speed"] = in_run_speed(profile, runs)
            for label, key, path in (("calibrated", "timing", profile),
                                     ("in-run-speed", "timing_in_run_speed",
                                      scaled_profile(profile, entry["speed"]["factor"], where))):
                spec = pair_spec(options, runs[0], trace, cost="calibrated", profile=path)
                sim = simulate_disaggregated(trace, spec, link_deployment(link, pd, sim_block_bytes(spec)))
                write_tables(sim, where / f"sim-{label}", "parquet")
                entry[key] = timing_entry(lives, sim, keys)
                sims[label] = sim
        from kvplan.commands.validate import cdf_plot_of

        (where / "cdf.png").write_bytes(cdf_plot_of(lives, sims, f"live P/D pair: {len(lives)} run(s) vs simulation"))
        doc = {"kind": "pd", "trace": str(args.trace), "requests": len(trace), "model": args.model,
               "mode": args.mode, "profile": profile, "repeats": args.repeats, "duration_s": args.duration,
               "disaggregation": {"prefill_replicas": 1, "decode_replicas": 1, "transport": TRANSPORT},
               "configs": [entry]}
        write_report(out, doc)
    print_report(doc, args.json, f"wrote {args.out}/report.md, validation.json, and per live run: each instance's "
                 "steps, the pair's record and its tables")
    return 0  # (as a co-located validation: the verdict is the report's)


def in_run_speed(profile: str, runs: list) -> dict:
    """How fast the instances' own steps went against the profile (Σ measured / Σ profile-predicted, per instance
    and run, and over all): an oracle for this machine's speed, which leaves the model's error."""
    from kvplan.commands.validate import in_run_factor
    from kvplan.sim.cost.calibrated import load_profile

    cost = load_profile(profile)
    per = [{role: round(in_run_factor(cost, Path(getattr(run, role).steps_path)), 4) for role in ("prefill", "decode")}
           for run in runs]
    return {"instances": per, "factor": float(np.mean([f for p in per for f in p.values()]))}


def scaled_profile(profile: str, factor: float, where: Path) -> str:
    from kvplan.sim.cost.calibrated import load_profile, save_profile

    path = where / "profile-in-run-speed.yaml"
    save_profile(load_profile(profile).scaled(factor), path, f"{profile}, scaled by the live pair's own step speed: "
                 f"x{factor:.4f}")
    return str(path)


def pair_record(run) -> dict:
    """What the pair recorded per request (trace clock, seconds), for the result set."""
    rows = sorted(run.decode.arrived_s)
    return {"kv_bytes_per_block": run.kv_bytes_per_block, "requests": [
        {"row": row, "prefill_arrival_s": run.prefill.arrived_s.get(row),
         "decode_arrival_s": run.decode.arrived_s.get(row), "pull_step_start_s": run.decode.parked_s.get(row),
         "pull_began_s": run.decode.pull_s.get(row, (None, None))[0],
         "pull_ended_s": run.decode.pull_s.get(row, (None, None))[1], "pull_blocks": run.decode.pull_blocks.get(row),
         "export_ended_s": run.prefill.released_s.get(row)} for row in rows]}


def _seq(log) -> dict[int, Any]:
    return {s.row: s for s in log.sequences}


def live_result(trace, run) -> ServingResult:
    """The client's view of the live pair (`sim.pd_run.request_table`'s columns, TTFT parts included)."""
    from kvplan.live import to_result
    from kvplan.results.itl import ItlLog
    from kvplan.results.request_table import RequestLog
    from kvplan.results.summary import latency_summary
    from kvplan.sim.pd_run import PARTS, part_summary

    decode = to_result(run.decode.log, trace)  # its KV series and counters, the instance's own
    prefill, table, itl = _seq(run.prefill.log), RequestLog(), ItlLog()
    parts = []
    for seq in sorted(run.decode.log.sequences, key=lambda s: s.row):
        row, first = seq.row, prefill[seq.row]
        times = seq.token_times_s
        gaps = np.diff(times) if len(times) > 1 else np.empty(0)
        itl.add_many(gaps.tolist(), [1] * len(gaps))
        arrival = float(trace.arrival_s[row])
        table.add(row, 0, 1, arrival, first.first_scheduled_s, times[0], seq.last_token_s, seq.prompt_tokens,
                  seq.output_tokens, first.cached_prompt_tokens, seq.preemptions + first.preemptions,
                  float(gaps.max()) if len(gaps) else 0.0)
        handoff, parked, ended = first.last_token_s, run.decode.parked_s[row], run.decode.pull_s[row][1]
        parts.append({"prefill_ttft_ms": (handoff - arrival) * 1e3,
                      "api_servers_ms": 0.0,  # (the pair has none: its proxy's hop is in the admission wait)
                      "decode_admission_wait_ms": ((parked - handoff) + (seq.first_scheduled_s - ended)) * 1e3,
                      "transfer_ms": (ended - parked) * 1e3,
                      "first_decode_step_ms": (times[0] - seq.first_scheduled_s) * 1e3})
    frame = table.to_frame(trace.request_id)
    for name in PARTS:
        frame[name] = [p[name] for p in parts]
    duration = float(frame["finish_s"].max() - frame["arrival_s"].min()) if len(frame) else 0.0
    # the latencies as the client sees them; the KV keys the decode instance's own
    summary = {**decode.summary, **latency_summary(frame, itl), **part_summary(frame)}
    info = {**decode.info, "duration_s": duration, "busy_fraction": run.decode.log.busy_s / duration if duration
            else 0.0}
    return ServingResult(summary, frame, decode.series, info, {(s.row, 0): s.token_times_s
                                                               for s in run.decode.log.sequences}, decode.rejected)


def measured_link(runs: list) -> dict:
    """The KV link as this run's pulls show it: duration (from the start of the decode step that began the pull to
    its end, as the simulator times a transfer) = latency + blocks x seconds per block, least squares."""
    from kvplan.engine.kv_transfer.connector import MAX_PULLS

    blocks, seconds = [], []
    for run in runs:
        for row, (_, end) in run.decode.pull_s.items():
            blocks.append(run.decode.pull_blocks[row])
            seconds.append(end - run.decode.parked_s[row])
    b, d = np.asarray(blocks, dtype=float), np.asarray(seconds, dtype=float)
    if len(set(blocks)) >= 2:
        per_block, latency = (float(v) for v in np.polyfit(b, d, 1))
    else:
        per_block, latency = 0.0, 0.0
    if per_block <= 0 or latency < 0:  # too few or too noisy pulls for a line: the mean rate, no fixed part
        per_block, latency = float(d.sum() / max(b.sum(), 1.0)), 0.0
    block_bytes = runs[0].kv_bytes_per_block
    return {"pulls": len(blocks), "seconds_per_block": per_block, "latency_s": latency,
            "live_block_bytes": block_bytes, "bandwidth_bytes_per_s": block_bytes / per_block,
            "mean_pull_s": float(d.mean()) if len(d) else None, "concurrency": MAX_PULLS,
            "how": "least squares of each pull's duration (decode step start to the pull's end) on its blocks, "
                   "over every repeat's pulls"}


def link_deployment(link: dict, pd: Disaggregation, block_bytes: float) -> Disaggregation:
    """The deployment the simulator runs: the measured link, `concurrency` lanes each moving a block of
    `block_bytes` (the simulator's count of a block's bytes) in the measured seconds per block."""
    return replace(pd, kv_link_bandwidth=link["concurrency"] * block_bytes / link["seconds_per_block"],
                   kv_link_latency_ms=link["latency_s"] * 1e3, kv_link_concurrency=link["concurrency"])


def sim_block_bytes(spec) -> float:
    """A KV block's bytes as the simulator counts them (`sim.pd_run.build_cluster`: the model's layout)."""
    from kvplan.sim.pd_transfer import model_layout

    model, width = model_layout(spec)
    return model.kv_bytes_per_token(width) * spec.kv_block_size


def pair_spec(options, run, trace, *, cost: str, profile: str | None, record_tokens: bool = False):
    from kvplan.live import sample_interval, sim_spec

    return sim_spec(options, run.decode.meta, cost=cost, profile=profile, interval=sample_interval(trace),
                    record_tokens=record_tokens)


def recorded_handoffs(trace, run):
    from kvplan.sim.disagg import RecordedHandoffs

    n = len(trace)

    def column(values: dict) -> list[float]:
        return [values.get(row, math.nan) for row in range(n)]

    d = run.decode
    return RecordedHandoffs(column(run.prefill.arrived_s), column(d.arrived_s),
                            column({row: end - d.parked_s[row] for row, (_, end) in d.pull_s.items()}),
                            column(run.prefill.released_s))


def check_pair(trace, options, run, sim_options=None) -> tuple[list[dict], dict]:
    """Per instance (prefill, decode): the policy entry of `kvplan validate` (identical, sequences,
    max_token_diff_s, differences, counters); and the timeline check of the four TTFT parts per request.
    `sim_options`: the simulator's configuration when it is not the live one (a check that must fail)."""
    from kvplan.sim.cost.recorded import PolicyDivergence
    from kvplan.sim.pd_run import build_cluster, collect
    from kvplan.validation import PolicyCheck, counters, policy_check

    live = live_result(trace, run)
    spec = pair_spec(sim_options or options, run, trace, cost="recorded", profile=None, record_tokens=True)
    link = measured_link([run])
    steps = (run.prefill.steps_path, run.decode.steps_path)
    lives = {role: instance_result(getattr(run, role).log) for role in ("prefill", "decode")}
    try:
        cluster, _, _ = build_cluster(trace, spec, link_deployment(link, Disaggregation(1, 1), sim_block_bytes(spec)),
                                      lambda s, c: spec.sample_interval_s, profiles=steps,
                                      recorded=recorded_handoffs(trace, run))
        cluster.run()
    except PolicyDivergence as exc:  # the first differing step stops the simulation: neither is shown identical
        role = "prefill" if "prefill.steps" in str(exc) else "decode"
        why = {name: [f"{role} instance: {exc}"] if name == role else
               [f"not compared: the {role} instance diverged first"] for name in lives}
        return ([{"instance": name, "identical": False, "sequences": len(result.token_times or {}),
                  "max_token_diff_s": math.nan, "differences": why[name], "live_counters": counters(result),
                  "sim_counters": {}} for name, result in lives.items()],
                {"identical": False, "requests": len(live.requests), "max_diff_ms": math.nan,
                 "differences": [f"{role} instance diverged"]})
    out = []
    for role, pool in (("prefill", cluster.prefill), ("decode", cluster.decode)):
        replica = pool.replicas[0]
        sim = instance_summary(replica.counters(), replica.peak_usage, lives[role].info["num_blocks"],
                               cluster.token_times(pool))
        check: PolicyCheck = policy_check(lives[role], sim)
        out.append({"instance": role, "identical": check.identical, "sequences": check.sequences,
                    "max_token_diff_s": check.max_token_diff_s, "differences": check.differences,
                    "live_counters": counters(lives[role]), "sim_counters": counters(sim)})
    return out, timeline_check(live.requests, collect(cluster, None).requests)


def instance_result(log) -> ServingResult:
    """An instance's own counters and token times, as `validation.policy_check` compares them."""
    return instance_summary(log.counters, log.peak_usage, log.num_blocks,
                            {(s.row, s.sample): s.token_times_s for s in log.sequences})


def instance_summary(counts: dict, peak: float, num_blocks: int, token_times) -> ServingResult:
    summary = {**counts, "kv_usage_peak": peak}
    empty = pd.DataFrame()
    return ServingResult(summary, empty, empty, {"num_blocks": num_blocks}, token_times, empty)


def timeline_check(live: pd.DataFrame, sim: pd.DataFrame) -> dict:
    """Every request's TTFT parts, live vs the recorded simulation (ms)."""
    from kvplan.sim.pd_run import PARTS

    a, b = live.set_index("request"), sim.set_index("request")
    diffs, worst = [], 0.0
    for row in sorted(set(a.index) | set(b.index)):
        if row not in a.index or row not in b.index:
            diffs.append(f"request row {row}: {'live' if row in a.index else 'simulated'} only")
            continue
        for part in PARTS:
            x, y = float(a.at[row, part]), float(b.at[row, part])  # type: ignore[arg-type]
            worst = max(worst, abs(x - y))
            if abs(x - y) > PART_TOLERANCE_MS:
                diffs.append(f"request row {row}: {part} live {x:.4f} ms, simulated {y:.4f} ms")
    return {"identical": not diffs, "requests": len(a), "max_diff_ms": worst, "differences": diffs[:5]}
