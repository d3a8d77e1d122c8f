"""The live side of the loop: engine options, replaying a trace on the engine, and its result in the simulator's
tables (the same per-request table, series and summary `kvplan simulate` writes), so the two compare cell by cell.

`EngineOptions` (engine.options) configures both the live engine (`LLM`) and the simulator (`SimSpec`, through
`sim_spec`): validation runs the same configuration on both sides.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

from kvplan.engine.core.settings import for_side
from kvplan.engine.options import EngineOptions
from kvplan.errors import UserError
from kvplan.results.itl import ItlLog
from kvplan.results.rejected import references, rejected_rows
from kvplan.results.request_table import RequestLog
from kvplan.results.serving_result import ServingResult
from kvplan.results.summary import kv_summary, summarize
from kvplan.sim.replica import SERIES_COLUMNS
from kvplan.sim.spec import SimSpec
from kvplan.traces import Trace


def replay_requests(trace: Trace, vocab_size: int, max_model_len: int, seed: int) -> list:
    """The trace as engine requests: prompt token ids generated deterministically from its prefix hashes (so the
    live engine sees exactly the trace's sharing), output lengths forced with ignore_eos."""
    from kvplan.engine.replay import ReplayRequest
    from kvplan.traces.materialize import prompt_token_ids

    out = []
    for row, record in enumerate(trace.records()):
        if record.output_tokens < 1:
            raise UserError(f"--trace: {trace.reference(row)}: output_tokens {record.output_tokens}; a live replay "
                             "needs >= 1 (the engine always samples one token)")
        if record.prompt_tokens + record.output_tokens > max_model_len:
            raise UserError(f"--trace: {trace.reference(row)}: prompt ({record.prompt_tokens}) + output "
                             f"({record.output_tokens}) "
                             f"exceeds the model's context {max_model_len}; allowed: a trace clipped to it "
                             "(`kvplan trace convert --clip-to-context`)")
        tokens = prompt_token_ids(record, vocab_size, seed)
        out.append(ReplayRequest(row, float(record.arrival_s), tokens, int(record.output_tokens), int(record.n),
                                 int(record.priority), lora=record.lora))
    return out


def check_trace_loras(trace: Trace, llm) -> None:
    """Refuse, before anything runs, a trace whose rows name an adapter the engine was not given."""
    from kvplan.engine.lora import lora_id_of

    for k, name in enumerate(trace.lora_names, start=1):
        try:
            lora_id_of(llm.lora, name)
        except UserError as exc:
            assert trace.lora is not None  # (names come with the column)
            row = int(np.flatnonzero(trace.lora == k)[0])
            raise UserError(f"--trace: {trace.reference(row)}: {exc}") from None


def sample_interval(trace: Trace) -> float:
    """The simulator's default time-series interval: the trace span / 100."""
    return max(float(trace.arrival_s[-1] - trace.arrival_s[0]) / 100.0, 1e-3)


def replay(model: str, trace: Trace, options: EngineOptions, *, seed: int = 0, temperature: float = 1.0,
           steps_path: str | Path | None = None,
           lora_modules: dict[str, str] | None = None) -> tuple[ServingResult, dict]:
    """Serve `trace` on the live engine in real time. Returns the result tables and the engine's facts
    (meta: resolved model path, KV blocks, CPU blocks, max_model_len, ...). `lora_modules`: the adapters the
    trace's rows may name (`--lora-modules`)."""
    from kvplan.engine.llm import LLM
    from kvplan.engine.models import resolve_model
    from kvplan.engine.replay import LiveReplay

    llm = LLM(model, seed=seed, lora_modules=lora_modules, **asdict(options))
    check_trace_loras(trace, llm)
    meta = {**llm.profile_meta, "model_path": str(resolve_model(model)), "max_model_len": llm.max_model_len}
    requests = replay_requests(trace, llm.loaded.vocab_size, llm.max_model_len, seed)
    log = LiveReplay(llm, temperature=temperature, seed=seed, sample_interval_s=sample_interval(trace),
                     profile_path=steps_path).run(requests)
    return to_result(log, trace), meta


def to_result(log, trace: Trace) -> ServingResult:
    """A replay log as the simulator's `ServingResult` (one replica), token times included."""
    table, itl, tokens = RequestLog(), ItlLog(), {}
    for seq in log.sequences:
        times = seq.token_times_s
        gaps = np.diff(times) if len(times) > 1 else np.empty(0)
        # a verification step (speculative decoding) emits its tokens at once: one chunk, one gap (as a client
        # streaming them counts it, and the simulator's ITL log)
        gaps = gaps[gaps > 0]
        itl.add_many(gaps.tolist(), [1] * len(gaps))
        table.add(seq.row, seq.sample, 0, seq.arrival_s, seq.first_scheduled_s, times[0] if times else math.nan,
                  seq.last_token_s, seq.prompt_tokens, seq.output_tokens, seq.cached_prompt_tokens, seq.preemptions,
                  float(gaps.max()) if len(gaps) else 0.0)
        tokens[(seq.row, seq.sample)] = times
    frame = table.to_frame(trace.request_id)
    series = pd.DataFrame([(0, *row) for row in log.series], columns=list(SERIES_COLUMNS))
    duration = float(frame["finish_s"].max() - frame["arrival_s"].min()) if len(frame) else 0.0
    kv = kv_summary(log.usage_seconds, duration, log.peak_usage, series, log.counters)
    info = {"num_blocks": log.num_blocks, "block_size": log.block_size, "replicas": 1, "steps": log.num_steps,
            "busy_fraction": log.busy_s / duration if duration else 0.0, "rejected": len(log.rejected),
            "rejected_first": references(trace, log.rejected)}
    return ServingResult(summarize(frame, itl, kv), frame, series, info, tokens, rejected_rows(trace, log.rejected))


def sim_spec(options: EngineOptions, meta: dict, *, cost: str, profile: str | None, interval: float,
             record_tokens: bool = False) -> SimSpec:
    """The simulator configured as the live engine ran: its model, the KV capacity and context it measured, and
    every setting both sides read (engine.core.settings), by name."""
    shared = {s.name: getattr(options, s.name) for s in for_side("sim") if "engine" in s.sides}
    measured = {"num_blocks": int(meta["num_blocks"]), "num_cpu_blocks": int(meta["num_cpu_blocks"]),
                "max_model_len": int(meta["max_model_len"]),
                # the CPU tier in blocks, as the engine sized it (from kv_offloading_size, if given in GiB)
                "kv_offloading_blocks": int(meta.get("kv_offloading_blocks", options.kv_offloading_blocks)),
                "kv_offloading_size": None,  # (given in GiB: already the blocks above)
                **({"allocator": meta["allocator"]} if "allocator" in meta else {})}  # an endpoint's memory model
    # entry_point engine: the replay's times are the engine's own (an in-process engine, or an endpoint whose
    # calibrated profile was fitted on the client's times): no API server is added on top (sim.frontend)
    return SimSpec(model=meta["model_path"], cost=cost, profile=profile, **{**shared, **measured},
                   sample_interval_s=interval, record_tokens=record_tokens, entry_point="engine")
