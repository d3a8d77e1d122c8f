"""`kvplan run --explain` estimates the plan's wall time: the runs its searches make (bisection steps from
low/high/tolerance, guided searches, the model range's edge searches) times seconds per run measured by
micro-runs now; `--json` has it as numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from kvplan.cli import main
from kvplan.experiments.estimate import GUIDED_PROBES, edge_searches, search_probes
from kvplan.experiments.points import expand
from kvplan.experiments.schema import parse_experiment

WORKLOAD = {"synthetic": {"seed": 4, "requests": 60, "arrivals": {"process": "poisson", "rate": 4},
                          "lengths": {"prompt": {"dist": "uniform", "min": 50, "max": 400},
                                      "output": {"dist": "uniform", "min": 10, "max": 80}}}}
DOC = {"name": "plan", "model": "llama-3-8b", "hardware": "a100-40gb", "workload": WORKLOAD,
       "probe": {"duration_s": 60, "min_requests": 50},
       "search": {"target": "max_rate", "low": 0.5, "high": 16, "tolerance": 0.3},
       "slo": {"p99_ttft_ms": 2000}, "seeds": [0, 1]}


def test_a_bisection_makes_its_end_probes_and_the_halvings_to_the_tolerance():
    quickstart = {"target": "max_rate", "low": 0.5, "high": 48, "tolerance": 0.1}
    halvings = math.ceil(math.log2(math.log(96) / math.log(1.1)))  # 48 / 0.5 to within 10%: 6 halvings
    assert search_probes(quickstart) == 2 + halvings == 8
    assert search_probes({"target": "min_replicas", "low": 1, "high": 16}) == 2 + 4
    assert search_probes(quickstart, guided=True) == GUIDED_PROBES and search_probes(None) == 1


def test_edge_searches_follow_search_model_range():
    scales = {0: (0.9, 1.1), 1: (1.0, 1.2)}  # point 1's band has one edge away from 1
    counts = {}
    for mode in ("recommended", "every_point", "none"):
        exp = parse_experiment({**DOC, "search": {**DOC["search"], "model_range": mode},
                                "sweep": {"grid": {"engine.block_size": [16, 32]}}}, Path("plan.yaml"))
        counts[mode] = edge_searches(exp, expand(exp), scales)
    assert counts == {"recommended": 2, "every_point": 3, "none": 0}


def test_explain_prints_the_estimate_and_json_has_it(tmp_path, capsys):
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(DOC))
    assert main(["run", str(path), "--explain", "--json", "--workers", "2"]) == 0
    estimate = json.loads(capsys.readouterr().out)["estimate"]
    # one point: its search (2 + 4 halvings), the other seed's guided search and the 2 edge searches (3 each)
    assert (estimate["searches"], estimate["runs"], estimate["workers"]) == (4, 6 + 3 * 3, 2)
    assert estimate["timed_points"] == 1 and estimate["run_s"] > 0 and estimate["micro_run_s"] > 0
    # the chain - the first search, then the guided one, then the edges - is longer than the work over 2 workers
    assert estimate["wall_s"] == pytest.approx(max(estimate["run_s"] * 15 / 2, estimate["run_s"] * (6 + 3 + 3)))
    assert main(["run", str(path), "--explain"]) == 0
    assert "estimate: ~" in capsys.readouterr().out


def test_a_burst_replay_is_timed_on_a_slice_of_its_trace(tmp_path, capsys):
    doc = {**{k: v for k, v in DOC.items() if k != "probe"}, "workload": {**WORKLOAD, "mode": "burst"}, "seeds": [0],
           "search": {"target": "max_burst_scale", "low": 0.5, "high": 8, "tolerance": 0.3}}
    path = tmp_path / "burst.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["run", str(path), "--explain", "--json"]) == 0
    estimate = json.loads(capsys.readouterr().out)["estimate"]
    # no model range for a replay: one search, 2 + ceil(log2(log(16) / log(1.3))) = 6 runs
    assert (estimate["searches"], estimate["runs"]) == (1, 6) and estimate["wall_s"] == pytest.approx(
        6 * estimate["run_s"]) and estimate["run_s"] > 0
