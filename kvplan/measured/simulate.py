"""The workload a result file ran, rebuilt for the simulator, and its simulation.

What is replayed, in order of preference (`workload`):
1. per-request records with send times: each request's prompt and output lengths at its recorded send time, an
   open-loop replay of what the tool actually sent (a concurrency limit is already in those times);
2. otherwise `num_requests` requests with the file's lengths (its per-request lengths, or its length lists, used
   as they are when there is one per request, else drawn from with replacement, seeded) sent
   - by `max_concurrency` users, each sending its next request when its previous one finished (the closed loop
     of `sim.closed_loop`, bounded to the file's count of requests), when the tool limited concurrency;
   - else at `rate_rps` with gamma gaps of the file's CV (Poisson when none), seeded, as `vllm bench serve` and
     GuideLLM's poisson/constant strategies send them; an infinite rate sends everything at once.
Failed requests are replayed with their recorded lengths (0 output tokens: the simulator rejects and counts them).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from kvplan.errors import UserError
from kvplan.measured.record import MeasuredRun
from kvplan.traces.schema import Trace

# Suffixes of a served model's name that name a variant (tuning, packaging), not a different architecture.
_VARIANT = re.compile(r"(-(instruct|chat|it|hf|base|fp8|awq|gptq|bf16|fp16|v\d+(\.\d+)*))+$")


def builtin_model(name: str | None) -> str | None:
    """kvplan's built-in model for a served model's name, or None: the last path part of the name (an HF repo
    id `org/Model` or a local directory), lower-cased, without `meta-` and variant suffixes (-Instruct, -chat,
    -hf, -it, -v0.2, ...): `meta-llama/Meta-Llama-3-8B-Instruct` -> llama-3-8b,
    `HuggingFaceTB/SmolLM2-135M-Instruct` -> smollm2-135m, `mistralai/Mistral-7B-Instruct-v0.2` -> mistral-7b."""
    from kvplan.sim.specs.models import MODELS

    if not name:
        return None
    base = name.rstrip("/").rsplit("/", 1)[-1].lower()
    for candidate in (base, base.removeprefix("meta-")):
        for form in (candidate, _VARIANT.sub("", candidate)):
            if form in MODELS:
                return form
    return None


@dataclass(slots=True)
class Workload:
    """The trace the simulator replays; `users`: closed-loop users (None: the trace's arrivals are the sends);
    `how`: one line saying how it was rebuilt."""

    trace: Trace
    users: int | None
    how: str


def workload(run: MeasuredRun, seed: int) -> Workload:
    """The requests `run` sent, as the module docstring lays out."""
    rng = np.random.default_rng(seed)
    timed = run.requests is not None and all(r.start_s is not None for r in run.requests)
    if run.requests is not None:
        requests = sorted(run.requests, key=lambda r: r.start_s or 0.0) if timed else run.requests
        prompt = np.array([r.prompt_tokens for r in requests], dtype=np.int64)
        output = np.array([r.output_tokens for r in requests], dtype=np.int64)
        if timed:
            starts = np.array([r.start_s for r in requests], dtype=np.float64)
            trace = Trace.build(starts - starts.min(), prompt, output)
            return Workload(trace, None, f"{len(trace)} requests{_lengths(prompt, output)} at the file's send "
                                         "times")
        count, source = len(requests), "the file's per-request lengths"
    else:
        if not run.prompt_tokens or not run.output_tokens:
            raise UserError(f"{run.source}: neither per-request records nor request lengths; allowed: a result "
                            "file that records its requests' lengths")
        count = run.num_requests or len(run.prompt_tokens)
        prompt, output, source = _lengths_for(run, count, rng)
    if run.max_concurrency is not None:
        how = (f"{count} requests{_lengths(prompt, output)} of {source}, by {run.max_concurrency} concurrent "
               "users (closed loop)")
        if run.rate_rps is not None and math.isfinite(run.rate_rps):
            how += f"; the file's rate limit {run.rate_rps:g}/s is not modelled"
        return Workload(Trace.build(np.zeros(count), prompt, output, timed=False), run.max_concurrency, how)
    if run.rate_rps is None:
        raise UserError(f"{run.source}: {run.run_label or 'the run'} records neither send times, a request rate "
                        "nor a concurrency; allowed: a run of one of those")
    if math.isinf(run.rate_rps):
        starts = np.zeros(count)
        how = f"{count} requests{_lengths(prompt, output)} of {source}, all sent at once (rate inf)"
    else:
        from kvplan.traces.arrivals import renewal

        cv = run.arrival_cv or 1.0
        starts = renewal(run.rate_rps, cv, count, rng)
        starts -= starts[0]
        process = "Poisson" if cv == 1.0 else f"gamma (CV {cv:.3g})"
        how = (f"{count} requests{_lengths(prompt, output)} of {source}, at {run.rate_rps:g}/s with {process} "
               f"arrivals (seed {seed})")
    return Workload(Trace.build(starts, prompt, output), None, how)


def _lengths_for(run: MeasuredRun, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, str]:
    assert run.prompt_tokens is not None and run.output_tokens is not None
    prompt, output = np.asarray(run.prompt_tokens, np.int64), np.asarray(run.output_tokens, np.int64)
    if len(prompt) != len(output):
        raise UserError(f"{run.source}: {len(prompt)} prompt lengths but {len(output)} output lengths; allowed: "
                        "one pair per request")
    if len(prompt) == count or len(prompt) == 1:  # one pair: every request alike (a file's mean lengths)
        return np.resize(prompt, count), np.resize(output, count), "the file's lengths"
    pick = rng.integers(len(prompt), size=count)  # a pair at a time: a prompt keeps its own output
    return prompt[pick], output[pick], f"lengths drawn from the file's {len(prompt)}"


def _lengths(prompt: np.ndarray, output: np.ndarray) -> str:
    def span(a: np.ndarray) -> str:
        return f"{a.min()}" if a.min() == a.max() else f"{a.min()}-{a.max()}"

    return f" ({span(prompt)} prompt, {span(output)} output tokens)"


def simulate_workload(work: Workload, spec, seed: int):  # -> results.ServingResult
    """Simulate `work` with `spec`: an open-loop replay through `sim.run.simulate`, or the closed loop of
    `work.users` users (no API server modelled for them, as in `sim.probe`; `seed` draws their requests)."""
    from kvplan.sim.run import check_trace, simulate

    check_trace(work.trace, "the rebuilt workload")
    if work.users is None:
        return simulate(work.trace, spec)
    from kvplan.sim.closed_loop import ClosedLoop
    from kvplan.sim.cluster import Cluster
    from kvplan.sim.routers import make_router
    from kvplan.sim.run import build_configs, build_cost, collect, sample_interval
    from kvplan.traces.steady import population

    cost, num_blocks = build_cost(spec)
    cache, config = build_configs(spec, work.trace, num_blocks, cost)
    loop = ClosedLoop(population(work.trace), work.users, 0.0, math.inf, seed, max_requests=len(work.trace))
    cluster = Cluster(work.trace, spec.replicas, make_router(spec.router), cache, config, cost,
                      sample_interval_s=sample_interval(spec, work.trace, cost), fast_path=spec.fast_path,
                      closed_loop=loop, layerwise=spec.kv_offloading_layerwise)
    cluster.run()
    result = collect(cluster, num_blocks)
    result.info.update(max_model_len=cache.max_model_len, max_num_batched_tokens=config.max_num_batched_tokens,
                       max_num_seqs=config.max_num_seqs, rejected_failed=0, rejected_over_length=0)
    return result
