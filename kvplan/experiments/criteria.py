"""What a run failed, as data: every SLO line, stability gate and completion check it broke, each with the
experiment file's key that sets its bound, so that an answer can name what stopped it (`binding`) and the key
that moves it - and the gates an answer can be decided by, with their values (`gate_lines`).

A failure's `excess` is its measured value over its bound (> 1; an attainment share: the target over the share),
the yardstick `binding` ranks failures by; an event with no measure (the overload stop) counts 1, an SLO with no
value (nothing completed) infinity. Stability failures are re-read from the probe's stored signals through
`sim.stability.breaches`, the function its verdict came from: the same gates, never parsed from its sentences.

KV memory is not a pass/fail line of its own: a stable run whose SLO lines failed while its scheduler preempted or
refused requests for want of KV blocks (at least `KV_SHARE` of its measured requests) also gets a `memory`
failure, the resource behind the broken line (its key: `engine.num_blocks` where the run sets it, else
`engine.gpu_memory_utilization`). An unstable run gets none: past capacity every cache fills, whatever limits it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from kvplan.experiments.schema import INTEGER_TARGETS, SLO_KEYS, Experiment
from kvplan.sim import stability

KV_SHARE = 0.01  # preemptions + refusals per measured request that make KV memory part of a failure
SUMMARY_TO_SLO = {summary: slo for slo, summary in SLO_KEYS.items()}  # p99_ttft_ms -> slo.p99_ttft_ms's key
LATENCY_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E"}


@dataclass(slots=True)
class Failure:
    """One criterion a run broke. `key`: the experiment file's settings that set the bound ("" when none does:
    the completion check)."""

    limit: str  # short name: "p90 TPOT", "p99 scheduling delay", "attainment", "KV memory", ...
    key: str
    kind: str  # slo, stability, completion or memory
    value: float  # measured (NaN: not measured)
    bound: float
    excess: float  # value / bound, see the module docstring
    text: str  # the sentence the SLO verdict has always given for it

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def slo_name(summary_key: str) -> str:
    """`p99_ttft_ms` -> "p99 TTFT", `median_tpot_ms` -> "p50 TPOT"."""
    stat, latency, _ = SUMMARY_TO_SLO.get(summary_key, summary_key).split("_")
    return f"{stat} {LATENCY_NAMES.get(latency, latency)}"


def memory_key(config: dict) -> str:
    """The key that gives a run more KV blocks: its block count when it sets one, else the memory share."""
    return "engine.num_blocks" if config["engine"].get("num_blocks") is not None else "engine.gpu_memory_utilization"


def failures(exp: Experiment, doc: dict, config: dict | None = None) -> list[Failure]:
    """Every criterion one run's summary.json breaks: stability gates first (in `stability.GATES`' order), then
    the SLO lines, attainment and completion; a `memory` failure last when only SLO lines broke, with
    preemptions or refusals (see the module docstring). `config`: the run's (for the memory key; default: the
    base's)."""
    summary, out = doc["summary"], []
    probe = doc.get("probe")
    if probe is not None and probe["verdict"] != "stable":
        out += stability_failures(exp, probe)
    for key, bound in exp.slo.items():
        value = summary.get(key)
        if value is None or not math.isfinite(value) or value > bound:
            measured = math.nan if value is None else float(value)
            out.append(Failure(slo_name(key), f"slo.{SUMMARY_TO_SLO[key]}", "slo", measured, bound,
                               measured / bound if math.isfinite(measured) else math.inf,
                               f"{key} {value if value is None else round(value, 3)} > {bound:g}"))
    if exp.attainment is not None and (doc["attainment"] or 0.0) < exp.attainment["fraction"]:
        share, target = doc["attainment"] or 0.0, exp.attainment["fraction"]
        out.append(Failure("attainment", "slo.attainment.fraction", "slo", share, target,
                           target / share if share > 0 else math.inf, f"attainment {share:.3f} < {target:g}"))
    if summary.get("completed", 0) == 0:
        out.append(Failure("no request completed", "", "completion", 0.0, 1.0, math.inf, "no request completed"))
    measured = (probe or {}).get("measured_requests") or summary.get("completed") or 0
    starved = (summary.get("num_preemptions") or 0) + (summary.get("num_rejected") or 0)
    if out and all(f.kind == "slo" for f in out) and measured and starved >= KV_SHARE * measured:
        out.append(Failure("KV memory", memory_key(config or exp.base), "memory", starved / measured, KV_SHARE,
                           starved / measured / KV_SHARE, f"KV memory full: {summary.get('num_preemptions') or 0} "
                           f"preemptions, {summary.get('num_rejected') or 0} refusals in {measured} requests"))
    return out


def stability_failures(exp: Experiment, probe: dict) -> list[Failure]:
    """The gates behind a probe's stored verdict, re-read from its stored signals (a closed loop has no
    scheduling-delay gate: its queue is bounded by its users)."""
    signals = stability.ProbeSignals(**{f.name: _signal(probe, f) for f in dataclasses.fields(stability.ProbeSignals)})
    steady = exp.base["probe"]
    bounds = stability.Bounds.of(steady, open_loop=exp.base["workload"]["mode"] == "sustained")
    found = [b for b in stability.breaches(signals, bounds) if b.gate.verdict == probe["verdict"]]
    out = []
    for b in found:
        bound = steady["overload_wait_s"] if b.gate is stability.STOPPED_EARLY else b.bound
        excess = b.value / b.bound if math.isfinite(b.value) and b.bound > 0 else 1.0
        out.append(Failure(b.gate.name, b.gate.key, "stability", b.value, bound, excess, b.reason))
    if not found:  # a verdict the stored signals do not reproduce (a run of another kvplan): its own words
        out.append(Failure(probe["verdict"], "", "stability", math.nan, math.nan, 1.0,
                           "; ".join(probe.get("reasons") or [])))
    return out


def _signal(probe: dict, f: dataclasses.Field) -> object:
    value = probe.get(f.name)
    if f.name == "window_s":
        return tuple(value or (math.nan, math.nan))
    if value is None:  # a non-finite number is stored as null
        return f.default if f.default is not dataclasses.MISSING else math.nan
    return value


@dataclass(slots=True)
class GateLine:
    """A gate an answer can be decided by, with the values in force: its name, the condition it holds to
    (`short`, e.g. "p99 scheduling delay <= 5 s"), what fails it in full, and the keys that change it ("" for the
    completion check: it has no bound to change)."""

    name: str
    short: str
    rule: str
    key: str


def gate_lines(exp: Experiment) -> list[GateLine]:
    """Every gate besides the SLOs that can decide this experiment's answer: the stability gates of a
    steady-state probe (the scheduling delay on open loops only), the completion check, and a search's range
    and resolution."""
    mode, settings = exp.base["workload"]["mode"], exp.base["probe"]
    out = []
    if mode != "burst":
        for gate in stability.GATES:
            if gate is stability.QUEUE_DELAY and mode != "sustained":
                continue
            short, rule = gate.text(settings)
            out.append(GateLine(gate.name, short, f"{gate.verdict}: {rule}", gate.key))
    out.append(GateLine("no request completed", "a request completed", "fails: no request of the run completed", ""))
    if exp.search:
        from kvplan.experiments.search import describe

        target, search = exp.search["target"], exp.search
        low, high = describe(target, search["low"]), describe(target, search["high"])
        out.append(GateLine("search range", f"search range {low} to {high}",
                            f"answers are searched between {low} and {high}: an answer beyond is reported as the "
                            "bound it passed",
                            "search.low, search.high"))
        if target not in INTEGER_TARGETS:
            out.append(GateLine("search resolution", f"resolution {search['tolerance']:.0%}",
                                f"the bisection ends when its bracket is within {search['tolerance']:.0%}",
                                "search.tolerance"))
    return out
