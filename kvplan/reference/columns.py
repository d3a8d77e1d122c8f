"""What each column of an experiment's tables means: runs.parquet (one row per run) and points.parquet (one row
per point), as `kvplan.experiments.results` builds them.

The tables are built from dict literals there, so their names are declared here once more, with a meaning
each; tests/docs run a small search and fail when a table has a column this list lacks, or lists one the
tables no longer have. A *family* (`engine.<setting>`, every summary metric) stands for the columns its
pattern names. `when` says which experiments have the column.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvplan.experiments import min_cost, model_range, results
from kvplan.experiments.pd_block import SWEEP_KEYS
from kvplan.experiments.schema import CLUSTER, ENGINE, SWEEPABLE
from kvplan.results.summary import SUMMARY_KEYS
from kvplan.sim.dollars import COST_KEYS, MEANINGS
from kvplan.sim.pd_spec import OPTIONS


@dataclass(frozen=True, slots=True)
class Column:
    """One column, or a family of them: `members` are the names it stands for (empty: just `name`)."""

    name: str
    meaning: str
    when: str = "always"
    members: tuple[str, ...] = ()

    def names(self) -> tuple[str, ...]:
        return self.members or (self.name,)


SEARCH = "a search"
RATE_SEARCH = "a max_rate or max_goodput search"
SUMMARY = Column("(every summary metric)", "the run's summary: see [Summary metrics](#summary-metrics)",
                 members=SUMMARY_KEYS)
MODEL_ERROR = (
    Column("model_error_source", "which source priced the point's GPU (a measured profile, the fitted laws, ...)"),
    Column("model_error_band_lo_pct", "the low edge of that source's step-time error band, in percent"),
    Column("model_error_band_hi_pct", "the high edge of that source's step-time error band, in percent"),
)
RANGE = (
    Column("capacity_model_lo", "the answer at the error band's low edge (NaN: not searched, or outside the range)",
           SEARCH),
    Column("capacity_model_hi", "the answer at the error band's high edge (NaN: not searched, or outside the "
                                "range)", SEARCH),
)
COST = tuple(Column(key, MEANINGS[key]) for key in COST_KEYS)  # sim.dollars: every run's and point's cost
PROBE_MEANINGS = {  # results.PROBE_COLUMNS: the probe's counts and stability signals (sim.stability)
    "verdict": "the probe's verdict before any SLO is read: stable, backlogged, overloaded, or burst (a recorded "
               "trace replayed: no steady state to judge)",
    "warmup_requests": "requests arriving in the warm-up (served, not measured)",
    "measured_requests": "requests arriving in the measurement window",
    "cooldown_requests": "requests arriving in the cool-down (served, not measured)",
    "unfinished_requests": "requests neither finished nor rejected when the run ended",
    "completed_measured": "measured requests that finished",
    "queue_first": "mean waiting requests (all replicas) over the window's first half",
    "queue_second": "mean waiting requests over the window's second half",
    "ttft_first_ms": "median TTFT of the measured requests arriving in the window's first half",
    "ttft_second_ms": "median TTFT of those arriving in its second half",
    "p99_queue_delay_ms": "p99 scheduling delay (arrival to first scheduled) of the measured requests: the "
                          "stability gate compares it with probe.max_queue_delay_s",
    "stopped_early": "why the overload check stopped the run (empty when it did not)",
    "duration_s": "the probe's duration D in seconds (null for a burst run): in runs.parquet it takes the place "
                  "of the summary's duration_s",
}
RUN_COLUMNS: tuple[Column, ...] = (
    Column("point", "the point's index (points.parquet's row)"),
    Column("label", "the point's label: its swept values"),
    Column("seed", "the run's seed"),
    Column("probe", "the value a search probed (of the key its target varies); NaN without a search"),
    Column("run", "the run's key: its directory under runs/"),
    Column("model", "the model"),
    Column("hardware", "the GPU (or profile)"),
    Column("engine.<setting>", "every engine setting of the run's configuration", members=tuple(
        f"engine.{k}" for k in ENGINE)),
    Column("cluster.<key>", "the cluster's replicas and router", members=tuple(f"cluster.{k}" for k in CLUSTER)),
    Column("disaggregation", "the run's deployment in short: co-located, or xPyD with the pools' TP when set"),
    Column("disaggregation.<option>", "the run's prefill/decode pools (experiments.pd_block; null in each: "
           "co-located)", members=tuple(f"disaggregation.{k}" for k in OPTIONS)),
    Column("gpus", "the deployment's GPUs: replicas x TP x PP, or each P/D pool's replicas x its TP x its PP"),
    Column("workload.<key>", "the load: mode, rate, concurrency, rate_scale; and the LoRA adapters its sessions "
           "were spread over (lora_adapters, 0: as the trace names them; lora_skew, their Zipf exponent)",
           members=tuple(f"workload.{k}" for k in ("mode", "rate", "concurrency", "rate_scale", "lora_adapters",
                                                   "lora_skew"))),
    Column("step_scale", "the factor on every step's compute time: 1 for the answer's runs, a band edge's factor "
                         "for the model-range searches' runs"),
    *MODEL_ERROR,
    SUMMARY,
    Column("offered_rate_rps", "the request rate offered to the servers, requests per second"),
    Column("num_blocks", "KV blocks per replica"),
    Column("rejected", "requests the scheduler refused (they can never run)"),
    Column("attainment", "the share of requests meeting every per-request SLO bound (NaN without slo.attainment)"),
    *(Column(key, PROBE_MEANINGS[key]) for key in results.PROBE_COLUMNS if key != "duration_s"),
    Column("slo_met", "whether the run met every SLO (a probe that is not stable never does)"),
    Column("slo_broken", "the SLO lines it broke, separated by '; '"),
    Column("failures", "the criteria the run failed, as records (limit, the key that moves it, kind, value, "
                       "bound, excess over the bound, text); empty when it met every one"),
    *COST,
    *RANGE,
)
MIN_COST_SEARCH = "a min_cost search"
MIN_COST = (
    Column("status", f"the shape's place in the answer: {', '.join(min_cost.STATUSES)}", MIN_COST_SEARCH),
    Column("status_reason", "why a shape was rejected or left unsearched (memory figures, the gate's line, the "
                            "failed SLOs, the cost bound); empty for a winner or a feasible shape", MIN_COST_SEARCH),
    Column("price_per_gpu_hour", "$ per GPU-hour of the shape's GPU (a P/D shape: its decode pool's; the "
                                 "experiment's prices, its kind)",
           MIN_COST_SEARCH),
    Column("lower_bound_replicas", "the analytic bound's fewest replicas for the offered rate (experiments.bound)",
           MIN_COST_SEARCH),
    Column("lower_bound_per_hour", "$/h of those replicas (+ a P/D shape's prefill pool): no search of the shape "
                                   "can answer cheaper", MIN_COST_SEARCH),
    Column("shape_cost_per_hour", "$/h at the shape's answer: replicas x GPUs per replica x $/GPU-hour, + a P/D "
                                  "shape's prefill pool at its GPU's price (NaN: no answer)", MIN_COST_SEARCH),
    Column("shape_cost_low", "$/h at the lowest seed's answer", MIN_COST_SEARCH),
    Column("shape_cost_high", "$/h at the highest seed's answer", MIN_COST_SEARCH),
    Column("shape_cost_model_lo", "$/h at the low end of the answer's model range (the replicas re-found with the "
                                  "GPU model's step-time band; NaN: no range)", MIN_COST_SEARCH),
    Column("shape_cost_model_hi", "$/h at the high end of the answer's model range", MIN_COST_SEARCH),
    Column("throughput_per_gpu", "tokens per second per GPU at the answer (the frontier's throughput axis)",
           MIN_COST_SEARCH),
    Column("usd_per_m_tokens", "$ per million tokens (input and output) at the answer (the frontier's cost axis)",
           MIN_COST_SEARCH),
    Column("frontier_throughput", "on the Pareto frontier of throughput per GPU against the latency metric",
           MIN_COST_SEARCH),
    Column("frontier_cost", "on the Pareto frontier of $ per million tokens against the latency metric",
           MIN_COST_SEARCH),
)
assert tuple(c.name for c in MIN_COST) == min_cost.COLUMNS  # the module's own columns, renamed in both or neither
POINT_COLUMNS: tuple[Column, ...] = (
    Column("point", "the point's index"),
    Column("label", "the point's label: its swept values"),
    Column("<swept key>", "one column per key the sweep varies (`engine.block_size`, `cluster.replicas`, ...)",
           "a sweep", members=(*SWEEPABLE, *SWEEP_KEYS)),
    Column("gpus", "the deployment's GPUs, averaged over the runs at the answer (a replica search: the answer's "
           "replicas x GPUs per replica)"),
    Column("goodput_per_gpu", "request_goodput (request_throughput without an SLO) over gpus, at the answer"),
    *MODEL_ERROR,
    Column("seeds", "how many seeds the point's answer is over"),
    Column("slo_met", "whether every seed's run at the answer met the SLOs"),
    SUMMARY,
    Column("offered_rate_rps", "the offered request rate, averaged over the seeds' runs at the answer"),
    Column("attainment", "the share of requests meeting every per-request bound (NaN without slo.attainment)"),
    *(Column(key, f"{PROBE_MEANINGS[key]}, averaged over the seeds") for key in results.COUNTS),
    Column("verdict", "the runs' verdicts at the answer, joined by '/'"),
    Column("objective_low", "the lowest seed's value of the objective metric (a search: at that seed's answer)"),
    Column("objective_high", "the highest seed's value of the objective metric (a search: at that seed's answer)"),
    Column("answer", "the median of the seeds' answers (NaN: outside the searched range)", SEARCH),
    Column("answer_low", "the lowest seed's answer (NaN when a seed found none)", SEARCH),
    Column("answer_high", "the highest seed's answer", SEARCH),
    *RANGE,
    Column("model_range_note", "why the model range is missing, where it is", SEARCH),
    Column("answers", "every seed's answer", SEARCH),
    Column("search_outcome", "found, or why a seed found no answer", SEARCH),
    Column("probes", "how many probes the point's searches ran", SEARCH),
    Column("skipped", "the probed values the analytic bound decided fail without simulating them, and the bound "
                      "(experiments.bound); empty when none", SEARCH),
    Column("answer_per_gpu", "the answer over gpus: req/s per GPU (what search.rank_by per_gpu ranks by)",
           RATE_SEARCH),
    Column("answer_per_usd", "requests per $ at the answer: answer x 3600 / cost_per_hour (what search.rank_by "
                             "per_usd ranks by; NaN: not priced)", RATE_SEARCH),
    Column("capacity_rps", "requests per second served at the answer", SEARCH),
    Column("capacity_tok_s", "tokens per second served at the answer", SEARCH),
    Column("gpus_per_replica", "tensor x pipeline parallel size (a P/D point: of a decode replica)",
           "a min_replicas search"),
    Column("fixed_gpus", "the GPUs the replica search does not vary: a P/D point's prefill pool (0 co-located); "
                         "gpus = fixed_gpus + answer x gpus_per_replica", "a min_replicas search"),
    Column("binding_limit", "what stopped the answer from being better: an SLO (p99 TTFT, ...), KV memory, a "
                            "stability gate or a bound of the searched range; for a plain point the SLO it fails "
                            "or has the least headroom on ('none' without SLOs)"),
    Column("binding_key", "the experiment file's key that moves the binding limit (slo.p99_ttft_ms, "
                          "probe.max_queue_delay_s, search.high, ...)"),
    Column("binding_detail", "the failure that named it, in words, with its value and bound"),
    Column("binding_votes", "how many of the point's searches (or runs) named the binding limit"),
    Column("binding_of", "how many searches (or runs) voted"),
    Column("binding_at", "the probed value at which the binding limit failed (NaN for a plain point)"),
    *(Column(c.name, c.meaning + (", averaged over the point's runs at the answer" if c.name in results.COST_NUMBERS
                                  else ", of the point's first run")) for c in COST),
    *MIN_COST,
)
# the model range's columns are the module's own: a renamed one must be renamed here too
assert {c.name for c in MODEL_ERROR} == set(model_range.POINT_COLUMNS)
assert {c.name for c in RANGE} == set(model_range.RANGE_COLUMNS)


def undocumented(columns: Iterable[str], declared: tuple[Column, ...],
                 absent: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """(columns no entry names, fixed entries the columns lack): both empty when `declared` describes a table
    that has every conditional column but those of the experiments `absent` names (`when`). A family needs one
    member present."""
    columns = list(columns)
    named = {name for c in declared for name in c.names()}
    unknown = [c for c in columns if c not in named]
    missing = [c.name for c in declared if c.when not in absent and not set(c.names()) & set(columns)]
    return unknown, missing
