"""Build and run a simulation from plain arguments (what `kvplan simulate` and the benchmarks call)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from kvplan.engine.core import CacheConfig, ConfigError, Scheduler, SchedulerConfig, make_request
from kvplan.engine.core.config import HybridCacheConfig
from kvplan.engine.core.kv_layout import KVLayout
from kvplan.engine.core.prefix_tiers import offloading_blocks
from kvplan.engine.core.setting_classes import core_config
from kvplan.errors import UserError
from kvplan.limits import MAX_BLOCKS, MAX_REPLICAS, MAX_SAMPLES
from kvplan.results.rejected import references, rejected_rows
from kvplan.results.request_table import RequestLog, latency_columns
from kvplan.results.serving_result import ServingResult
from kvplan.results.summary import kv_summary, summarize
from kvplan.sim.cluster import Cluster
from kvplan.sim.cost import CostModel, StepFeatures
from kvplan.sim.cost.analytic import AnalyticCost, kv_capacity_blocks
from kvplan.sim.cost.calibrated import load_profile
from kvplan.sim.cost.parallel import Shape, check_shape, tp_choices, weight_bytes_per_rank
from kvplan.sim.cost.recorded import RecordedCost, read_step_profile
from kvplan.sim.frontend import FrontendRun, frontend_for
from kvplan.sim.gpu.table import load_table
from kvplan.sim.links import block_bytes
from kvplan.sim.lora import check_trace_adapters
from kvplan.sim.parallel import MergedCluster, run_parallel, worth_parallel
from kvplan.sim.replica import SERIES_COLUMNS
from kvplan.sim.routers import make_router
from kvplan.sim.spec import COST_MODELS, SimSpec, batch_table
from kvplan.sim.specs.hardware import GIB, get_hardware
from kvplan.sim.specs.models import DTYPE_BYTES, MODELS, engine_kv_row_bytes, get_model, sim_kv_dtype
from kvplan.sim.specs.profiles import PROFILED_DEVICES, shipped_profile
from kvplan.sim.specs.quantization import quantized
from kvplan.sim.vllm_defaults import vllm_batch_defaults
from kvplan.traces import Trace
from kvplan.traces.schema import short_repr


def check_trace(trace: Trace, name: str = "trace") -> None:
    if len(trace) == 0:
        raise UserError(f"--trace: {name} has no requests")
    arrivals = trace.arrival_s
    if len(arrivals) > 1 and np.any(np.diff(arrivals) < 0):
        row = int(np.argmax(np.diff(arrivals) < 0)) + 1
        raise UserError(f"--trace: {name} is not sorted by arrival_s (row {row} arrives before row {row - 1})")


def build_cost(spec: SimSpec) -> tuple[CostModel, int]:
    """The cost model and the KV capacity in blocks it implies (unless `spec.num_blocks` overrides it). A profiled
    device (`cpu-local`) means the calibrated cost of its shipped profile for the model."""
    cost_name, profile = spec.cost, spec.profile
    if spec.hardware in PROFILED_DEVICES:
        if cost_name == "analytic":
            cost_name = "calibrated"
        if cost_name == "calibrated" and profile is None:
            profile = str(shipped_profile(spec.model, spec.hardware))
    if cost_name != "analytic" and spec.gpu_profile is not None:  # it would be ignored: say so instead
        raise UserError(f"--gpu-profile {short_repr(str(spec.gpu_profile))}: a per-op GPU profile prices the analytic "
                        f"cost model, not the {cost_name} one; allowed: --cost analytic on a GPU --hardware")
    if cost_name != "analytic" and spec.quantization != "none":
        raise UserError(f"--quantization: {spec.quantization}: the {cost_name} cost model prices the measured engine "
                        "with its own weights; allowed: none, or --cost analytic on a GPU --hardware")
    if cost_name != "analytic" and replica_shape(spec).gpus > 1:
        raise UserError(f"--tensor-parallel-size / --pipeline-parallel-size: {spec.tensor_parallel_size} x "
                         f"{spec.pipeline_parallel_size}: the {cost_name} cost model was measured on one device; "
                         "allowed: 1 x 1, or --cost analytic on a GPU --hardware")
    if cost_name == "analytic":
        if profile is not None:  # it would be ignored: the numbers would not be the profile's
            raise UserError(f"--profile {short_repr(str(profile))}: the analytic cost model reads no profile; "
                            "allowed: --cost calibrated (a profile YAML) or --cost recorded (a replay's "
                            "steps.jsonl), or no --profile")
        return analytic_cost(spec)
    if cost_name == "recorded":
        if profile is None:
            raise UserError("--profile: the recorded cost model needs a live replay's steps.jsonl")
        meta, steps = read_step_profile(profile)
        if "block_size" in spec.filled_defaults and isinstance(meta.get("block_size"), int):
            # the run's steps were taken at its block size: an unset block size is the recorded one
            spec.block_size = meta["block_size"]
            spec.filled_defaults = tuple(n for n in spec.filled_defaults if n != "block_size")
        if meta.get("block_size") != spec.kv_block_size:
            raise UserError(f"--block-size: {spec.kv_block_size} differs from the recorded run's "
                             f"{meta.get('block_size')}; allowed: {meta.get('block_size')}")
        return RecordedCost(steps, str(profile)), spec.num_blocks or int(meta["num_blocks"])
    if cost_name != "calibrated":
        raise UserError(f"--cost: unknown cost model {spec.cost!r}; allowed: {', '.join(COST_MODELS)}")
    if profile is None:
        raise UserError("--profile: the calibrated cost model needs a profile YAML")
    cost = load_profile(profile)
    measured_at = int(cost.meta.get("block_size", spec.kv_block_size))
    # Transfers and capacity were measured at the profile's block size: the same bytes re-cut into this size.
    cost.swap_seconds_per_block *= spec.kv_block_size / measured_at
    cost.copy_seconds_per_block *= spec.kv_block_size / measured_at
    if spec.num_blocks is not None:
        return cost, spec.num_blocks
    if cost.kv_capacity_blocks is None:
        return cost, analytic_cost(spec)[1]
    tokens = cost.kv_capacity_blocks * measured_at
    measured_dtype, kv_dtype = cost.meta.get("dtype"), sim_kv_dtype(spec.kv_cache_dtype)
    if kv_dtype is not None and kv_dtype != measured_dtype:
        # The capacity was measured with the profile's KV dtype: the same bytes hold rows of the other width
        # (the engine's quantized rows carry a float32 scale per token per head, kernels.quant).
        head_dim = _head_dim(spec.model, cost.meta)
        if measured_dtype not in DTYPE_BYTES or head_dim is None:
            raise UserError(f"--kv-cache-dtype: the profile {profile} states no KV dtype or head_dim to rescale its "
                             f"capacity from; allowed: --num-blocks, or a profile of the model")
        tokens = tokens * engine_kv_row_bytes(measured_dtype, head_dim) // engine_kv_row_bytes(kv_dtype, head_dim)
    layout = model_layout(spec.model)
    blocks = tokens // spec.kv_block_size
    return cost, layout.blocks_from_uniform(blocks) if layout is not None else blocks


def _head_dim(model: str, meta: dict) -> int | None:
    if model in MODELS or Path(model).exists():
        return get_model(model).head_dim
    return get_model(meta["model"]).head_dim if meta.get("model") in MODELS else None


def analytic_cost(spec: SimSpec) -> tuple[AnalyticCost, int]:
    hardware = get_hardware(spec.hardware)
    model = quantized(get_model(spec.model), spec.quantization, hardware)  # its weight bytes and GEMM rate
    shape = replica_shape(spec)
    check_shape(model, hardware, shape)
    kv_dtype = sim_kv_dtype(spec.kv_cache_dtype)
    kv_bytes = DTYPE_BYTES[kv_dtype] if kv_dtype is not None else None
    layout = model_layout(spec.model)
    capacity_bytes: float | None = kv_bytes
    if layout is not None:
        # vLLM's hybrid rule: a block id holds one page of `group_size` layers (one layer of every group), so the
        # same memory is divided by group_size layers' bytes per token instead of all the model's layers'
        width = model.dtype_bytes if kv_bytes is None else kv_bytes
        capacity_bytes = width * layout.group_size / model.num_layers
    blocks = kv_capacity_blocks(model, hardware, spec.kv_block_size, kv_dtype_bytes=capacity_bytes,
                                gpu_memory_utilization=spec.memory_utilization,
                                max_num_batched_tokens=spec.batch[0], max_num_seqs=spec.batch[1],
                                shape=shape, lora_bytes=lora_reserved_bytes(spec, model, shape))
    if blocks < 1 and spec.num_blocks is None:
        raise UserError(no_fit_message(spec, model, hardware, shape, kv_bytes))
    table = load_table(spec.gpu_profile, hardware, "--gpu-profile") if spec.gpu_profile else None
    cost = AnalyticCost(model, hardware, spec.kv_block_size, kv_bytes, **spec.cost_options, shape=shape, table=table)
    return cost, spec.num_blocks if spec.num_blocks is not None else blocks


def lora_reserved_bytes(spec: SimSpec, model, shape: Shape) -> float:
    """One rank's stacked LoRA buffers (`sim.lora`), 0 without --enable-lora; a pipeline stage holds its layers'."""
    if not spec.enable_lora:
        return 0.0
    from kvplan.sim.lora import reserved_bytes

    return reserved_bytes(model, spec.max_loras, spec.max_lora_rank, shape.tp) / shape.pp


def model_layout(name: str) -> KVLayout | None:
    """The KV cache groups of a model whose layers mix sliding-window and full attention (its spec's
    `layer_types`), or None: a uniform model (every layer full, or a label that is no spec) is one group."""
    if name not in MODELS and not Path(name).exists():
        return None
    model = get_model(name)
    if not model.layer_types:
        return None
    layout = KVLayout.from_layer_types(model.layer_types, model.sliding_window)
    return layout if layout.hybrid else None


def replica_shape(spec: SimSpec) -> Shape:
    return Shape(spec.tensor_parallel_size, spec.pipeline_parallel_size, spec.enable_expert_parallel)


def no_fit_message(spec: SimSpec, model, hardware, shape: Shape, kv_bytes: float | None) -> str:
    """Why nothing is left for the KV cache, and the smallest tensor-parallel degree (at this PP) that leaves
    some - or that no shape of one node does."""
    weights = weight_bytes_per_rank(model, shape)
    usable = hardware.memory_bytes * spec.memory_utilization
    where = f"{spec.model} on {spec.hardware} at TP {shape.tp} x PP {shape.pp}"
    why = "no memory left for the KV cache " + (
        f"(the weights alone need {weights / GIB:.1f} GiB per GPU of the {usable / GIB:.1f} GiB usable)"
        if weights >= usable else "after the weights and activations")
    fits = [tp for tp in tp_choices(model, hardware) if tp > shape.tp and kv_capacity_blocks(
        model, hardware, spec.kv_block_size, kv_dtype_bytes=kv_bytes, gpu_memory_utilization=spec.memory_utilization,
        max_num_batched_tokens=spec.batch[0], max_num_seqs=spec.batch[1],
        shape=Shape(tp, shape.pp, shape.expert_parallel)) >= 1]
    hint = (f"it fits at --tensor-parallel-size {fits[0]} ({fits[0] * shape.pp} GPUs per replica)" if fits else
            f"no tensor-parallel degree of one {hardware.gpus_per_node}-GPU node fits it at PP {shape.pp}")
    return (f"{where}: {why}; {hint}; allowed: a larger --tensor-parallel-size or --pipeline-parallel-size, a "
            "larger --hardware, a higher --gpu-memory-utilization, or --num-blocks")


def model_context(name: str) -> int | None:
    """The context length of a model spec (built in, or a config.json's), or None when it states none. A
    calibrated or recorded cost may name a model only as a label: then nothing bounds the context here."""
    if name not in MODELS and not Path(name).exists():
        return None  # a label (a calibrated profile's model name), not a spec: nothing to read a context from
    return get_model(name).context_len  # a bad config.json is an error here too, never skipped


def resolve_max_model_len(spec: SimSpec, trace: Trace) -> int:
    """vLLM's rule: the model's context length bounds max_model_len, and requests beyond it are rejected (counted,
    never served). The default here is the shorter of the context and the trace's longest request, so that
    a reservation allocator reserving max_model_len per request reserves no more than the workload needs."""
    context = model_context(spec.model)
    if spec.max_model_len is not None:  # >= 2: checked as the setting
        if context is not None and spec.max_model_len > context:
            raise UserError(f"--max-model-len: {spec.max_model_len} exceeds {spec.model}'s context length "
                             f"{context}; allowed: at most {context}")
        return spec.max_model_len
    longest = int((trace.prompt_tokens + trace.output_tokens).max())
    return longest if context is None else max(2, min(longest, context))


def over_length(trace: Trace, max_len: int) -> int:
    """Requests whose prompt + output exceed `max_len`: the scheduler rejects them (prompt + max_tokens > limit)."""
    return int(np.count_nonzero(trace.servable & (trace.prompt_tokens + trace.output_tokens > max_len)))


def build_configs(spec: SimSpec, trace: Trace, num_blocks: int, cost: CostModel
                  ) -> tuple[CacheConfig, SchedulerConfig]:
    tier = offloading_tier(spec, cost)
    check_sizes(spec, num_blocks, float(trace.arrival_s[-1] - trace.arrival_s[0]))  # before any pool is built
    check_trace_adapters(trace, spec.enable_lora)
    max_len = resolve_max_model_len(spec, trace)
    granularity = trace.hash_granularity if trace.has_prefix else 0
    if spec.enable_prefix_caching and granularity and granularity % spec.kv_block_size and \
            spec.kv_block_size % granularity:
        fitting = [b for b in range(1, 257) if granularity % b == 0 or b % granularity == 0]
        raise UserError(f"--block-size: {spec.kv_block_size} neither divides nor is a multiple of the trace's "
                         f"prefix-hash granularity {granularity}; allowed: {', '.join(map(str, fitting))} "
                         "(or --no-enable-prefix-caching)")
    if num_blocks < 1:
        raise UserError(f"{spec.model} on {spec.hardware}: no memory left for the KV cache after the weights and "
                         "activations; allowed: a larger --hardware, a higher --gpu-memory-utilization, or "
                         "--num-blocks")
    sched = core_config(SchedulerConfig, spec, **batch_settings(spec, max_len))
    layout = model_layout(spec.model)
    try:
        if layout is None:
            cache = core_config(CacheConfig, spec, num_blocks=num_blocks, max_model_len=max_len,
                                kv_offloading_blocks=tier)
        else:
            cache = core_config(HybridCacheConfig, spec, num_blocks=num_blocks, max_model_len=max_len,
                                kv_offloading_blocks=tier, kv_layout=layout)
    except ConfigError as exc:
        if str(exc).startswith("cache.num_blocks"):
            raise ConfigError(f"KV capacity of {num_blocks} blocks ({spec.model} on {spec.hardware}, block size "
                              f"{spec.kv_block_size}) cannot hold one request of the trace: {exc}") from None
        raise
    # The core's own admission rule decides whether the longest prompt could ever be scheduled (a token budget
    # too small with chunked prefill off, a first chunk larger than the watermark leaves).
    # Requests too long for max_len, and failed ones (nothing to serve), are rejected one by one and counted.
    fits = (trace.prompt_tokens + trace.output_tokens <= max_len) & trace.servable
    longest_prompt = int(trace.prompt_tokens[fits].max()) if fits.any() else 1
    probe = make_request("longest-prompt", prompt_len=longest_prompt, max_tokens=1)
    reason = Scheduler(cache, sched).rejection_reason(probe)
    if reason is not None:
        raise UserError(f"the trace's longest prompt can never be scheduled with this configuration: {reason}")
    return cache, sched


def batch_settings(spec: SimSpec, max_len: int) -> dict[str, int]:
    """The token budget and sequence cap the simulated vLLM runs with once max_model_len is known: where vLLM's
    default filled them (`SimSpec.filled_defaults`), its adjustments (without chunked prefill the budget is at least
    max_model_len; at most max_num_seqs x max_model_len); the spec's values otherwise."""
    table = batch_table(spec)
    if not {"max_num_batched_tokens", "max_num_seqs"} & set(spec.filled_defaults) or table is None:
        return {}
    tokens, seqs = spec.batch
    chosen = vllm_batch_defaults(*table, max_model_len=max_len, enable_chunked_prefill=spec.enable_chunked_prefill,
                                 max_num_batched_tokens=None if "max_num_batched_tokens" in spec.filled_defaults
                                 else tokens, max_num_seqs=None if "max_num_seqs" in spec.filled_defaults else seqs)
    return {"max_num_batched_tokens": chosen.max_num_batched_tokens, "max_num_seqs": chosen.max_num_seqs}


def offloading_tier(spec: SimSpec, cost: CostModel) -> int:
    """The CPU tier's blocks: `kv_offloading_blocks`, or what `kv_offloading_size` GiB hold at the model's KV bytes
    per block on this replica (every rank's share), as the engine sizes its host pool."""
    if spec.kv_offloading_size is None:
        return spec.kv_offloading_blocks
    per_block = block_bytes(cost, spec.kv_block_size)
    if per_block is None:
        raise UserError(f"--kv-offloading-size: the cost model ({spec.cost}) does not say the model's KV bytes per "
                        "block; allowed: --kv-offloading-blocks")
    return offloading_blocks(spec.kv_offloading_size, per_block, spec.kv_offloading_blocks)


def check_sizes(spec: SimSpec, num_blocks: int, span_s: float) -> None:
    """Refuse, before anything is built, a run that would exhaust memory or sample every step."""
    if not 1 <= spec.replicas <= MAX_REPLICAS:
        raise UserError(f"--replicas: {spec.replicas}; allowed: an integer in 1..{MAX_REPLICAS}")
    total = spec.replicas * (num_blocks + spec.num_cpu_blocks)
    if total > MAX_BLOCKS:
        raise UserError(f"--num-blocks: {spec.replicas} replicas x ({num_blocks} + {spec.num_cpu_blocks} CPU) = "
                         f"{total} KV blocks; allowed: at most {MAX_BLOCKS} in one simulation (one object per block "
                         "in memory)")
    interval, shortest = spec.sample_interval_s, span_s / MAX_SAMPLES
    if interval is not None and not (math.isfinite(interval) and interval > 0 and interval >= shortest):
        raise UserError(f"--sample-interval: {interval!r} s over a {span_s:g} s trace; allowed: a number >= "
                         f"{shortest:.3g} (at most {MAX_SAMPLES} samples; each one is a step off the fast path)")


def sample_interval(spec: SimSpec, trace: Trace, cost: CostModel) -> float:
    """The time-series interval: as given (checked by `check_sizes`), else the trace's arrival span / 100 -
    unless that would take more than MAX_SAMPLES samples in the least time the prompts take to prefill (a burst:
    every request at t = 0, as a lengths-only trace, was sampled every millisecond for as long as it ran, which
    is every step and a million series rows); then that least time / 100."""
    if spec.sample_interval_s is not None:
        return spec.sample_interval_s
    interval = max(float(trace.arrival_s[-1] - trace.arrival_s[0]) / 100.0, 1e-3)
    bound = prefill_bound_s(trace, spec, cost)
    return bound / 100.0 if bound / interval > MAX_SAMPLES else interval


def prefill_bound_s(trace: Trace, spec: SimSpec, cost: CostModel) -> float:
    """A lower bound on the run's length: every prompt token computed in full-budget prefill steps spread over
    the replicas, each priced as a chunk starting at position 0 (the cheapest a chunk of that size can be)."""
    if getattr(cost, "recorded_step_time", None) is not None:
        return 0.0  # a recorded cost prices steps by id, not by shape
    budget = spec.batch[0]
    chunk = StepFeatures(1, budget, budget * budget, 0, 0, 0, -(-budget // spec.kv_block_size), 1, int(budget >= 2))
    steps = int(np.sum(trace.prompt_tokens, dtype=np.int64)) / (budget * spec.replicas)
    return steps * float(cost.step_times(chunk))


def simulate(trace: Trace, spec: SimSpec, goodput: dict[str, float | None] | None = None, *,
             processes: int = 1) -> ServingResult:
    """Replay `trace` as recorded, every request to its end; `goodput`: per-request bounds for request_goodput.
    `processes` > 1 spreads the replicas of a long round-robin run over that many processes (`sim.parallel`:
    the same result)."""
    check_trace(trace)
    if spec.disaggregation is not None:
        from kvplan.sim.pd_run import simulate_disaggregated

        return simulate_disaggregated(trace, spec, spec.disaggregation, goodput)
    router = make_router(spec.router)
    cost, num_blocks = build_cost(spec)
    cache, config = build_configs(spec, trace, num_blocks, cost)
    interval = sample_interval(spec, trace, cost)
    trace, front = through_frontend(spec, trace)
    # A recorded cost prices steps one by one, by id; token times are recorded step by step.
    fast_path = spec.fast_path and spec.cost != "recorded" and not spec.record_tokens
    if worth_parallel(spec.router, spec.replicas, processes, spec.record_tokens, len(trace),
                      bool(cache.kv_shared_blocks)):
        cluster: Cluster | MergedCluster = run_parallel(trace, spec.replicas, cache, config, cost, interval,
                                                        fast_path, processes, spec.kv_offloading_layerwise)
    else:
        cluster = Cluster(trace, spec.replicas, router, cache, config, cost, sample_interval_s=interval,
                          fast_path=fast_path, record_tokens=spec.record_tokens,
                          layerwise=spec.kv_offloading_layerwise)
        cluster.run()
    result = collect(cluster, num_blocks, goodput, front)
    failed = int(np.count_nonzero((trace.prompt_tokens < 1) | (trace.output_tokens < 1)))
    result.info.update(max_model_len=cache.max_model_len, vllm_version=spec.vllm_version, rejected_failed=failed,
                       rejected_over_length=over_length(trace, cache.max_model_len),
                       max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs)
    return result


def through_frontend(spec: SimSpec, trace: Trace) -> tuple[Trace, FrontendRun | None]:
    """The trace as the engine receives it (each request after the API server's latency, queue and work) and the
    front end's run, for an OpenAI-server simulation; the trace unchanged and None otherwise (sim.frontend)."""
    cost = frontend_for(spec.entry_point, spec.api_server_latency_ms)
    if cost is None:
        return trace, None
    front = FrontendRun.start(cost, trace.arrival_s, trace.prompt_tokens, trace.output_tokens, spec.replicas)
    return trace.with_columns(arrival_s=front.engine_arrival_s), front


def client_view(log: RequestLog, request_ids: np.ndarray, series: pd.DataFrame, front: FrontendRun | None
                ) -> tuple[pd.DataFrame, dict | None]:
    """The per-request table (`log`'s, named by `request_ids`) as clients see it, and the front end's info (None
    without an API server)."""
    columns = log.raw_columns(request_ids)
    if front is None:
        return pd.DataFrame(latency_columns(columns), copy=False), None
    busy = series[series["running"] > 0]["running"] if len(series) else series.get("running", pd.Series(dtype=float))
    per_replica = float(busy.mean()) if len(busy) else 1.0  # the batch a step's outputs come in
    table = pd.DataFrame(latency_columns(front.client_columns(columns, per_replica)), copy=False)
    return table, front.info(table, per_replica)


def collect(cluster: Cluster | MergedCluster, num_blocks: int,
            goodput: dict[str, float | None] | None = None, front: FrontendRun | None = None) -> ServingResult:
    series = pd.DataFrame(cluster.series_rows(), columns=list(SERIES_COLUMNS))
    table, front_info = client_view(cluster.log, cluster.trace.request_id, series, front)
    duration = float(table["finish_s"].max() - table["arrival_s"].min()) if len(table) else 0.0
    replicas = cluster.replicas
    counters = cluster.counters()
    kv = kv_summary(sum(r.usage_seconds for r in replicas), duration * len(replicas),
                    max(r.peak_usage for r in replicas), series, counters)
    rejected = cluster.rejected()
    info = {"num_blocks": num_blocks, "block_size": replicas[0].block_size, "replicas": len(replicas),
            "steps": sum(r.num_steps for r in replicas), "fast_steps": sum(r.num_fast_steps for r in replicas),
            "rejected": len(rejected), "rejected_first": references(cluster.trace, rejected),
            **work_seconds(replicas)}
    if front_info is not None:
        info["frontend"] = front_info
    info.update(serving_extras(counters))
    groups = kv_groups_info(replicas, num_blocks, duration)
    if groups is not None:
        info["kv_groups"] = groups
    tokens = None
    if replicas[0].token_times is not None:  # (then every replica's)
        tokens = {key: times for r in replicas if r.token_times is not None for key, times in r.token_times.items()}
    return ServingResult(summarize(table, cluster.itl(), kv, goodput), table, series, info, tokens,
                     rejected_rows(cluster.trace, rejected))


def serving_extras(counters: dict[str, int]) -> dict[str, dict]:
    """`info`'s LoRA adapter loads (`sim.lora`) and speculative decoding's figures (`sim.spec_decode`), for the
    runs that have them, from the replicas' summed counters (a whole run's, or a probe window's)."""
    out: dict[str, dict] = {}
    if "lora_gpu_loads" in counters:  # adapters read from disk / copied into a device slot
        out["lora"] = {"disk_loads": counters["lora_disk_loads"], "gpu_loads": counters["lora_gpu_loads"]}
    if "num_draft_tokens" in counters:
        from kvplan.sim.spec_decode import speculation_info

        out["speculative"] = speculation_info(counters)
    return out


def work_seconds(replicas: list) -> dict[str, float]:
    """`info`'s GPU time, summed over the replicas in their order: busy_s (every step) and prefill_busy_s (its
    prefill share, `sim.replica`), which `sim.dollars` splits a deployment's cost by."""
    return {"busy_s": sum(r.busy_seconds for r in replicas), "prefill_busy_s": sum(r.prefill_seconds for r in replicas)}


def kv_groups_info(replicas: list, num_blocks: int, duration: float) -> dict | None:
    """`info["kv_groups"]` of a hybrid model (absent for a uniform one): per attention kind, its groups, layers
    and window, and the share of the one block pool its groups' tables held - time-weighted over the run (as
    kv_usage_mean, over every replica) and at the peak step - beside the block count each request of it needs."""
    layout = replicas[0].kv_layout
    if layout is None:
        return None
    total = num_blocks * duration * len(replicas)
    out: dict[str, dict] = {}
    for k, kind in enumerate(kv_kinds(layout)):
        groups = [g for g in layout.groups if g.kind == kind]
        seconds = sum(r.kind_block_seconds[k] for r in replicas)
        peak = max(r.kind_peak_blocks[k] for r in replicas)
        out[kind] = {"groups": len(groups), "layers": sum(g.num_layers for g in groups),
                     "sliding_window": groups[0].sliding_window or None, "group_size": layout.group_size,
                     "usage_mean": seconds / total if total else 0.0, "usage_peak": peak / num_blocks,
                     "blocks_peak": peak}
    return out


def kv_kinds(layout: KVLayout) -> list[str]:
    """The layout's attention kinds, in group order (the order `Replica` accounts them in)."""
    return list(dict.fromkeys(g.kind for g in layout.groups))
