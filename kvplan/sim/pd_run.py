"""Build and run a disaggregated simulation (`SimSpec.disaggregation`), and its result: the per-request table as
the client behind vLLM's P/D proxy sees it, with each request's TTFT split into its parts (`sim.disagg`).

Table columns beyond the usual ones (`results.request_table`), per request: `prefill_replica`, `prefill_ttft_ms`
(the prefill engine's arrival to its token: queueing and prefill), `api_servers_ms` (with entry_point
openai_server, `sim.pd_frontend`: the prefill instance's API server before its engine, the hand-off's hop and the
decode instance's API server, and the first token's delivery; 0 without), `decode_admission_wait_ms` (the decode
engine's arrival - the hand-off without API servers - to the transfer's start, plus the transfer's end to the step
that schedules it), `transfer_ms`
(link queueing, latency and bytes), `first_decode_step_ms` (that step) and `kv_transfer_bytes` (every rank's).
`replica` is the decode replica (numbered after the prefill ones), `first_scheduled_s` and `cached_prompt_tokens`
are the prefill replica's (queueing_ms is the prefill queue). TTFT = prefill_ttft + api_servers +
decode_admission_wait + transfer + first_decode_step. The summary adds `mean_/median_/p99_` of each part
(`PART_KEYS`), beside the usual keys.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pandas as pd

from kvplan.errors import UserError
from kvplan.results.rejected import references, rejected_rows
from kvplan.results.request_table import add_latency_columns
from kvplan.results.serving_result import ServingResult
from kvplan.results.summary import kv_summary, summarize
from kvplan.sim.cost import CostModel
from kvplan.sim.cost.analytic import AnalyticCost
from kvplan.sim.cost.scaled import scaled
from kvplan.sim.disagg import DisaggCluster, RecordedHandoffs
from kvplan.sim.frontend import frontend_for
from kvplan.sim.pd_frontend import PDFrontend
from kvplan.sim.pd_spec import OPTIONS, Disaggregation
from kvplan.sim.pd_transfer import link_figures, make_link, model_layout, rank_bytes_per_token
from kvplan.sim.replica import SERIES_COLUMNS
from kvplan.sim.routers import make_router
from kvplan.sim.spec import SimSpec
from kvplan.traces import Trace

# what a pool sets for itself: a cost measured on one device cannot price it
SHAPE_FIELDS = ("prefill_hardware", "decode_hardware", "prefill_tensor_parallel_size", "decode_tensor_parallel_size")
PARTS = ("prefill_ttft_ms", "api_servers_ms", "decode_admission_wait_ms", "transfer_ms", "first_decode_step_ms")
PART_KEYS = tuple(f"{stat}_{part}" for part in PARTS for stat in ("mean", "median", "p99"))


def simulate_disaggregated(trace: Trace, spec: SimSpec, pd: Disaggregation,
                           goodput: dict[str, float | None] | None = None) -> ServingResult:
    from kvplan.sim.run import sample_interval

    cluster, info, extra = build_cluster(trace, spec, pd, lambda d_spec, d_cost: sample_interval(d_spec, trace,
                                                                                                d_cost))
    cluster.run()
    result = collect(cluster, goodput)
    info["pools"] = pools_info(cluster, info)
    result.info.update(disaggregation=info, **extra)
    return result


def build_cluster(trace: Trace, spec: SimSpec, pd: Disaggregation, interval: Callable[[SimSpec, CostModel], float],
                  step_scale: float = 1.0, lengths: Trace | None = None, *, profiles: tuple[str, str] | None = None,
                  recorded: RecordedHandoffs | None = None) -> tuple[DisaggCluster, dict, dict]:
    """The pools, links and cluster of a P/D run, not yet run; with info["disaggregation"] (less its pools: they
    are known after the run, `pools_info`) and the run's other info keys. `interval(decode spec, decode cost)`:
    the sampling interval; `step_scale` multiplies every step's compute time in both pools (`sim.cost.scaled`);
    `lengths`: the trace whose lengths size the pools' scheduler limits (a probe's population; default `trace`).
    A calibrated or recorded cost (one device's measurements) prices pools that run on the run's own hardware and
    TP; `profiles`: each pool's own (prefill, decode) profile - a live pair's recorded steps, one per instance -
    and `recorded` the live pair's handoffs (`sim.disagg`)."""
    from kvplan.sim.run import build_configs, build_cost, over_length

    if spec.cost != "analytic" and any(getattr(pd, f) is not None for f in SHAPE_FIELDS):
        raise UserError(f"--cost: {spec.cost}: it was measured on one device, and the pools set their own "
                        f"hardware or TP; allowed: analytic, or no {', '.join(OPTIONS[f].flag for f in SHAPE_FIELDS)}")
    p_spec, d_spec = pd.pool_specs(spec)
    if profiles is not None:
        p_spec, d_spec = replace(p_spec, profile=profiles[0]), replace(d_spec, profile=profiles[1])
    pools = []
    for pool_spec in (p_spec, d_spec):
        cost, num_blocks = build_cost(pool_spec)
        cache, config = build_configs(pool_spec, trace if lengths is None else lengths, num_blocks, cost)
        pools.append((pool_spec, cost, num_blocks, cache, config))
    (_, p_cost, p_blocks, p_cache, p_config), (_, d_cost, d_blocks, d_cache, d_config) = pools
    if p_cache.block_size != d_cache.block_size:
        raise UserError(f"--block-size: the pools' block sizes differ ({p_cache.block_size}, {d_cache.block_size});"
                        " allowed: one --block-size for both")
    p_tp, d_tp = pd.tp(spec)
    p_pp, d_pp = p_spec.pipeline_parallel_size, d_spec.pipeline_parallel_size
    bs = d_cache.block_size
    if isinstance(d_cost, AnalyticCost):
        model, kv_bytes = d_cost.model, d_cost.kv_dtype_bytes
    else:
        model, kv_bytes = model_layout(spec)
    per_rank, busiest = rank_bytes_per_token(model, kv_bytes, p_tp, d_tp, p_pp, d_pp)
    bandwidth, latency = link_figures(pd, p_spec.hardware, d_spec.hardware)
    links = [make_link(pd, bandwidth, latency, busiest * bs) for _ in range(pd.decode_replicas)]
    moved = per_rank * bs * d_tp * d_pp  # every decode rank's bytes per block
    every = interval(d_spec, d_cost)
    # the API servers (sim.pd_frontend); a live pair's record has its own hops (its proxy sends to the engines)
    front_cost = None if recorded is not None else frontend_for(spec.entry_point, spec.api_server_latency_ms)
    front = None if front_cost is None else \
        PDFrontend.start(front_cost, trace, pd.prefill_replicas, pd.decode_replicas)
    engine_trace = trace if front is None else trace.with_columns(arrival_s=front.prefill.engine_arrival_s)
    cluster = DisaggCluster(engine_trace, (pd.prefill_replicas, make_router(pd.prefill_router), p_cache, p_config,
                                    scaled(p_cost, step_scale)),
                            (pd.decode_replicas, make_router(pd.decode_router), d_cache, d_config,
                             scaled(d_cost, step_scale)), links, moved, sample_interval_s=every,
                            fast_path=spec.fast_path and spec.cost != "recorded", record_tokens=spec.record_tokens,
                            recorded=recorded, decode_entry=None if front is None else front.decode_entry)
    cluster.frontend = front
    info = {"link_bandwidth_bytes_per_s": bandwidth, "link_latency_s": latency, "kv_link": pd.kv_link,
            "kv_bytes_per_token_per_decode_rank": per_rank, "prefill_tp": p_tp, "decode_tp": d_tp,
            "prefill_pp": p_pp, "decode_pp": d_pp,
            "prefill_replicas": pd.prefill_replicas, "decode_replicas": pd.decode_replicas,
            "prefill_hardware": p_spec.hardware, "decode_hardware": d_spec.hardware,
            "prefill_num_blocks": p_blocks, "decode_num_blocks": d_blocks,
            "times": "the engines' and an instant proxy's: no API server in front of either pool" if front is None
            else "as a client of the proxy sees them: each instance's API server modelled (sim.pd_frontend)"}
    failed = int(np.count_nonzero((trace.prompt_tokens < 1) | (trace.output_tokens < 1)))
    extra = {"max_model_len": d_cache.max_model_len, "vllm_version": spec.vllm_version,
             "num_blocks": d_blocks,  # the decode pool's per replica (the prefill pool's: disaggregation)
             "rejected_failed": failed, "rejected_over_length": over_length(trace, d_cache.max_model_len),
             "max_num_batched_tokens": d_config.max_num_batched_tokens, "max_num_seqs": d_config.max_num_seqs}
    return cluster, info, extra


def pools_info(cluster: DisaggCluster, info: dict) -> list[dict]:
    """Each pool's role, hardware, GPUs (replicas x its TP x its PP) and GPU time (what
    `sim.dollars.pools_cost_fields` prices)."""
    return [{"role": role, "hardware": info[f"{role}_hardware"],
             "gpus": len(pool.replicas) * info[f"{role}_tp"] * info[f"{role}_pp"],
             "busy_s": sum(r.busy_seconds for r in pool.replicas),
             "prefill_busy_s": sum(r.prefill_seconds for r in pool.replicas)}
            for role, pool in (("prefill", cluster.prefill), ("decode", cluster.decode))]


def decode_batch(cluster: DisaggCluster) -> float:
    """The decode replicas' mean running batch over their busy samples (the batch a step's tokens are
    detokenized in, `FrontendCost.delivery_s`)."""
    running = [row[2] for r in cluster.decode.replicas for row in r.series if row[2] > 0]
    return float(np.mean(running)) if running else 1.0


def request_table(cluster: DisaggCluster) -> pd.DataFrame:
    """The client's per-request table with the TTFT parts (see the module); with the API servers modelled, the
    engines' times are kept beside the client's (`*_engine_s`, `*_engine_ms`: the prefill engine's arrival, the
    decode engine's tokens)."""
    frame = cluster.decode.log.raw_frame()
    rows = frame["request"].to_numpy()
    prefill = cluster.prefill.log.raw_frame().set_index("request")
    front = cluster.frontend
    engine_arrival = cluster.trace.arrival_s[rows]
    arrival = engine_arrival if front is None else front.prefill.client_arrival_s[rows]
    handoff = np.asarray(cluster.handoff_s)[rows]
    reach = np.asarray(cluster.decode_arrival_s)[rows]
    start = np.asarray(cluster.transfer_start_s)[rows]
    end = np.asarray(cluster.transfer_end_s)[rows]
    decode_scheduled = frame["first_scheduled_s"].to_numpy()
    first_engine = frame["first_token_s"].to_numpy()
    delivery = 0.0 if front is None else front.cost.delivery_s(decode_batch(cluster))
    if front is not None:
        frame["engine_arrival_s"] = engine_arrival
        frame["first_token_engine_s"] = frame["first_token_s"]
        frame["finish_engine_s"] = frame["finish_s"]
        frame["first_token_s"] = frame["first_token_s"] + delivery
        frame["finish_s"] = frame["finish_s"] + delivery
    frame["arrival_s"] = arrival
    frame["first_scheduled_s"] = prefill["first_scheduled_s"].reindex(rows).to_numpy()
    frame["cached_prompt_tokens"] = prefill["cached_prompt_tokens"].reindex(rows).to_numpy()
    frame["prefill_replica"] = np.asarray(cluster.prefill_replica)[rows]
    frame["prefill_ttft_ms"] = (handoff - engine_arrival) * 1e3
    # the hand-off's hop: the API servers' part when they are modelled, else the admission wait's (a live pair's
    # recorded proxy hop included, as the live side counts it)
    entered = reach if front is not None else handoff
    frame["api_servers_ms"] = ((engine_arrival - arrival) + (entered - handoff) + delivery) * 1e3
    frame["decode_admission_wait_ms"] = ((start - entered) + (decode_scheduled - end)) * 1e3
    frame["transfer_ms"] = (end - start) * 1e3
    frame["first_decode_step_ms"] = (first_engine - decode_scheduled) * 1e3
    frame["kv_transfer_bytes"] = np.asarray(cluster.transfer_bytes)[rows]
    frame.insert(0, "request_id", np.asarray(cluster.trace.request_id)[rows])
    return add_latency_columns(frame)


def frontend_info(cluster: DisaggCluster, table: pd.DataFrame) -> dict | None:
    """What the API servers did over the run (`PDFrontend.info`); None without them."""
    front = cluster.frontend
    if front is None:
        return None
    first = table[table["sample"] == 0] if len(table) else table
    span = float(table["finish_s"].max() - table["arrival_s"].min()) if len(table) else 0.0
    return front.info(table["api_servers_ms"].to_numpy(dtype=float), decode_batch(cluster), span,
                      len(cluster.prefill.replicas), len(cluster.decode.replicas),
                      float(table["output_tokens"].sum()), float(first["prompt_tokens"].sum()), len(first))


def part_summary(table: pd.DataFrame) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for part in PARTS:
        values = table[part].to_numpy(dtype=float) if len(table) else np.array([])
        for stat, fn in (("mean", np.mean), ("median", np.median), ("p99", lambda v: np.percentile(v, 99))):
            out[f"{stat}_{part}"] = float(fn(values)) if len(values) else None
    return out


def collect(cluster: DisaggCluster, goodput: dict[str, float | None] | None) -> ServingResult:
    series = pd.DataFrame(cluster.series_rows(), columns=list(SERIES_COLUMNS))
    table = request_table(cluster)
    duration = float(table["finish_s"].max() - table["arrival_s"].min()) if len(table) else 0.0
    replicas = cluster.replicas
    kv = kv_summary(sum(r.usage_seconds for r in replicas), duration * len(replicas),
                    max(r.peak_usage for r in replicas), series, cluster.counters())
    rejected = cluster.rejected()
    info = {"replicas": len(replicas), "block_size": replicas[0].block_size,
            "steps": sum(r.num_steps for r in replicas), "fast_steps": sum(r.num_fast_steps for r in replicas),
            "rejected": len(rejected), "rejected_first": references(cluster.trace, rejected),
            "busy_s": sum(r.busy_seconds for r in replicas),
            "prefill_busy_s": sum(r.prefill_seconds for r in replicas)}
    front = frontend_info(cluster, table)
    if front is not None:
        info["frontend"] = front
    summary = {**summarize(table, cluster.itl(), kv, goodput), **part_summary(table)}
    return ServingResult(summary, table, series, info, cluster.token_times(cluster.decode),
                         rejected_rows(cluster.trace, rejected))
