"""`kvplan validate --endpoint`: the repeats against a server, each labelled cold or warm, with the drift probe
around them.

Order, so that a configuration error costs no request: probe the server (its kind and KV configuration), derive
the simulator's configuration from it, and check every request fits and the simulator accepts the configuration
(`endpoint_plan`); only then replay. Each repeat starts cold where the server can be reset (vLLM, SGLang) or
where kvplan's requests reuse nothing by construction (llama.cpp with cache_prompt false); elsewhere (TGI) the
first repeat is taken as cold and every later one is labelled warm. The timing verdict uses cold repeats only:
a warm run is reported beside them, never folded into the noise band (a warm repeat's lower latencies would
widen the band until a large error reads "met"). A repeat that fails stops the validation; the repeats measured
before it are kept in a complete result set marked partial; a drift probe that fails before the first repeat
stops it with nothing measured (one line, exit 2). Every call to the server has --timeout's deadlines
(kvplan.endpoint.session's help, kvplan.endpoint.http_limits), so a server that drips or stalls ends it in about
one --timeout.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvplan.endpoint.servers import ServerInfo
from kvplan.endpoint.session import EndpointOptions
from kvplan.engine.options import EngineOptions
from kvplan.errors import UserError


class PartialValidation(UserError):
    """The validation stopped early; the result set with what it measured was published (exit 2, one line)."""


@dataclass(slots=True)
class EndpointPlan:
    """What the server is and how the simulator copies it, settled before the first request."""

    endpoint: EndpointOptions  # the URL, model name, tokenizer and --server, read from the arguments once
    server: ServerInfo
    options: EngineOptions  # as the server runs
    meta: dict  # kvplan.live.sim_spec's measured values
    vocab_size: int
    reference_probe_s: float | None  # the profile's calibration-time drift probe
    to_text: Callable[[list[int]], str] | None = None  # the drift probe's text where the replay sends text


@dataclass(slots=True)
class Repeats:
    lives: list = field(default_factory=list)  # ServingResult per completed repeat
    runs: list[dict] = field(default_factory=list)  # per repeat: state (cold/warm), why, reset
    probes: list = field(default_factory=list)  # drift.EndpointProbe, before the first and after each repeat
    stopped: str | None = None  # why the repeats stopped early (None: all ran)


def endpoint_plan(args, trace, options, profile: str | None) -> EndpointPlan:
    from kvplan.endpoint.servers import probe
    from kvplan.endpoint.session import (
        _tokenizer,
        _vocab_size,
        check_fits,
        check_reachable,
        endpoint_options,
        simulator_config,
    )
    from kvplan.live import sample_interval, sim_spec
    from kvplan.sim.run import build_configs, build_cost

    endpoint = endpoint_options(args)
    check_reachable(endpoint.url, endpoint.timeout_s)
    server = probe(endpoint.url, endpoint.server, endpoint.timeout_s)
    print(f"  {server.sentence()}", file=sys.stderr)
    options, meta = simulator_config(server.kv, options, args.model)
    check_fits(trace, meta)
    spec = sim_spec(options, meta, cost="calibrated", profile=profile, interval=sample_interval(trace))
    cost, capacity = build_cost(spec)  # the simulator's own checks: a configuration it would refuse fails now
    build_configs(spec, trace, spec.num_blocks or capacity, cost)
    tokenizer = _tokenizer(endpoint.tokenizer) if endpoint.tokenizer else None
    reference = None
    if profile is not None:
        from kvplan.sim.cost.calibrated import load_profile

        meta_of = load_profile(profile).meta
        reference = (meta_of.get("provenance") or {}).get("endpoint_probe_s")
        seen = (meta_of.get("fit") or {}).get("longest_prompt_tokens")
        longest = int(trace.prompt_tokens.max())
        if isinstance(seen, int) and longest > seen:
            print(f"  note: --profile {profile} was fitted on prompts up to {seen} tokens; this trace's reach "
                  f"{longest}: their prefill price is extrapolated", file=sys.stderr)
    from kvplan.endpoint.prompts import text_writer

    return EndpointPlan(endpoint, server, options, meta, _vocab_size(endpoint, tokenizer),
                        float(reference) if isinstance(reference, int | float) and not isinstance(reference, bool)
                        and reference > 0 else None, text_writer(tokenizer) if tokenizer is not None else None)


def run_state(adapter, reset: str | None, repeat: int) -> dict:
    """Whether a repeat started cold, and why (the verdict uses cold repeats only)."""
    if adapter.cold_by_request:
        return {"state": "cold", "why": adapter.cold_by_request, "reset": reset}
    if reset == "reset":
        return {"state": "cold", "why": "the server's prefix cache was reset before it", "reset": reset}
    if repeat == 0:
        return {"state": "cold", "why": "first repeat (assumes nothing warmed the server before it)", "reset": reset}
    return {"state": "warm", "why": f"no reset ({reset}): it starts from the earlier repeats' cache", "reset": reset}


def endpoint_repeats(args, trace, plan: EndpointPlan, out: Path, name: str) -> Repeats:
    from kvplan.endpoint.drift import endpoint_probe, write_probe_file
    from kvplan.endpoint.session import replay_endpoint
    from kvplan.live import sample_interval

    endpoint = plan.endpoint
    adapter = plan.server.adapter
    done = Repeats()

    def probe_now(when: str) -> None:
        result = endpoint_probe(endpoint.url, endpoint.model, adapter, plan.vocab_size, plan.to_text,
                                endpoint.timeout_s, endpoint.scrapes)
        if result.error and not done.probes:  # nothing measured yet: the repeats would fail the same way
            raise UserError(f"--endpoint: the drift probe before repeat 1 failed ({result.error}); nothing was "
                            "measured: a validation needs every request served")
        done.probes.append(result)
        seconds = "failed: " + result.error if result.error else f"{result.seconds:.3f} s"
        print(f"  {name}: drift probe {when}: {seconds}", file=sys.stderr)

    probe_now("before repeat 1")
    for r in range(args.repeats):
        print(f"  {name}: live run {r + 1}/{args.repeats}", file=sys.stderr)
        where = out / f"live-{r + 1}"
        where.mkdir(parents=True, exist_ok=True)
        live, load = replay_endpoint(endpoint, trace, seed=args.seed, temperature=args.temperature, out=where,
                                     sample_interval_s=sample_interval(trace), server=plan.server)
        state = run_state(adapter, load.prefix_cache_reset, r)
        print(f"  {name}: repeat {r + 1} {state['state']}: {state['why']}", file=sys.stderr)
        if live.info["failed"]:
            done.stopped = (f"repeat {r + 1}: {live.info['failed']} of {len(trace)} requests failed (first: "
                            f"{live.info['rejected_first'][0]}); a timing comparison needs every request served")
            break
        live.info["num_blocks"] = plan.meta["num_blocks"]
        done.lives.append(live)
        done.runs.append({"repeat": r + 1, **state})
        probe_now(f"after repeat {r + 1}")
        # as `replay --drift-probe` writes it: a profile fitted from this run gets a reference
        write_probe_file(where / "probe.json", done.probes[-2:])
    return done


def speed_entry(plan: EndpointPlan, done: Repeats) -> tuple[dict, list]:
    """The drift report, and the SpeedProbe pairs the probe-adjusted view scales the profile by ([] when the
    profile has no calibration-time probe or a probe failed)."""
    from kvplan.endpoint.drift import speed_factors

    entry: dict = {"probe_s": [p.to_json()["seconds"] for p in done.probes],
                   "probe_errors": [p.error for p in done.probes if p.error],
                   "reference_probe_s": plan.reference_probe_s}
    factors = speed_factors(done.probes, plan.reference_probe_s)
    if not factors:
        entry["note"] = ("no speed factor: the profile has no calibration-time probe (calibrate --from-replay of "
                         "a replay that probed)" if plan.reference_probe_s is None else "a probe failed")
    return entry, factors



def frontend_entry(done: Repeats) -> dict:
    """The API server's latency fitted on each repeat (client TTFT against the server's own histograms,
    endpoint.frontend_fit), and their median as the api_server_latency_ms a simulation of this server takes; the
    reason instead where the server exposes no engine-side TTFT."""
    import statistics

    from kvplan.endpoint.frontend_fit import fit_latency

    fits = []
    for live in done.lives:
        first = live.requests[live.requests["sample"] == 0]
        fit = fit_latency(first["ttft_ms"].to_numpy(), first["prompt_tokens"].to_numpy(), live.info["server_counters"])
        if fit is not None:
            fits.append(fit)
    if not fits:
        return {"note": "no fit: the server exposes no TTFT histogram (vllm:request_queue_time_seconds and "
                        "vllm:request_prefill_time_seconds, or vllm:time_to_first_token_seconds)"}
    return {"repeats": [fit.to_json() for fit in fits],
            "api_server_latency_ms": statistics.median(fit.latency_s for fit in fits) * 1e3}
