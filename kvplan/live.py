"""The live side of the loop: engine options, replaying a trace on the engine, and its result in the simulator's
tables (the same per-request table, series and summary `kvplan simulate` writes), so the two compare cell by cell.

`EngineOptions` is one set of serving knobs that configures both the live engine (`LLM`) and the simulator
(`SimSpec`): validation runs the same configuration on both sides.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import pandas as pd

from kvplan.sim.metrics import ItlLog, RequestLog, kv_summary, summarize
from kvplan.sim.rejections import references, rejected_rows
from kvplan.sim.replica import SERIES_COLUMNS
from kvplan.sim.run import SimResult, SimSpec
from kvplan.traces import Trace

# the engine's kv_cache_dtype -> the simulator's KV dtype name (auto: the model's dtype, which the simulator
# takes from the model by itself)
SIM_KV_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16", "fp8_e4m3": "float8",
                 "fp8": "float8", "int8": "int8"}


@dataclass(slots=True)
class EngineOptions:
    """Serving knobs shared by the live engine and the simulator (names follow vLLM's engine arguments)."""

    block_size: int = 16
    num_blocks: int | None = None  # KV capacity; default: what kv_cache_memory holds
    kv_cache_memory: int = 64 << 20  # bytes of KV cache (CPU), used when num_blocks is not given
    dtype: str = "bfloat16"
    kv_cache_dtype: str = "auto"  # auto (the model's dtype), float16, bfloat16, float32, fp8_e4m3, int8
    enable_prefix_caching: bool = True
    eviction_policy: str = "lru"
    preemption_mode: str = "recompute"
    victim_policy: str = "newest"
    schedule: str = "mixed"
    scheduler_reserve_full_isl: bool = True  # admit only when the whole prompt fits (vLLM's default)
    swap_space: int = 64 << 20  # bytes of CPU swap space (preemption_mode: swap)
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 512
    enable_chunked_prefill: bool = True
    max_model_len: int | None = None
    sink_tokens: int = 0
    window_tokens: int = 0
    position_mode: str = "original"  # with a window: original, or shifted (StreamingLLM, engine.rope)

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def llm_kwargs(self) -> dict:
        kw = asdict(self)
        kw["num_gpu_blocks_override"] = kw.pop("num_blocks")
        return kw


def replay_requests(trace: Trace, vocab_size: int, max_model_len: int, seed: int) -> list:
    """The trace as engine requests: prompt token ids generated deterministically from its prefix hashes (so the
    live engine sees exactly the trace's sharing), output lengths forced with ignore_eos."""
    from kvplan.engine.replay import ReplayRequest
    from kvplan.traces.materialize import prompt_token_ids

    out = []
    for row, record in enumerate(trace.records()):
        if record.output_tokens < 1:
            raise ValueError(f"--trace: {trace.reference(row)}: output_tokens {record.output_tokens}; a live replay "
                             "needs >= 1 (the engine always samples one token)")
        if record.prompt_tokens + record.output_tokens > max_model_len:
            raise ValueError(f"--trace: {trace.reference(row)}: prompt ({record.prompt_tokens}) + output "
                             f"({record.output_tokens}) "
                             f"exceeds the model's context {max_model_len}; allowed: a trace clipped to it "
                             "(`kvplan trace convert --clip-to-context`)")
        tokens = prompt_token_ids(record, vocab_size, seed)
        out.append(ReplayRequest(row, float(record.arrival_s), tokens, int(record.output_tokens), int(record.n),
                                 int(record.priority)))
    return out


def sample_interval(trace: Trace) -> float:
    """The simulator's default time-series interval: the trace span / 100."""
    return max(float(trace.arrival_s[-1] - trace.arrival_s[0]) / 100.0, 1e-3)


def replay(model: str, trace: Trace, options: EngineOptions, *, seed: int = 0, temperature: float = 1.0,
           steps_path: str | Path | None = None) -> tuple[SimResult, dict]:
    """Serve `trace` on the live engine in real time. Returns the result tables and the engine's facts
    (meta: resolved model path, KV blocks, CPU blocks, max_model_len, ...)."""
    from kvplan.engine.llm import LLM
    from kvplan.engine.models import resolve_model
    from kvplan.engine.replay import LiveReplay

    llm = LLM(model, seed=seed, **options.llm_kwargs())
    meta = {**llm.profile_meta, "model_path": str(resolve_model(model)), "max_model_len": llm.max_model_len}
    requests = replay_requests(trace, llm.loaded.vocab_size, llm.max_model_len, seed)
    log = LiveReplay(llm, temperature=temperature, seed=seed, sample_interval_s=sample_interval(trace),
                     profile_path=steps_path).run(requests)
    return to_result(log, trace), meta


def to_result(log, trace: Trace) -> SimResult:
    """A replay log as the simulator's `SimResult` (one replica), token times included."""
    table, itl, tokens = RequestLog(), ItlLog(), {}
    for seq in log.sequences:
        times = seq.token_times_s
        gaps = np.diff(times) if len(times) > 1 else np.empty(0)
        itl.add_many(gaps.tolist(), [1] * len(gaps))
        table.add(seq.row, seq.sample, 0, seq.arrival_s, seq.first_scheduled_s, times[0] if times else math.nan,
                  seq.finish_s, seq.prompt_tokens, seq.output_tokens, seq.cached_prompt_tokens, seq.preemptions,
                  float(gaps.max()) if len(gaps) else 0.0)
        tokens[(seq.row, seq.sample)] = times
    frame = table.to_frame(trace.request_id)
    series = pd.DataFrame([(0, *row) for row in log.series], columns=list(SERIES_COLUMNS))
    duration = float(frame["finish_s"].max() - frame["arrival_s"].min()) if len(frame) else 0.0
    kv = kv_summary(log.usage_seconds, duration, log.peak_usage, series, log.counters)
    info = {"num_blocks": log.num_blocks, "block_size": log.block_size, "replicas": 1, "steps": log.num_steps,
            "busy_fraction": log.busy_s / duration if duration else 0.0, "rejected": len(log.rejected),
            "rejected_first": references(trace, log.rejected)}
    return SimResult(summarize(frame, itl, kv), frame, series, info, tokens, rejected_rows(trace, log.rejected))


def sim_spec(options: EngineOptions, meta: dict, *, cost: str, profile: str | None, interval: float,
             record_tokens: bool = False) -> SimSpec:
    """The simulator configured as the live engine ran: its model, measured KV capacity and every knob."""
    return SimSpec(
        model=meta["model_path"], cost=cost, profile=profile, block_size=options.block_size,
        num_blocks=int(meta["num_blocks"]), num_cpu_blocks=int(meta["num_cpu_blocks"]),
        enable_prefix_caching=options.enable_prefix_caching, eviction_policy=options.eviction_policy,
        max_model_len=int(meta["max_model_len"]), sink_tokens=options.sink_tokens,
        kv_dtype=SIM_KV_DTYPES.get(options.kv_cache_dtype),
        window_tokens=options.window_tokens, max_num_batched_tokens=options.max_num_batched_tokens,
        max_num_seqs=options.max_num_seqs, enable_chunked_prefill=options.enable_chunked_prefill,
        preemption_mode=options.preemption_mode, victim_policy=options.victim_policy, schedule=options.schedule,
        scheduler_reserve_full_isl=options.scheduler_reserve_full_isl, sample_interval_s=interval,
        record_tokens=record_tokens)
