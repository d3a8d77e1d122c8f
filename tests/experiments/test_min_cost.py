"""The cheapest-deployment search (experiments.min_cost): its winner is the minimum-cost feasible point of an
exhaustive run, pruned shapes say why, and bad input is refused in one line."""

from __future__ import annotations

import copy
import json
import math

import pandas as pd
import pytest

from kvplan.cli import main
from kvplan.reference.columns import POINT_COLUMNS, RATE_SEARCH, undocumented
from tests.experiments.test_runner import TINY_WORKLOAD, write_yaml

HIGH = 4
# llama-3-8b at 40 req/s: A100-40GB ($2.74/GPU-h) at TP 1 and 2, A10G ($1.01/GPU-h) at TP 2; A10G TP 1 holds no
# KV block at memory utilization 0.5 (15 GiB of weights, 12 GiB usable), TP 3 does not split the 32 heads
SEARCH = {"name": "mc", "model": "llama-3-8b",
          "engine": {"gpu_memory_utilization": 0.5, "enable_prefix_caching": False},
          "workload": {**TINY_WORKLOAD, "rate": 40}, "probe": {"duration_s": 30, "min_requests": 50},
          "sweep": {"grid": {"hardware": ["a100-40gb", "a10g"], "engine.tensor_parallel_size": [1, 2, 3]}},
          "search": {"target": "min_cost", "low": 1, "high": HIGH, "model_range": "none"},
          "slo": {"p99_ttft_ms": 500, "p90_tpot_ms": 30}, "seeds": [0],
          "outputs": {"tables": False, "plots": True, "report": True}}
PRICE = {"a100-40gb": 21.957642 / 8, "a10g": 1.006}  # sim.specs.prices.PRICES, on demand
FITS = [("a100-40gb", 1), ("a100-40gb", 2), ("a10g", 2)]  # the shapes neither the memory nor a gate refuses


def exhaustive() -> dict:
    """The same shapes, every replica count 1..HIGH simulated: a plain sweep, no search, no bound, no pruning.
    Its runs are the search's probes (equal configurations and seeds give equal runs)."""
    doc = copy.deepcopy(SEARCH)
    del doc["search"]
    doc["sweep"] = {"zip": {"hardware": [h for h, _ in FITS], "engine.tensor_parallel_size": [t for _, t in FITS]},
                    "grid": {"cluster.replicas": list(range(1, HIGH + 1))}}
    doc["outputs"] = {"tables": False, "plots": False, "report": False}
    return doc


def test_the_winner_is_the_cheapest_feasible_point_of_an_exhaustive_run(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(write_yaml(tmp_path / "all.yaml", exhaustive())), "--out", str(out), "--quiet"]) == 0
    runs = pd.read_parquet(out / "runs.parquet")
    fewest = {}
    for (hardware, tp), group in runs.groupby(["hardware", "engine.tensor_parallel_size"]):
        met = group[group["slo_met"]]["cluster.replicas"]
        fewest[(hardware, int(tp))] = int(met.min()) if len(met) else None
    costs = {shape: n * shape[1] * PRICE[shape[0]] for shape, n in fewest.items() if n is not None}
    cheapest = min(costs.values())
    winners = [shape for shape, cost in costs.items() if math.isclose(cost, cheapest)]
    assert len(winners) == 1  # the grid has one cheapest shape (a tie would be stated, not recommended)
    capsys.readouterr()

    for prune in (True, False):  # pruned and unpruned: the same winner, from the exhaustive run's probes
        doc = copy.deepcopy(SEARCH)
        doc["search"]["prune"] = prune
        doc["search"]["model_range"] = "recommended" if prune else "none"  # once: the band's cost (below)
        assert main(["run", str(write_yaml(tmp_path / "mc.yaml", doc)), "--out", str(out), "--resume"]) == 0
        text = capsys.readouterr().out
        points = pd.read_parquet(out / "points.parquet")
        # every column described in the reference (reference.columns), the min_cost ones included
        assert undocumented(points.columns, POINT_COLUMNS, (RATE_SEARCH,)) == ([], [])
        result = json.loads((out / "result.json").read_text())
        won = points[points["status"] == "winner"]
        assert len(won) == 1 and int(won["point"].iloc[0]) == result["recommendation"]["point"]
        row = won.iloc[0]
        assert (row["hardware"], int(row["engine.tensor_parallel_size"])) == winners[0]
        assert row["answer"] == fewest[winners[0]]
        assert math.isclose(row["shape_cost_per_hour"], cheapest, rel_tol=1e-9)
        if prune:  # the GPU model's error band on the winner's cost: its replicas re-found at the band's edges
            assert row["capacity_model_lo"] <= row["answer"] <= row["capacity_model_hi"]
            assert row["shape_cost_model_lo"] == row["capacity_model_lo"] * row["gpus_per_replica"] * \
                row["price_per_gpu_hour"] and row["shape_cost_model_hi"] >= row["shape_cost_model_lo"]
            assert "over the GPU model's error band" in " ".join(text.split())  # wrapped at 100 columns
        assert f"Cheapest deployment holding 40 req/s: {row['label']}: {int(row['answer'])} replicas" in text
        status = dict(zip(zip(points["hardware"], points["engine.tensor_parallel_size"], strict=True), points["status"],
                          strict=True))
        reasons = dict(zip(points["label"], points["status_reason"], strict=True))
        assert status[("a10g", 1)] == "memory" and "15.0 GiB per GPU of the 12.0 GiB usable" in \
            reasons["hardware=a10g tensor_parallel_size=1"]
        assert status[("a100-40gb", 3)] == status[("a10g", 3)] == "gate"
        assert "does not divide llama-3-8b's 32 attention heads" in reasons["hardware=a10g tensor_parallel_size=3"]
        for shape in FITS:  # every other shape: feasible at its exhaustive cost, or SLO / cost bound
            if shape == winners[0]:
                continue
            if status[shape] == "feasible":
                assert math.isclose(points.set_index(["hardware", "engine.tensor_parallel_size"])
                                    .loc[shape, "shape_cost_per_hour"], costs[shape])
            elif status[shape] == "SLO":
                assert fewest[shape] is None
            else:
                assert prune and status[shape] == "cost bound"
                assert shape not in costs or costs[shape] > cheapest
        # pruned, the a10g shape is settled by the cost bound before its search ends; unpruned, every shape ends
        assert ("cost bound" in set(points["status"])) == prune
        assert (out / "plots" / "cost_frontier.png").is_file()
        assert "Pareto frontier" in (out / "summary.md").read_text() and "Cheapest deployment" in \
            (out / "report.html").read_text()


@pytest.mark.parametrize(("search", "message"), [
    ({"target": "min_cost", "prune": "maybe"}, "search.prune:"),
    ({"target": "min_cost", "latency": "p99_foo_ms"}, "search.latency: unknown value"),
    ({"target": "min_replicas", "prune": False}, "search.prune: only a min_cost search takes it"),
    ({"target": "max_rate", "latency": "p99_ttft_ms"}, "search.latency: only a min_cost search takes it"),
])
def test_bad_min_cost_keys_are_one_line(tmp_path, capsys, search, message):
    doc = {**SEARCH, "search": search}
    assert main(["run", str(write_yaml(tmp_path / "bad.yaml", doc)), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_gpu_without_a_price_is_refused(tmp_path, capsys):
    doc = {**SEARCH, "model": "llama-100m", "sweep": {"grid": {"hardware": ["a100-40gb", "cpu-local"]}}}
    assert main(["run", str(write_yaml(tmp_path / "free.yaml", doc)), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cpu-local" in err and "has no price" in err


def test_equal_costs_are_a_tie_and_nothing_is_recommended():
    """Two shapes at one $/hour (2 x 4 GPUs at $2/GPU-h, 1 x 8 at $2/GPU-h): a tie, stated, no winner; a third,
    dearer one is not part of it."""
    from kvplan.experiments.min_cost import mark_winner
    from kvplan.experiments.min_cost_text import winner_line
    from kvplan.experiments.ranking import recommend
    from tests.experiments.test_runner import experiment

    exp = experiment(slo={"p99_ttft_ms": 1000}, search={"target": "min_cost", "low": 1, "high": 8}, seeds=[0])
    rows = [(0, "a", 2, 4, 2.0), (1, "b", 1, 8, 2.0), (2, "c", 3, 4, 2.0)]
    points = pd.DataFrame([{"point": p, "label": label, "answer": float(n), "answer_low": float(n),
                            "answer_high": float(n), "gpus_per_replica": g, "gpus": float(n * g),
                            "price_per_gpu_hour": price, "shape_cost_per_hour": n * g * price,
                            "shape_cost_low": n * g * price, "shape_cost_high": n * g * price,
                            "status": "feasible", "p90_e2el_ms": 100.0 + p, "answers": f"{n}",
                            "capacity_rps": 1.0, "capacity_tok_s": 1.0}
                           for p, label, n, g, price in rows])
    rec = recommend(exp, points)
    assert rec.point is None and sorted(rec.tie) == [0, 1]
    marked = mark_winner(points, rec)
    assert list(marked["status"]) == ["tie", "tie", "feasible"]
    assert winner_line(exp, marked, rec).startswith("Tie for the cheapest deployment")


def test_a_grid_of_refused_shapes_is_refused_in_one_line(tmp_path, capsys):
    doc = {**SEARCH, "sweep": {"grid": {"hardware": ["a10g"], "engine.tensor_parallel_size": [3]}}}
    assert main(["run", str(write_yaml(tmp_path / "none.yaml", doc)), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "every shape is refused" in err and "does not divide" in err
