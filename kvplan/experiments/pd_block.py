"""An experiment's `disaggregation:` block: a prefill/decode deployment (`sim.pd_spec.Disaggregation`) for every
point, and what a sweep may vary of it.

    disaggregation: {prefill_replicas: 1, decode_replicas: 2, kv_link: rdma}   # the options' field names
    disaggregation: {prefill_replicas: 1, decode_replicas: 2, decode_max_num_seqs: 64}   # a pool's own setting
                                                            # (sim.pd_spec.POOL_SETTINGS: prefill_/decode_<setting>)
    sweep:
      grid: {disaggregation.decode_replicas: [1, 2, 3]}       # a P:D grid (the block must exist)
      grid: {disaggregation.prefill_max_num_batched_tokens: [2048, 8192]}   # a pool's setting
      zip: {disaggregation: [null, {prefill_replicas: 1, decode_replicas: 1}], cluster.replicas: [2, 1]}
                                                            # whole blocks: null is co-located (cluster.replicas)

In a point's configuration the block is every option with its value (None: the run's or the link's default), or
None for a co-located point; `cluster.replicas` is then unused (each pool has its own count). A P/D point runs
the P/D simulator (`sim.pd_run`): in mode sustained (steady-state probes) or burst; concurrency (a closed loop) is
refused in one line. A replica search (`min_replicas`, `min_cost`) of a P/D point varies its decode pool
(`varied_key`), the prefill pool as the point sets it: sweeping `disaggregation.prefill_replicas` beside it finds
the P:D shape with the fewest GPUs in all, or the cheapest (each pool at its GPU's price: `min_cost.Shape`).
"""

from __future__ import annotations

import copy
import json
import math

from kvplan.errors import UserError
from kvplan.experiments.fields import SchemaError
from kvplan.sim.pd_spec import OPTIONS, Disaggregation, disaggregation_from_mapping

KEY = "disaggregation"
SWEEP_KEYS = (KEY, *(f"{KEY}.{name}" for name in OPTIONS))
PER = {"per_gpu": "per GPU", "per_usd": "per $"}
OPTION_DEFAULTS = Disaggregation(1, 1).options()  # (the replica counts: placeholders)


def parse_block(value: object, where: str) -> dict | None:
    """A block (or None: co-located) as a point stores it: every option, checked, named by `where`'s key path."""
    if value is None:
        return None
    try:
        return disaggregation_from_mapping(value, where).options()
    except UserError as exc:
        raise SchemaError(str(exc)) from None


def check_sweep_value(key: str, value: object, where: str) -> object:
    """One swept value of a `disaggregation` key: a whole block (or null), or one option's value."""
    if key == KEY:
        return parse_block(value, where)
    option = OPTIONS[key.removeprefix(f"{KEY}.")]
    if value is None and option.name in ("prefill_replicas", "decode_replicas"):
        raise SchemaError(f"{where}: null; allowed: {option.allowed}")
    try:
        option.check(value, where)
    except UserError as exc:
        raise SchemaError(str(exc)) from None
    return value


def shape(block: dict | None) -> str:
    """A block in a point's label and the points table: `co-located`, or `xPyD` with the pools' TP when set
    (`1P2D tp1/2`), the link when not the default's, and `+` when another option is set."""
    if block is None:
        return "co-located"
    text = f"{block['prefill_replicas']}P{block['decode_replicas']}D"
    p_tp, d_tp = block["prefill_tensor_parallel_size"], block["decode_tensor_parallel_size"]
    if p_tp is not None or d_tp is not None:
        text += f" tp{p_tp or '-'}/{d_tp or '-'}"
    if block["kv_link"] != "rdma":
        text += f" {block['kv_link']}"
    named = ("prefill_replicas", "decode_replicas", "prefill_tensor_parallel_size", "decode_tensor_parallel_size",
             "kv_link")
    others = {k: v for k, v in block.items() if k not in named}
    return text + ("+" if others != {k: OPTION_DEFAULTS[k] for k in others} else "")


SPECULATIVE = "engine.speculative_config"  # a JSON object: shown by its method and the keys it sets
SHORT_SPEC_KEYS = {"num_speculative_tokens": "k", "prompt_lookup_max": "lookup_max", "prompt_lookup_min": "lookup_min"}


def label_value(key: str, value: object) -> object:
    """How a swept value shows in a label and in the points table: a whole block by its `shape`, a speculative
    config by its method and what it sets (`ngram k=4 acceptance_rate=0.8`; `no speculation`), not its JSON."""
    if key == SPECULATIVE:
        if value is None:
            return "no speculation"
        spec = json.loads(str(value))
        return " ".join([str(spec.get("method")), *(f"{SHORT_SPEC_KEYS.get(k, k)}={v}" for k, v in spec.items()
                                                     if k != "method")])
    return shape(value) if key == KEY else value  # type: ignore[arg-type]  # (a block or None)


def hidden(key: str, value: object, block: object) -> bool:
    """Whether a point's label leaves `key` out: `cluster.replicas` at 1 on a P/D point (`block`: its block, or the
    block's shape in a points table), which does not use it - each pool has its own count. Any other value still
    shows, so two points' labels stay distinct."""
    return key == "cluster.replicas" and value == 1 and block not in (None, shape(None))


def label_part(key: str, value: object) -> str:
    """A swept value in a point's label: `name=value` by the key's last part; a block by its shape alone
    (`1P2D`, `co-located`: it names itself), which keeps the answer's label column narrow."""
    return str(label_value(key, value)) if key in (KEY, SPECULATIVE) else f"{key.split('.')[-1]}={value}"


def spec_of(block: dict | None) -> Disaggregation | None:
    return None if block is None else Disaggregation.of(block)


def pools(config: dict) -> list[tuple[str, int]]:
    """A point's deployment as (hardware, GPUs) per pool: a co-located point's one pool of replicas x TP x PP;
    a P/D point's prefill and decode pools, each its replicas x its TP x its PP (the run's where the pool sets
    none)."""
    engine = config["engine"]
    tp, pp = engine["tensor_parallel_size"], engine["pipeline_parallel_size"]
    block = config.get(KEY)
    if block is None:
        return [(config["hardware"], config["cluster"]["replicas"] * tp * pp)]
    return [(block[f"{role}_hardware"] or config["hardware"],
             block[f"{role}_replicas"] * (block[f"{role}_tensor_parallel_size"] or tp)
             * (block.get(f"{role}_pipeline_parallel_size") or pp)) for role in ("prefill", "decode")]


def gpus(config: dict) -> int:
    """The GPUs a point's deployment holds: its pools' (`pools`)."""
    return sum(n for _, n in pools(config))


def varied_key(exp, config: dict) -> str | None:  # exp: schema.Experiment
    """The key a point's search varies: a replica search of a P/D point its decode pool's replicas (the module);
    otherwise the target's (`schema.SEARCH_TARGETS`); None without a search."""
    from kvplan.experiments.schema import REPLICA_TARGETS, SEARCH_TARGETS

    if not exp.search:
        return None
    if exp.search["target"] in REPLICA_TARGETS and config.get(KEY) is not None:
        return f"{KEY}.decode_replicas"
    return SEARCH_TARGETS[exp.search["target"]]


def with_value(config: dict, key: str, value: object) -> dict:
    """A copy of `config` with the dotted `key` set to `value`."""
    out = copy.deepcopy(config)
    *parents, leaf = key.split(".")
    inner = out
    for part in parents:
        inner = inner[part]
    inner[leaf] = value
    return out


def replica_unit(exp, config: dict) -> tuple[int, int]:  # exp: schema.Experiment with a replica search
    """(the GPUs a replica search does not vary, the GPUs each replica it counts adds): a co-located point's
    (0, TP x PP); a P/D point's (its prefill pool's, one decode replica's TP x PP)."""
    key = varied_key(exp, config)
    assert key is not None
    fixed = gpus(with_value(config, key, 0))
    return fixed, gpus(with_value(config, key, 1)) - fixed


def answer_hour(exp, config: dict, replicas: float) -> float:  # exp: schema.Experiment with a replica search
    """$/hour of the point's deployment at `replicas` of the searched pool (each pool at its GPU's price); NaN
    where the prices lack a GPU."""
    key = varied_key(exp, config)
    assert key is not None
    deployed = pools(with_value(config, key, 1))
    fixed = pools(with_value(config, key, 0))
    try:  # (the searched pool: its GPUs per replica x replicas; the others as they are)
        return sum(exp.prices.gpu_hour(hw) * (n0 + (n1 - n0) * replicas)
                   for (hw, n1), (_, n0) in zip(deployed, fixed, strict=True))
    except UserError:
        return math.nan


def used(exp) -> bool:  # exp: schema.Experiment
    """Whether any point of the experiment is disaggregated."""
    return exp.base.get(KEY) is not None or any(key == KEY or key.startswith(f"{KEY}.")
                                                for key in (*exp.sweep_grid, *exp.sweep_zip))


def check_experiment(exp) -> None:  # exp: schema.Experiment (imported by it)
    """Every point's block against the rules a run would refuse later: the TP rule (named by the key that sets
    the decode TP), a mode and a search target P/D supports; the sweep's option keys need a base block."""
    from kvplan.experiments.points import expand

    swept = {*exp.sweep_grid, *exp.sweep_zip}
    if exp.base.get(KEY) is None and KEY not in swept:
        for key in sorted(swept):
            if key.startswith(f"{KEY}."):
                raise SchemaError(f"{exp.written.get(key, key)}: varies an option of the disaggregation block, "
                                  "which this experiment does not have; allowed: add a disaggregation block, or "
                                  "sweep whole blocks (sweep key disaggregation)")
    if KEY in swept and any(k.startswith(f"{KEY}.") for k in swept):
        raise SchemaError("sweep: varies both whole disaggregation blocks and an option of one; allowed: one of "
                          "them")
    for point in expand(exp):
        block = point.config.get(KEY)
        if block is None:
            continue
        where = exp.written.get(KEY, KEY) if KEY in point.values else KEY
        mode = exp.base["workload"]["mode"]
        if mode == "concurrency":
            raise SchemaError(f"{where}: a disaggregated point runs in mode sustained or burst; allowed: "
                              "workload.mode sustained or burst (a closed loop through P/D is not modelled)")
        decode = f"{KEY}.decode_replicas"
        if exp.search and exp.search["target"] in ("min_replicas", "min_cost") and decode in swept:
            raise SchemaError(f"search.target: {exp.search['target']} varies {decode} on a disaggregated point, "
                              f"which the sweep also sets ({exp.written.get(decode, decode)}); allowed: one of them "
                              f"(sweep {KEY}.prefill_replicas for a P:D grid)")
        tp = point.config["engine"]["tensor_parallel_size"]
        p_tp = block["prefill_tensor_parallel_size"] or tp
        d_tp = block["decode_tensor_parallel_size"] or tp
        if d_tp < p_tp or d_tp % p_tp:
            key = f"{KEY}.decode_tensor_parallel_size"
            raise SchemaError(f"{exp.written.get(key, key)}: {d_tp} with a prefill TP of {p_tp} (point "
                              f"{point.label}): each decode rank reads the prefill rank holding its KV heads; "
                              f"allowed: a multiple of {p_tp} (vLLM's NIXL rule: decode TP cannot be smaller than "
                              "prefill TP)")


def comparison(exp, points) -> dict | None:  # exp: schema.Experiment, points: the points frame
    """The P:D question's answer: the best disaggregated point and the best co-located one by what a GPU serves
    (a rate search's answer per GPU, else the goodput per GPU) - or by what a dollar buys, when the search ranks
    per $ (`rank_by`) - each with both figures and its $/hour, their ratios, and the best co-located point on the
    P/D point's own number of GPUs where that is another one; None when the experiment has no P/D point, or no
    point of one kind has the figure."""
    from kvplan.experiments.rank_by import COLUMNS, RATE_TARGETS, rank_by

    if not used(exp) or "gpus" not in points:
        return None
    searched = exp.search is not None and exp.search["target"] in RATE_TARGETS
    figures = {"per_gpu": points[COLUMNS["per_gpu"]] if searched else points["goodput_per_gpu"],
               "per_usd": points[COLUMNS["per_usd"]] if searched else points["goodput_per_usd"]}
    by = "per_usd" if rank_by(exp) == "per_usd" else "per_gpu"
    split, sized = _is_split(exp, points), points["gpus"].notna()  # (a shape min_cost never searched has no GPUs)
    best = []
    for kind in (split & sized, ~split & sized):
        ranked = figures[by][kind].dropna()
        if ranked.empty:
            return None
        best.append(ranked.idxmax())
    p, c = best
    same = figures[by][~split & sized & (points["gpus"] == points["gpus"][p])].dropna()

    def side(i) -> dict:
        return {"point": int(points["point"][i]), "label": str(points["label"][i]), "gpus": float(points["gpus"][i]),
                "cost_per_hour": float(points["cost_per_hour"][i]),
                **{name: float(figure[i]) for name, figure in figures.items()}}

    return {"by": by, "basis": "answer" if searched else "goodput", "disaggregated": side(p), "co_located": side(c),
            "same_gpus": side(same.idxmax()) if not same.empty and same.idxmax() != c else None,
            **{f"ratio_{name}": float(figure[p] / figure[c]) for name, figure in figures.items()}}


def comparison_line(exp, points) -> str | None:
    """`comparison` in one sentence (None where there is none)."""
    doc = comparison(exp, points)
    if doc is None:
        return None

    def side(s: dict, units: bool = True) -> str:
        hour = f", ${s['cost_per_hour']:.3g}/h" if math.isfinite(s["cost_per_hour"]) else ", not priced"
        return (f"{s['label']} ({s['gpus']:g} GPUs{hour}) {_figure(s['per_gpu'])}{' req/s per GPU' if units else ''}"
                f", {_figure(s['per_usd'])}{' req/$' if units else ''}")

    what = "at the searched rate" if doc["basis"] == "answer" else "goodput"
    # (the labels name each kind: `1P2D ...`, `co-located ...`)
    text = (f"P/D vs co-located ({what}; the best of each {PER[doc['by']]}): "
            f"{side(doc['disaggregated'])} vs {side(doc['co_located'], False)}: "
            f"{_ratio(doc['ratio_per_gpu'])} per GPU, {_ratio(doc['ratio_per_usd'])} per $")
    if doc["same_gpus"] is not None:
        text += f"; co-located on the same GPUs: {side(doc['same_gpus'], False)}"
    return text + "."


def _figure(value: float) -> str:
    """4 significant digits; 10,000 and above whole, with commas (requests per $ run to tens of thousands)."""
    if not math.isfinite(value):
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"


def _ratio(value: float) -> str:
    return f"{value:.2f}x" if math.isfinite(value) else "n/a"


def _is_split(exp, points):
    """Which points are disaggregated: by their swept block (`shape` text) or the base block."""
    if KEY in points:
        return points[KEY] != "co-located"
    return points["gpus"].notna() & (exp.base.get(KEY) is not None)
