"""The model range of a capacity answer: the edge searches start where the answer should move and bracket it,
and end to end a wider step-time band gives a wider range (each computed, then compared), carried by every
output of `kvplan run`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvplan.cli import main
from kvplan.experiments.search import make_tasks
from kvplan.sim.gpu import model_error as me
from tests.experiments.test_runner import TINY_WORKLOAD, drive_one, experiment, write_yaml

FIXTURE = Path(__file__).resolve().parents[1] / "sim" / "data" / "model_error.json"


@pytest.mark.parametrize(("target", "low", "high", "central", "factor", "edge"),
                         [("max_rate", 0.25, 16, 3.7, 1.25, 2.9), ("max_rate", 0.25, 16, 3.7, 0.8, 4.7),
                          ("min_replicas", 1, 16, 6, 1.5, 9), ("max_concurrency", 1, 64, 20, 0.8, 25)])
def test_an_edge_search_starts_where_the_answer_moves(target, low, high, central, factor, edge):
    search = {"target": target, "low": low, "high": high}
    if target == "max_rate":  # the integer targets bisect whole steps: a tolerance is refused there
        search["tolerance"] = 0.05
    exp = experiment(slo={"p99_ttft_ms": 1}, search=search, seeds=[0, 1])
    tasks = make_tasks(exp, {0: (factor, factor)})
    leader, guided, first_edge = tasks[0], tasks[1], tasks[2]
    assert len(tasks) == 4 and not guided.edge and first_edge.edge and first_edge.leader is leader
    upward = target != "min_replicas"

    def meets(threshold):
        return (lambda v: v <= threshold) if upward else (lambda v: v >= threshold)

    drive_one(leader, meets(central))
    probed = drive_one(first_edge, meets(edge))
    moved = leader.lo / factor if upward else leader.hi * factor
    assert probed[0] == pytest.approx(round(moved) if isinstance(low, int) else moved)
    assert first_edge.answer == pytest.approx(edge, rel=0.05) if upward else first_edge.answer == edge
    assert len(probed) <= 4  # a guess near the answer: one step out, then done (the full search takes ~8)


def test_a_one_sided_band_searches_one_edge():
    exp = experiment(slo={"p99_ttft_ms": 1}, search={"target": "max_rate", "low": 0.25, "high": 16}, seeds=[0])
    band = me.ModelError(me.MEASURED, "a100-80gb", "fixture", [], (0.0, 6.85))  # never too fast: x 1 at lo
    edges = [t for t in make_tasks(exp, {0: band.scales}) if t.edge]
    assert [t.step_scale for t in edges] == [pytest.approx(1 / 1.0685)]


def test_no_edges_without_a_band_or_for_a_burst_replay():
    exp = experiment(slo={"p99_ttft_ms": 1}, search={"target": "max_rate", "low": 0.25, "high": 16})
    assert len(make_tasks(exp, {})) == len(make_tasks(exp)) == len(exp.seeds)
    burst = experiment(slo={"p99_ttft_ms": 1}, workload={**TINY_WORKLOAD, "mode": "burst"},
                       search={"target": "max_burst_scale", "low": 0.25, "high": 16})
    assert not any(t.edge for t in make_tasks(burst, {0: (0.9, 1.1)}))


def band_file(tmp_path: Path, band: list[float]) -> Path:
    doc = json.loads(FIXTURE.read_text())
    doc["sources"]["analytic"]["step_band_pct"] = band  # the source of the experiment's GPU (no table given)
    path = tmp_path / f"band{band[0]:g}_{band[1]:g}.json"
    path.write_text(json.dumps(doc))
    return path


def run_with_band(tmp_path: Path, monkeypatch, band: list[float]) -> tuple[pd.Series, pd.DataFrame, Path]:
    """The experiment with its GPU's band set to `band`; a second call resumes from the first's runs
    (the central search's are the same configurations: only the edge searches run again)."""
    monkeypatch.setattr(me, "MODEL_ERROR_FILE", band_file(tmp_path, band))
    doc = {"name": "band", "model": "llama-3-8b", "hardware": "a100-40gb", "workload": TINY_WORKLOAD,
           "probe": {"duration_s": 60, "min_requests": 100}, "seeds": [0],
           "search": {"target": "max_rate", "low": 1, "high": 64, "tolerance": 0.05},
           "slo": {"p99_ttft_ms": 500, "p90_tpot_ms": 25}, "outputs": {"plots": False}}
    out = tmp_path / "out"
    resume = ["--resume"] if out.exists() else []
    assert main(["run", str(write_yaml(tmp_path / "band.yaml", doc)), "--out", str(out), "--quiet", *resume]) == 0
    return pd.read_parquet(out / "points.parquet").iloc[0], pd.read_parquet(out / "runs.parquet"), out


def edge_answer(runs: pd.DataFrame, factor: float) -> float:
    """An edge search's answer from its runs alone: its highest probe that met, every probe above it failed."""
    mine = runs[np.isclose(runs["step_scale"], factor, rtol=1e-12)]
    assert len(mine)
    best = mine.loc[mine["slo_met"], "probe"].max()
    assert not mine.loc[mine["probe"] > best, "slo_met"].any()
    return float(best)


@pytest.mark.slow
def test_a_wider_band_gives_a_wider_capacity_range(tmp_path, monkeypatch, capsys):
    narrow, narrow_runs, _ = run_with_band(tmp_path, monkeypatch, [-5.0, 5.0])
    wide, wide_runs, out = run_with_band(tmp_path, monkeypatch, [-25.0, 30.0])
    printed = capsys.readouterr().out
    assert narrow["answer"] == wide["answer"]  # the same central search (its runs are the same configurations)
    for point, runs, band in ((narrow, narrow_runs, (-5.0, 5.0)), (wide, wide_runs, (-25.0, 30.0))):
        fast, slow = 1 / (1 + band[1] / 100), 1 / (1 + band[0] / 100)  # a real step: modelled / (1 + error)
        assert point["capacity_model_lo"] <= point["answer"] <= point["capacity_model_hi"]
        # one seed: the range is the edge searches' own answers
        assert point["capacity_model_lo"] == pytest.approx(min(edge_answer(runs, slow), point["answer"]))
        assert point["capacity_model_hi"] == pytest.approx(max(edge_answer(runs, fast), point["answer"]))
        assert sorted(set(runs["step_scale"])) == pytest.approx([fast, 1.0, slow])
    assert wide["capacity_model_lo"] < narrow["capacity_model_lo"]
    assert wide["capacity_model_hi"] > narrow["capacity_model_hi"]
    assert (wide["model_error_source"], wide["model_error_band_lo_pct"]) == (me.ANALYTIC, -25.0)
    assert (wide_runs["capacity_model_hi"] == wide["capacity_model_hi"]).all()
    shown = f"model range {wide['capacity_model_lo']:.4g}-{wide['capacity_model_hi']:.4g}"
    assert shown in printed and shown in (out / "summary.md").read_text()  # the terminal answer
    summary = (out / "summary.md").read_text()
    assert "## Model error" in summary and "analytic, transferred" in summary and "| gemm | 80 |" in summary
    report = (out / "report.html").read_text()
    assert "<h2>Model error</h2>" in report and shown in report
    block = json.loads((out / "result.json").read_text())["model_error"][0]
    assert block["step_band_pct"] == [-25.0, 30.0] and block["hardware"] == "a100-40gb"
    assert block["capacity"]["model_lo"] == pytest.approx(wide["capacity_model_lo"])
    assert not math.isnan(block["capacity"]["model_hi"])


def test_a_point_without_a_range_says_why():
    from kvplan.experiments.model_range import missing_range, range_clause

    band = me.ModelError(me.ANALYTIC, "h100-sxm", "fixture", [], (-10.0, 10.0))
    exp = experiment(slo={"p99_ttft_ms": 1}, search={"target": "max_rate", "low": 0.25, "high": 16})
    tasks = make_tasks(exp)
    assert "only for the recommended or tied points" in missing_range(exp, tasks, band)
    assert missing_range(exp, tasks, me.ModelError(me.UNKNOWN, "h100-sxm", "no file")) == "model error unknown"
    assert missing_range(exp, make_tasks(exp, {0: (0.9, 1.1)}), band) == ""
    burst = experiment(slo={"p99_ttft_ms": 1}, workload={**TINY_WORKLOAD, "mode": "burst"},
                       search={"target": "max_burst_scale", "low": 0.25, "high": 16})
    assert "burst replay" in missing_range(burst, make_tasks(burst), band)
    row = pd.Series({"answer": 5.0, "capacity_model_lo": math.nan, "capacity_model_hi": 6.5, "model_range_note": ""})
    assert range_clause(row) == "model range outside the range searched-6.5"


@pytest.mark.slow
def test_every_point_gets_its_range_when_asked(tmp_path, monkeypatch):
    monkeypatch.setattr(me, "MODEL_ERROR_FILE", FIXTURE)
    doc = {"name": "every", "model": "llama-3-8b", "hardware": "a100-40gb", "workload": TINY_WORKLOAD,
           "probe": {"duration_s": 60, "min_requests": 100}, "seeds": [0],
           "sweep": {"grid": {"hardware": ["a100-40gb", "h100-sxm"]}},
           "search": {"target": "max_rate", "low": 1, "high": 64, "tolerance": 0.1, "model_range": "every_point"},
           "slo": {"p99_ttft_ms": 500, "p90_tpot_ms": 25}, "outputs": {"plots": False, "report": False}}
    out = tmp_path / "out"
    assert main(["run", str(write_yaml(tmp_path / "every.yaml", doc)), "--out", str(out), "--quiet", "--json"]) == 0
    points = pd.read_parquet(out / "points.parquet")
    assert (points["capacity_model_lo"] <= points["answer"]).all()
    assert (points["answer"] <= points["capacity_model_hi"]).all()
    assert points["model_error_source"].tolist() == [me.ANALYTIC] * 2
    runs = pd.read_parquet(out / "runs.parquet")
    scales = {p: sorted(set(g["step_scale"])) for p, g in runs.groupby("point")}
    assert scales[0] == scales[1] == pytest.approx([1 / 1.15, 1.0, 1 / 0.88])  # the band [-12, 15]: steps / (1 + e)


def test_points_tied_for_best_each_get_their_range(tmp_path, monkeypatch):
    """No recommendation on a tie, yet each tied point's answer still states its model range: the edge searches
    run for every point tied for best (`runner.recommended_points`), not for none."""
    monkeypatch.setattr(me, "MODEL_ERROR_FILE", FIXTURE)
    doc = {"name": "tied", "model": "llama-3-8b", "hardware": "a100-40gb", "workload": TINY_WORKLOAD,
           "probe": {"duration_s": 60, "min_requests": 100}, "seeds": [0],
           # the eviction policy never acts here (prefix caching off): two configurations, one server, a tie
           "engine": {"enable_prefix_caching": False},
           "sweep": {"grid": {"engine.eviction_policy": ["lru", "fifo"]}},
           "search": {"target": "max_rate", "low": 1, "high": 64, "tolerance": 0.2},
           "slo": {"p99_ttft_ms": 500, "p90_tpot_ms": 25}, "outputs": {"plots": False, "report": False}}
    out = tmp_path / "out"
    assert main(["run", str(write_yaml(tmp_path / "tied.yaml", doc)), "--out", str(out), "--quiet", "--json"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["recommendation"]["point"] is None
    assert sorted(t["point"] for t in result["recommendation"]["tie"]) == [0, 1]
    points = pd.read_parquet(out / "points.parquet")
    assert points["answer"].nunique() == 1
    assert (points["capacity_model_lo"] <= points["answer"]).all()
    assert (points["answer"] <= points["capacity_model_hi"]).all()
