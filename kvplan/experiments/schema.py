"""The experiment file: one YAML document describing what to simulate, what to vary and what "good" means.

    name: quickstart                        # required: names the result set
    description: ...                        # optional, shown in the report
    model: llama-3-8b                       # a built-in model spec, or a path to an HF config.json
    hardware: a100-40gb                     # built-in; cpu-local (the shipped profile of the model); or a
                                            #   calibrated profile (.yaml from `kvplan calibrate`)
    engine: {block_size: 16, ...}           # serving knobs, vLLM's names (ENGINE below)
    cluster: {replicas: 1, router: round_robin}
    disaggregation: {prefill_replicas: 1, decode_replicas: 2}   # prefill/decode pools (experiments.pd_block)
    workload:                               # exactly one of trace / synthetic
      trace: sample:mooncake_style          # a file (relative to this one) or sample:NAME (`kvplan trace samples`)
      mode: sustained                       # how load is offered (the question asked; LOAD below):
                                            #   sustained: open-loop arrivals at `rate` drawn from the trace's
                                            #     population for a fixed duration (sim.probe)
                                            #   concurrency: `concurrency` users in a closed loop
                                            #   burst: the trace as recorded, time-scaled by `rate_scale`
      rate: 12.5                            # sustained: requests per second (null: the trace's own mean rate)
      arrivals: measured                    # sustained: measured (gamma, the trace's CV), poisson, tiled
      concurrency: 32                       # concurrency: users;  think_s: 0  their pause between requests
      format: null                          # detected from the content unless named
      skip_bad: false                       # drop malformed rows (counted) instead of stopping
      keep_failed: false                    # BurstGPT: keep failed requests (rejected, counted)
      hash_granularity: null                # tokens per prefix hash, overriding the format's
      transforms: {window: [0, 600], sample: 0.5, retime: {process: poisson, rate: 4}, jitter: 3,
                   clip_context: 8192, expand_block: 16}   # applied in this order
      synthetic: {requests: 500, arrivals: ..., lengths: ...}   # a `kvplan trace synth` spec, inline
      rate_scale: 1.0                       # burst: multiply the recorded trace's request rate
    probe: {duration_s: 600, min_requests: 1000}   # sustained/concurrency: how long, what is trimmed (PROBE)
    sweep:                                  # points = the grid's cross product x the zipped rows
      grid: {engine.block_size: [16, 32], engine.eviction_policy: [lru, s3fifo]}
      zip: {engine.num_blocks: [2000, 4000], cluster.replicas: [2, 1]}
    search:                                 # per point and seed, by bisection on the SLOs and stability
      target: max_rate                      # max_rate: the highest sustained workload.rate (req/s) that is
      low: 0.25                             #   stable and meets the SLOs; max_goodput: the same with the
      high: 256                             #   attainment SLO (DistServe's goodput); max_concurrency: the most
      tolerance: 0.05                       #   users; max_burst_scale: the highest burst rate_scale;
      combine: median                       #   min_replicas: the fewest cluster.replicas (a P/D point: decode
                                            #   replicas, pd_block.varied_key); min_cost: the cheapest
                                            #   point at its fewest replicas (min_cost.py). combine: median of
                                            #   the seeds' answers with their range, or all (every seed must pass)
      prune: true                           # min_cost only (min_cost.py): skip shapes whose analytic cost bound
      latency: p99_ttft_ms                  #   is above the cheapest found; the frontier's latency metric
      model_range: recommended              # the answer re-searched at the model-error band's edges: for the
                                            #   recommended point, every_point, or none (search.py)
      rank_by: per_gpu                      # max_rate/max_goodput: rank by the answer (rate), per GPU or per $
                                            #   (rank_by.py; default per_gpu when the points' GPUs differ)
    slo:                                    # a run meets its SLO when every line holds
      p99_ttft_ms: 2000                     # {p50,p90,p99}_{ttft,tpot,itl,e2el}_ms: upper bounds
      attainment: {ttft_ms: 1000, tpot_ms: 80, fraction: 0.95}  # share of requests within all the bounds
    objective: {metric: p90_e2el_ms, goal: min}   # ranks the points that meet the SLOs (the recommendation)
    seeds: [0, 1]                           # or repeats: N (seeds 0..N-1): every random draw of the workload;
                                            #   default [0] ([0, 1, 2] with a search that draws)
    outputs: {tables: true, plots: true, report: true}
    prices: {kind: on_demand, h100-sxm: 2.5, file: prices.yaml}   # over the built-in dated $/GPU-hour table
                                            #   (sim.specs.prices; docs/cost.md): every point's cost fields

Validation happens on load, before any run: every error names the key path, the bad value and what is allowed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from kvplan.engine.core.settings import KEY_ALIASES, for_side
from kvplan.errors import ConfigError, UserError
from kvplan.experiments import pd_block, rank_by
from kvplan.experiments.fields import Field, SchemaError, check_fields, check_mapping
from kvplan.experiments.min_cost_keys import COST_SEARCH, check_cost_keys
from kvplan.experiments.written import check_components, parse_engine, spellings
from kvplan.limits import MAX_REPLICAS, MAX_TOKENS, MAX_USERS, REPLICAS_WHY, USERS_WHY
from kvplan.results.goodput import REQUEST_BOUNDS
from kvplan.results.summary import SUMMARY_KEYS
from kvplan.sim.probe import Probe
from kvplan.sim.routers import ROUTERS
from kvplan.sim.specs.prices import PriceTable, price_table
from kvplan.traces.arrivals import MAX_RATE, MIN_RATE, RATE_WHY
from kvplan.traces.schema import short_repr
from kvplan.traces.steady import ARRIVALS, MAX_PROBE_REQUESTS

TOP_KEYS = ("name", "description", "model", "hardware", "engine", "cluster", "disaggregation", "workload", "probe",
            "sweep", "search", "slo", "objective", "seeds", "repeats", "outputs", "prices")

# Every setting the simulator reads, as its declaration says (engine.core.settings): names, defaults, ranges.
ENGINE: dict[str, Field] = {s.name: s.side_field("sim") for s in for_side("sim")}
CLUSTER: dict[str, Field] = {"replicas": Field("int", 1, minimum=1, maximum=MAX_REPLICAS, why=REPLICAS_WHY,
                                               help="replicas serving the workload, each with the engine settings"),
                             "router": Field("choice", "round_robin", tuple(ROUTERS),
                                             help="which replica each request goes to")}
TOP: dict[str, Field] = {"model": Field("str", "llama-3-8b", help="a built-in model spec, or a path to an HF "
                                        "config.json"),
                         "hardware": Field("str", "h100-sxm", help="a built-in GPU; cpu-local (the shipped profile "
                                           "of the model); or a calibrated profile (.yaml from `kvplan calibrate`)")}
# How a trace file is read (`kvplan trace --help` has the same options): the only keys besides `trace`/`format`
# that apply to a file and not to a synthetic workload.
TRACE_LOAD: dict[str, Field] = {
    "skip_bad": Field("bool", False, help="drop malformed rows (counted) instead of stopping"),
    "keep_failed": Field("bool", False, help="BurstGPT: keep failed requests (rejected, counted)"),
    "hash_granularity": Field("int", None, minimum=1, maximum=MAX_TOKENS, nullable=True,
                              help="tokens per prefix hash, overriding the format's; default: the format's"),
}
# How load is offered: the three questions a capacity can answer (see the module docstring and sim.probe).
MODES = ("sustained", "concurrency", "burst")
RATE_SCALE = Field("float", 1.0, minimum=1e-6, maximum=1e6)  # beyond: arrivals past float64 resolution, or at 0
LOAD: dict[str, Field] = {
    "mode": Field("choice", "sustained", MODES, help="sustained: open-loop arrivals at `rate` drawn from the "
                  "trace's population for a fixed duration; concurrency: `concurrency` users in a closed loop; "
                  "burst: the trace as recorded, time-scaled by `rate_scale`"),
    "rate": Field("float", None, minimum=MIN_RATE, maximum=MAX_RATE, nullable=True, why=RATE_WHY,
                  help="sustained: requests per second; default: the trace's own mean rate"),
    "arrivals": Field("choice", "measured", ARRIVALS, help="sustained: measured (gamma with the CV of the "
                      "trace's session starts), poisson, or tiled (the trace's own start gaps, scaled)"),
    "concurrency": Field("int", None, minimum=1, maximum=MAX_USERS, nullable=True, help="concurrency: users",
                         why=USERS_WHY),
    "think_s": Field("float", 0.0, minimum=0, maximum=86_400.0,
                     help="concurrency: seconds a user pauses between an answer and its next request"),
    "rate_scale": replace(RATE_SCALE, help="burst: multiply the recorded trace's request rate"),
}
# Which LoRA adapter each request names (traces.transforms.assign_adapters), after the transforms: what a
# multi-LoRA experiment sweeps (engine.enable_lora serves them)
ADAPTERS: dict[str, Field] = {
    "lora_adapters": Field("int", 0, minimum=0, maximum=100_000, why="adapters of one deployment",
                           help="sessions (requests, where sessions are unknown) spread over this many LoRA adapters, "
                                "lora-1 .. lora-N; 0: as the trace names them"),
    "lora_skew": Field("float", 0.0, minimum=0, maximum=100, help="Zipf exponent of the adapters' popularity "
                       "(adapter i drawn with probability proportional to i^-skew; 0: all equally popular)"),
}
LOAD_MODES = {"rate": "sustained", "arrivals": "sustained", "concurrency": "concurrency",
              "think_s": "concurrency", "rate_scale": "burst"}  # a load key -> the only mode it applies to
WORKLOAD_KEYS = ("trace", "format", *TRACE_LOAD, "transforms", "synthetic", *LOAD, *ADAPTERS)
# A steady-state probe's length and trimming (sim.probe.Probe has the same fields and defaults).
PROBE: dict[str, Field] = {
    "duration_s": Field("float", 600.0, above=0, maximum=1e7,
                        help="seconds of arrivals at the probed load (longer when min_requests needs it)"),
    "min_requests": Field("int", 1000, minimum=1, maximum=MAX_PROBE_REQUESTS,
                          help="requests the measurement window must hold (the probe runs longer to get them)"),
    "warmup_s": Field("float", None, minimum=0, maximum=1e7, nullable=True, help="default: 10% of duration_s"),
    "cooldown_s": Field("float", None, minimum=0, maximum=1e7, nullable=True, help="default: 10%"),
    "grace_s": Field("float", None, minimum=0, maximum=1e7, nullable=True, help="default: 20%"),
    "overload_wait_s": Field("float", 30.0, above=0, maximum=1e6, help="sustained: a replica whose waiting "
                             "queue holds more than this many seconds of its arrivals stops the probe (overloaded)"),
    # The stability gates' bounds (sim.stability): a probe beyond any of them is overloaded or backlogged.
    "max_unfinished_overloaded": Field("float", 0.05, minimum=0, maximum=1, help="a probe with more than this "
                                       "share of its window's requests unfinished is overloaded"),
    "max_unfinished_backlogged": Field("float", 0.01, minimum=0, maximum=1, help="a probe with more than this "
                                       "share of its window's requests unfinished (up to max_unfinished_overloaded) "
                                       "is backlogged"),
    "max_queue_delay_s": Field("float", 5.0, above=0, maximum=1e6, help="sustained: a stable probe's p99 "
                               "scheduling delay (arrival to first scheduled)"),
    "queue_growth": Field("float", 1.5, minimum=1, maximum=1e6, help="a probe whose mean waiting queue over the "
                          "window's second half exceeds this times the first half's (+ queue_margin_s) is "
                          "backlogged"),
    "queue_margin_s": Field("float", 2.0, minimum=0, maximum=1e6, help="seconds of the offered rate added to the "
                            "queue-growth bound: a stable server's bursts stay below it"),
    "ttft_growth": Field("float", 2.0, minimum=1, maximum=1e6, help="a probe whose median TTFT over the window's "
                         "second half exceeds this times the first half's (+ ttft_margin_ms) is backlogged"),
    "ttft_margin_ms": Field("float", 250.0, minimum=0, maximum=1e7, help="milliseconds added to the TTFT-growth "
                            "bound"),
}
assert all(getattr(Probe(), k) == f.default for k, f in PROBE.items()), "PROBE and sim.probe.Probe disagree"
# What a sweep may vary: every engine and cluster knob, the model, the hardware and the offered load.
SWEEPABLE: dict[str, Field] = {**TOP, **{f"engine.{k}": f for k, f in ENGINE.items()},
                               **{f"cluster.{k}": f for k, f in CLUSTER.items()},
                               **{f"workload.{k}": LOAD[k] for k in ("rate", "concurrency", "rate_scale")},
                               **{f"workload.{k}": f for k, f in ADAPTERS.items()}}

# A search target -> (the key it varies, the load mode it implies or None for any, integer steps?).
SEARCH_TARGETS = {"max_rate": "workload.rate", "max_goodput": "workload.rate",
                  "max_concurrency": "workload.concurrency", "max_burst_scale": "workload.rate_scale",
                  "min_replicas": "cluster.replicas", "min_cost": "cluster.replicas"}
TARGET_MODES = {"max_rate": "sustained", "max_goodput": "sustained", "max_concurrency": "concurrency",
                "max_burst_scale": "burst"}
INTEGER_TARGETS = ("max_concurrency", "min_replicas", "min_cost")
# Targets that search each point's fewest replicas (min_cost then ranks the points by what they cost: min_cost.py)
REPLICA_TARGETS = ("min_replicas", "min_cost")
# The finest bisection step: below float64's resolution sqrt(lo * hi) stops moving and the search would never end;
# 1e-4 (a 0.01% step) is already finer than the seeds' spread of any probe.
MIN_TOLERANCE = 1e-4
TOLERANCE_WHY = "the bisection's relative step: finer never ends in float64"
SEARCH: dict[str, Field] = {"target": Field("choice", None, tuple(SEARCH_TARGETS), help="what is searched: the "
                                          "highest load that is stable and meets the SLOs, or the fewest replicas"),
                            "low": Field("float", None, above=0, nullable=True,
                                         help="the lower end of the searched range; default: the target's"),
                            "high": Field("float", None, above=0, nullable=True,
                                          help="the upper end of the searched range; default: the target's"),
                            "tolerance": Field("float", 0.05, minimum=MIN_TOLERANCE, maximum=0.5, why=TOLERANCE_WHY,
                                               help="rates and scales: the bisection ends when hi / lo <= 1 + this"),
                            "combine": Field("choice", "median", ("median", "all"), help="median: each seed "
                                             "searched on its own, the median of their answers reported with "
                                             "their range; all: every seed must meet"),
                            "model_range": Field("choice", "recommended", ("recommended", "every_point", "none"),
                                                 help="where the answer is re-searched at the edges of the cost "
                                                 "model's error band: the recommended point, every point, or none"),
                            "rank_by": rank_by.FIELD, **COST_SEARCH}
SEARCH_DEFAULTS = {"max_rate": (0.25, 256.0), "max_goodput": (0.25, 256.0), "max_concurrency": (1, 1024),
                   "max_burst_scale": (0.25, 16.0), "min_replicas": (1, 64), "min_cost": (1, 64)}
SEARCH_SEEDS = [0, 1, 2]  # a search's default seeds: capacity is reported as a median with its range
MAX_POINTS = 10_000  # points of one sweep
MAX_SEED = 2**63 - 1  # a 64-bit seed, as the CLI and synthetic specs take
MAX_SEEDS = 1000  # seeds of one experiment (repeats' bound): every point runs each, a search each many times

SLO_LATENCIES = ("ttft", "tpot", "itl", "e2el")
SLO_KEYS = {f"{p}_{lat}_ms": f"{'median' if p == 'p50' else p}_{lat}_ms" for lat in SLO_LATENCIES
            for p in ("p50", "p90", "p99")}  # SLO key -> summary key
ATTAINMENT_COLUMNS = REQUEST_BOUNDS  # per-request bounds of an attainment SLO -> the per-request table's column
ATTAINMENT: dict[str, Field] = {**{k: Field("float", None, above=0, nullable=True,
                                          help=f"each request's {column} (the per-request table's) at most this")
                                   for k, column in ATTAINMENT_COLUMNS.items()},
                                "fraction": Field("float", 0.9, above=0, maximum=1,
                                                  help="the share of requests that must meet every bound")}
OBJECTIVE: dict[str, Field] = {"metric": Field("choice", "p90_e2el_ms", SUMMARY_KEYS,
                                               help="the summary metric that ranks the points meeting the SLOs"),
                               "goal": Field("choice", "min", ("min", "max"), help="whether lower or higher is better")}
OUTPUTS: dict[str, Field] = {"tables": Field("bool", True, help="keep each run's per-request table "
                                             "(runs/KEY/requests.parquet)"),
                             "plots": Field("bool", True, help="draw the plots"),
                             "report": Field("bool", True, help="write report.html")}


@dataclass(slots=True)
class Experiment:
    """A validated experiment: the base configuration and what varies around it."""

    name: str
    source: Path  # the YAML file; relative paths in it resolve against its directory
    text: str  # the file as written (the report shows it)
    base: dict  # model, hardware, engine.*, cluster.*, workload: the configuration every point starts from
    sweep_grid: dict[str, list] = field(default_factory=dict)
    sweep_zip: dict[str, list] = field(default_factory=dict)
    search: dict | None = None
    slo: dict[str, float] = field(default_factory=dict)  # summary key -> upper bound
    attainment: dict | None = None  # {column: bound, ..., "fraction": f}
    objective: dict = field(default_factory=lambda: {"metric": "p90_e2el_ms", "goal": "min"})
    seeds: list[int] = field(default_factory=lambda: [0])
    outputs: dict = field(default_factory=lambda: {k: f.default for k, f in OUTPUTS.items()})
    description: str = ""
    prices: PriceTable = field(default_factory=lambda: price_table(None))  # what the cost fields use
    # Current key path -> the path as the user wrote it (an earlier setting name, a sweep section), for messages
    # about what the file says: `engine.kv_cache_dtype` -> `engine.kv_dtype`, `sweep.grid.engine.block_size`.
    written: dict[str, str] = field(default_factory=dict)

    @property
    def goodput_bounds(self) -> dict[str, float] | None:
        """The per-request bounds goodput counts against: the attainment SLO's, else one per latency from the
        percentile SLOs (the highest percentile's bound: p99 TTFT <= 1 s means each request's TTFT <= 1 s);
        None without SLOs."""
        if self.attainment is not None:
            return {k: v for k, v in self.attainment.items() if k in ATTAINMENT_COLUMNS and v is not None}
        bounds: dict[str, float] = {}
        for stat in ("median", "p90", "p99"):  # later (higher) percentiles override
            for latency in SLO_LATENCIES:
                value = self.slo.get(f"{stat}_{latency}_ms")
                if value is not None:
                    bounds[f"{latency}_ms"] = value
        return bounds or None


def load_experiment(path: str | Path) -> Experiment:
    """Read and validate an experiment file; a problem is a `SchemaError` starting with `FILE: key.path:`."""
    from kvplan.traces.specs import read_yaml

    doc = read_yaml(path, "EXPERIMENT")  # before Path(): Path("") would be the current directory
    path = Path(path)
    try:
        return parse_experiment(doc, path, path.read_text())
    except ConfigError as exc:  # a field's or the schema's: the key path, now after the file
        raise SchemaError(f"{path}: {exc}") from None


def parse_experiment(doc: object, source: Path, text: str = "") -> Experiment:
    check_mapping(doc, "", TOP_KEYS)
    name = Field("str").check(doc.get("name"), "name")
    base = {key: f.check(doc.get(key, f.default), key) for key, f in TOP.items()}
    base["engine"], written = parse_engine(doc.get("engine"), ENGINE)
    base["cluster"] = check_fields(doc.get("cluster"), "cluster", CLUSTER)
    base[pd_block.KEY] = pd_block.parse_block(doc.get(pd_block.KEY), pd_block.KEY)
    base["workload"] = parse_workload(doc.get("workload"))
    base["probe"] = check_fields(doc.get("probe"), "probe", PROBE)
    description = Field("str", nullable=True).check(doc.get("description") or None, "description") or ""
    exp = Experiment(name, source, text, base, description=description, written=written)
    exp.sweep_grid, exp.sweep_zip, swept = parse_sweep(doc.get("sweep"))
    exp.written |= swept
    check_components(exp, ENGINE)
    exp.slo, exp.attainment = parse_slo(doc.get("slo"))
    exp.search = parse_search(doc.get("search"), exp)
    check_load(exp, doc.get("workload") or {}, "probe" in doc)
    pd_block.check_experiment(exp)
    exp.objective = check_fields(doc.get("objective"), "objective", OBJECTIVE)
    # A search reports a median over seeds - unless it replays a recorded trace as is (burst), where no seed
    # draws anything.
    draws = exp.base["workload"]["mode"] != "burst" or "synthetic" in exp.base["workload"]
    exp.seeds = parse_seeds(doc, SEARCH_SEEDS if exp.search and draws else [0])
    exp.outputs = check_fields(doc.get("outputs"), "outputs", OUTPUTS)
    exp.prices = parse_prices(doc.get("prices"), source)
    rank_by.resolve(exp)  # (its default and per_usd's check need the points and the prices)
    return exp


def parse_prices(doc: object, source: Path) -> PriceTable:
    """The `prices:` block over the built-in table; its `file:` relative to the experiment file."""
    if isinstance(doc, dict) and isinstance(doc.get("file"), str):
        doc = {**doc, "file": str(source.parent / doc["file"])}
    try:
        return price_table(doc)  # type: ignore[arg-type]  # price_table names a non-mapping block itself
    except UserError as exc:
        raise SchemaError(str(exc)) from None


def parse_workload(doc: object) -> dict:
    if doc is None:
        raise SchemaError("workload: required; allowed: a mapping with trace (a file or sample:NAME) or synthetic")
    check_mapping(doc, "workload", WORKLOAD_KEYS)
    if ("trace" in doc) == ("synthetic" in doc):
        raise SchemaError("workload: needs exactly one of trace (a file or sample:NAME) and synthetic (a spec)")
    out = {**{key: f.check(doc.get(key, f.default), f"workload.{key}") for key, f in (*LOAD.items(),
                                                                                    *ADAPTERS.items())},
           "transforms": parse_transforms(doc.get("transforms"))}
    if "trace" in doc:
        out["trace"] = Field("str").check(doc["trace"], "workload.trace")
        from kvplan.traces import FORMATS

        out["format"] = Field("choice", choices=tuple(FORMATS), nullable=True).check(doc.get("format"),
                                                                                      "workload.format")
        for key, field in TRACE_LOAD.items():
            out[key] = field.check(doc.get(key, field.default), f"workload.{key}")
    elif set(TRACE_LOAD) & set(doc):
        key = sorted(set(TRACE_LOAD) & set(doc))[0]
        raise SchemaError(f"workload.{key}: applies to a trace file; allowed: with workload.trace only")
    else:
        out["synthetic"] = check_mapping(doc["synthetic"], "workload.synthetic",
                                         ("seed", "requests", "arrivals", "lengths", "prefix"))
    return out


def parse_transforms(doc: object) -> dict:
    from kvplan.traces.transforms import TRANSFORM_ORDER

    if doc is None:
        return {}
    check_mapping(doc, "workload.transforms", TRANSFORM_ORDER)
    if "rate_scale" in doc:
        raise SchemaError("workload.transforms.rate_scale: set workload.rate_scale instead (searches vary it)")
    return dict(doc)


def parse_sweep(doc: object) -> tuple[dict[str, list], dict[str, list], dict[str, str]]:
    """(grid, zip, each swept key -> its path as written)."""
    if doc is None:
        return {}, {}, {}
    check_mapping(doc, "sweep", ("grid", "zip"))
    axes: dict[str, dict[str, list]] = {}
    written: dict[str, str] = {}  # current key -> its path as written, over both sections
    sweepable = [*SWEEPABLE, *(f"engine.{k}" for k in KEY_ALIASES), *pd_block.SWEEP_KEYS]
    for kind in ("grid", "zip"):
        raw = check_mapping(doc.get(kind) or {}, f"sweep.{kind}", sweepable)
        paths = spellings(raw, f"sweep.{kind}.", written)
        written |= paths
        axes[kind] = {}
        for key, where in paths.items():
            values = raw[where.removeprefix(f"sweep.{kind}.")]
            if not isinstance(values, list) or not values:
                raise SchemaError(f"{where}: must be a non-empty list of values, got {short_repr(values)}")
            check = SWEEPABLE[key].check if key in SWEEPABLE else partial(pd_block.check_sweep_value, key)
            axes[kind][key] = [check(v, f"{where}[{i}]") for i, v in enumerate(values)]
            if kind == "grid" and len(set(map(repr, axes[kind][key]))) != len(values):
                raise SchemaError(f"{where}: lists a value twice: {short_repr(values)}")
    if not axes["grid"] and not axes["zip"]:  # `sweep: {grid: {}}` ran one point where a sweep was meant
        raise SchemaError("sweep: varies no key; allowed: sweep.grid or sweep.zip with at least one key, or no "
                          "sweep section")
    lengths = {len(v) for v in axes["zip"].values()}
    if len(lengths) > 1:
        raise SchemaError(f"sweep.zip: lists of different lengths "
                          f"({', '.join(f'{k}: {len(v)}' for k, v in axes['zip'].items())}); allowed: lists of one "
                          "length (zip pairs them up row by row)")
    points = math.prod(len(v) for v in axes["grid"].values()) * (next(iter(lengths)) if lengths else 1)
    if points > MAX_POINTS:  # each point is built and checked before any run: 10^6 would never get started
        sizes = " x ".join(str(len(v)) for v in (*axes["grid"].values(), *list(axes["zip"].values())[:1]))
        raise SchemaError(f"sweep: {sizes} = {points} points; allowed: at most {MAX_POINTS} (split the experiment)")
    return axes["grid"], axes["zip"], written


def parse_slo(doc: object) -> tuple[dict[str, float], dict | None]:
    if doc is None:
        return {}, None
    check_mapping(doc, "slo", (*SLO_KEYS, "attainment"))
    bounds = {SLO_KEYS[k]: Field("float", above=0).check(v, f"slo.{k}") for k, v in doc.items() if k != "attainment"}
    attainment = None
    if "attainment" in doc:
        attainment = check_fields(doc["attainment"], "slo.attainment", ATTAINMENT)
        if all(attainment[k] is None for k in ATTAINMENT_COLUMNS):
            raise SchemaError(f"slo.attainment: needs at least one per-request bound; allowed: "
                              f"{', '.join(ATTAINMENT_COLUMNS)}")
    return bounds, attainment


def check_load(exp: Experiment, written: dict, probe: bool) -> None:
    """The load mode: as written, else the one a search target implies; every load key set must apply to it (and
    a `probe:` section to a mode that probes), and a concurrency run needs its users (unless a search varies
    them)."""
    workload = exp.base["workload"]
    implied = TARGET_MODES.get(exp.search["target"]) if exp.search else None
    if implied is not None and "mode" in written and written["mode"] != implied:
        raise SchemaError(f"workload.mode: {written['mode']} contradicts search.target {exp.search['target']}, "
                          f"which asks a {implied} question; allowed: {implied} (or leave mode out)")
    mode = workload["mode"] = implied or workload["mode"]
    for key, applies in LOAD_MODES.items():
        swept = f"workload.{key}" in exp.sweep_grid or f"workload.{key}" in exp.sweep_zip
        if (key in written or swept) and applies != mode:
            raise SchemaError(f"workload.{key}: applies to mode {applies} only, and this experiment's mode is "
                              f"{mode}; allowed: mode: {applies}, or remove {key}")
    if probe and mode == "burst":  # a burst replays the trace as recorded: no steady-state probe to shape
        raise SchemaError("probe: shapes a steady-state probe (modes sustained and concurrency), and this "
                          "experiment's mode is burst (the trace as recorded); allowed: remove probe, or another mode")
    varied = set(exp.sweep_grid) | set(exp.sweep_zip) | ({SEARCH_TARGETS[exp.search["target"]]} if exp.search
                                                         else set())
    if mode == "concurrency" and workload["concurrency"] is None and "workload.concurrency" not in varied:
        raise SchemaError("workload.concurrency: must be set in mode concurrency; allowed: an integer >= 1 "
                          "(the number of users)")


def parse_search(doc: object, exp: Experiment) -> dict | None:
    if doc is None:
        return None
    search = check_fields(doc, "search", SEARCH)
    target = search["target"]
    varied = SEARCH_TARGETS[target]
    if varied in exp.sweep_grid or varied in exp.sweep_zip:
        raise SchemaError(f"search.target: {target} varies {varied}, which the sweep also sets; allowed: one of them")
    if not exp.slo and exp.attainment is None:
        raise SchemaError("search: needs an slo section (the search finds where the SLOs stop being met)")
    if target == "max_goodput" and exp.attainment is None:
        raise SchemaError("search.target: max_goodput needs slo.attainment (the per-request bounds and the share of "
                          "requests that must meet them); allowed: add slo.attainment, or target max_rate")
    low, high = SEARCH_DEFAULTS[target]
    search["low"] = low if search["low"] is None else search["low"]
    search["high"] = high if search["high"] is None else search["high"]
    if target in INTEGER_TARGETS and "tolerance" in doc:  # whole steps: it ends when hi = lo + 1
        raise SchemaError(f"search.tolerance: {target} bisects whole {SEARCH_TARGETS[target].split('.')[1]} "
                          "until they are adjacent, so a relative tolerance would have no effect; allowed: remove it")
    if target in INTEGER_TARGETS:
        for key in ("low", "high"):
            if not float(search[key]).is_integer():
                raise SchemaError(f"search.{key}: {target} counts {SEARCH_TARGETS[target].split('.')[1]}: must be "
                                  f"an integer, got {short_repr(search[key])}")
            search[key] = int(search[key])
    # Each end is a value of the key the search varies and has that key's bounds (the ends are probed first:
    # 10^12 users would be built before anything else is said); the message names the end the user wrote.
    for key in ("low", "high"):
        _, problem = replace(SWEEPABLE[varied], nullable=False).parse(search[key])
        if problem is not None:
            raise SchemaError(f"search.{key}: {target} varies {varied}, which {problem}")
    check_cost_keys(doc, search, exp.slo)
    rank_by.check(doc, search)
    if search["low"] >= search["high"]:
        raise SchemaError(f"search.low: must be below search.high ({short_repr(search['high'])}), got "
                          f"{short_repr(search['low'])}")
    return search


def parse_seeds(doc: dict, default: list[int]) -> list[int]:
    if "seeds" in doc and "repeats" in doc:
        raise SchemaError("seeds: set seeds or repeats, not both")
    if "repeats" in doc:
        return list(range(Field("int", minimum=1, maximum=MAX_SEEDS).check(doc["repeats"], "repeats")))
    seeds = doc.get("seeds", default)
    if not isinstance(seeds, list) or not seeds or len(seeds) > MAX_SEEDS:
        raise SchemaError(f"seeds: must be a non-empty list of at most {MAX_SEEDS} integers >= 0, got "
                          f"{short_repr(seeds)}")
    # bounded: a seed is stored in runs.parquet's int64 column and added to the workload's own seed
    out = [Field("int", minimum=0, maximum=MAX_SEED).check(s, f"seeds[{i}]") for i, s in enumerate(seeds)]
    if len(set(out)) != len(out):
        raise SchemaError(f"seeds: lists a seed twice: {short_repr(seeds)}")
    return out
