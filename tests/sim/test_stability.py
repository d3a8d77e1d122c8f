"""Every stability gate has a key that changes it: an experiment raising one gate's bound turns a constructed
probe that fails that gate (at the defaults) into one that passes it, and the failure names that key. The bounds
are declared once: the schema's PROBE, `sim.probe.Probe` and `sim.stability.Bounds` agree on names and defaults."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict
from pathlib import Path

import pytest

from kvplan.experiments import schema
from kvplan.experiments.criteria import gate_lines, stability_failures
from kvplan.experiments.execute import build_probe
from kvplan.experiments.schema import parse_experiment
from kvplan.sim.probe import Probe
from kvplan.sim.stability import GATES, Bounds, ProbeSignals, judge

WORKLOAD = {"synthetic": {"requests": 50, "arrivals": {"process": "poisson", "rate": 4},
                          "lengths": {"prompt": {"dist": "fixed", "value": 100},
                                      "output": {"dist": "fixed", "value": 10}}}}


def experiment(**probe):
    doc = {"name": "t", "model": "llama-3-8b", "hardware": "a100-40gb", "workload": WORKLOAD,
           "slo": {"p99_ttft_ms": 1000}, "probe": probe}
    return parse_experiment(doc, Path("t.yaml"))


def signals(**changes) -> ProbeSignals:
    """A stable 8 req/s probe of 4,000 measured requests, with `changes`."""
    base = {"window_s": (60.0, 540.0), "stopped_s": 700.0, "sent": 5000, "warmup_requests": 500,
            "measured_requests": 4000, "cooldown_requests": 500, "completed_measured": 4000, "rejected_measured": 0,
            "unfinished_requests": 0, "queue_first": 10.0, "queue_second": 11.0, "ttft_first_ms": 300.0,
            "ttft_second_ms": 320.0, "p99_queue_delay_ms": 800.0, "offered_rps": 8.0}
    return ProbeSignals(**{**base, **changes})


# (the key raised, its new value, a probe that fails its gate at the defaults, the verdicts before and after)
CASES = [
    ("max_unfinished_overloaded", 0.2, {"completed_measured": 3600}, "overloaded", "backlogged"),  # 10% unfinished
    ("max_unfinished_backlogged", 0.05, {"completed_measured": 3880}, "backlogged", "stable"),  # 3%
    ("max_queue_delay_s", 10.0, {"p99_queue_delay_ms": 7000.0}, "backlogged", "stable"),
    ("queue_growth", 3.0, {"queue_second": 35.0}, "backlogged", "stable"),  # bound 1.5 x 10 + 2 s x 8 = 31 -> 46
    ("queue_margin_s", 5.0, {"queue_second": 35.0}, "backlogged", "stable"),  # -> 15 + 40 = 55
    ("ttft_growth", 3.0, {"ttft_second_ms": 1000.0}, "backlogged", "stable"),  # bound 2 x 300 + 250 = 850 -> 1150
    ("ttft_margin_ms", 500.0, {"ttft_second_ms": 1000.0}, "backlogged", "stable"),  # -> 1100
]


@pytest.mark.parametrize(("key", "value", "changes", "before", "after"), CASES, ids=[c[0] for c in CASES])
def test_raising_a_gates_bound_in_the_experiment_changes_the_verdict(key, value, changes, before, after):
    probe = signals(**changes)
    default, raised = experiment(), experiment(**{key: value})
    verdicts = [judge(probe, Bounds.of(asdict(build_probe(exp.base))))[0] for exp in (default, raised)]
    assert verdicts == [before, after]
    # the failure an answer reports names the gate's key, as the gate lines do
    doc = {**probe.as_dict(), "verdict": before, "reasons": []}
    assert any(f"probe.{key}" in f.key.split(", ") for f in stability_failures(default, doc))
    assert any(f"probe.{key}" in g.key.split(", ") for g in gate_lines(raised))


def test_a_closed_loop_has_no_scheduling_delay_gate():
    probe = signals(p99_queue_delay_ms=60_000.0)
    assert judge(probe, Bounds.of(asdict(Probe())))[0] == "backlogged"
    assert judge(probe, Bounds.of(asdict(Probe()), open_loop=False))[0] == "stable"


def test_every_gate_has_a_key_and_every_bound_one_declaration():
    bounds = {f.name for f in dataclasses.fields(Bounds)}
    keys = {k.removeprefix("probe.") for g in GATES for k in g.key.split(", ")}
    assert all(g.key for g in GATES) and bounds <= keys <= set(schema.PROBE)
    assert {k: schema.PROBE[k].default for k in bounds} == {k: getattr(Probe(), k) for k in bounds}
