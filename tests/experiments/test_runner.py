"""Running experiments: the bisection against a known threshold (plain and guided by another seed's bracket), a
replica search against hand arithmetic, a sweep killed midway and resumed, and the quickstart (reduced) end to
end with its outputs agreeing."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from kvplan.cli import main
from kvplan.experiments.points import expand
from kvplan.experiments.schema import parse_experiment
from kvplan.experiments.search import PointTask, make_tasks
from kvplan.traces import Trace
from kvplan.traces.io import render

ROOT = Path(__file__).resolve().parents[2]
TINY_WORKLOAD = {"synthetic": {"seed": 4, "requests": 120, "arrivals": {"process": "poisson", "rate": 4},
                               "lengths": {"prompt": {"dist": "lognormal", "median": 300, "sigma": 0.6, "max": 2000},
                                           "output": {"dist": "lognormal", "median": 60, "sigma": 0.5,
                                                      "max": 400}}}}


def experiment(**doc):
    base = {"name": "t", "model": "llama-3-8b", "hardware": "a100-40gb", "workload": TINY_WORKLOAD}
    return parse_experiment({**base, **doc}, Path("t.yaml"))


def drive(task: PointTask, meets) -> list:
    """Run a task's bisection against a verdict function of the probed value; returns the values probed."""
    rounds = task.first()
    probed = []
    while rounds:
        value = task.current
        probed.append(value)
        assert all(r["seed"] in (0, 1) for r in rounds) and len(rounds) == 2
        rounds = task.next(meets(value))
    return probed


@pytest.mark.parametrize("threshold", [0.3, 1.0, 3.7, 15.9])
def test_rate_bisection_brackets_the_threshold_within_the_tolerance(threshold):
    exp = experiment(slo={"p99_ttft_ms": 1}, search={"target": "max_rate", "low": 0.25, "high": 16,
                                                     "tolerance": 0.05}, seeds=[0, 1])
    task = PointTask(exp, expand(exp)[0], [0, 1])
    probed = drive(task, lambda rate: rate <= threshold)
    assert task.answer <= threshold < task.answer * 1.05
    assert len(probed) <= 2 + int(np.ceil(np.log2(np.log(64) / np.log(1.05))))  # geometric bisection


@pytest.mark.parametrize(("first", "second"), [(3.7, 3.7), (3.7, 4.4), (3.7, 2.1), (3.7, 15.99), (3.7, 0.26),
                                               (3.7, 0.1), (3.7, 30.0)])
def test_a_guided_search_finds_its_own_answer_from_the_leaders_bracket(first, second):
    """The second seed starts from the first seed's bracket and still brackets its own threshold within the
    tolerance - or says it lies outside [low, high] - in fewer probes when the thresholds are close."""
    exp = experiment(slo={"p99_ttft_ms": 1}, search={"target": "max_rate", "low": 0.25, "high": 16,
                                                     "tolerance": 0.05}, seeds=[0, 1])
    leader, guided = make_tasks(exp)
    assert guided.leader is leader and not guided.ready
    full = len(drive_one(leader, lambda rate: rate <= first))
    assert guided.ready
    probed = drive_one(guided, lambda rate: rate <= second)
    if second < 0.25:
        assert guided.answer is None and "lowest value searched" in guided.outcome
    elif second > 16:
        assert guided.answer == 16 and "highest value searched" in guided.outcome
    else:
        assert guided.answer <= second < guided.answer * 1.05
    if abs(np.log(second / first)) < 0.2:
        assert len(probed) < full


@pytest.mark.parametrize("needed", [1, 3, 9, 17])
def test_a_guided_replica_search_finds_the_fewest_replicas(needed):
    exp = experiment(slo={"p99_ttft_ms": 1}, search={"target": "min_replicas", "low": 1, "high": 16},
                     seeds=[0, 1])
    leader, guided = make_tasks(exp)
    drive_one(leader, lambda replicas: replicas >= 6)
    drive_one(guided, lambda replicas: replicas >= needed)
    assert guided.answer == (needed if needed <= 16 else None)


def drive_one(task: PointTask, meets) -> list:
    rounds, probed = task.first(), []
    while rounds:
        probed.append(task.current)
        rounds = task.next(meets(task.current))
    return probed


def test_rate_bisection_says_when_the_answer_is_outside_the_range():
    exp = experiment(slo={"p99_ttft_ms": 1}, search={"target": "max_rate", "low": 1, "high": 4}, seeds=[0, 1])
    low = PointTask(exp, expand(exp)[0], [0, 1])
    drive(low, lambda rate: False)
    assert low.answer is None and "lowest value searched, 1 req/s" in low.outcome
    high = PointTask(exp, expand(exp)[0], [0, 1])
    drive(high, lambda rate: True)
    assert high.answer == 4 and "highest value searched" in high.outcome


@pytest.mark.parametrize("needed", [1, 2, 7, 32, 33])
def test_replica_bisection_finds_the_fewest_replicas(needed):
    exp = experiment(slo={"p99_ttft_ms": 1}, search={"target": "min_replicas", "low": 1, "high": 32},
                     seeds=[0, 1])
    task = PointTask(exp, expand(exp)[0], [0, 1])
    probed = drive(task, lambda replicas: replicas >= needed)
    assert task.answer == (needed if needed <= 32 else None)
    assert len(probed) <= 2 + 5 and all(isinstance(v, int) for v in probed)


def write_yaml(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_min_replicas_matches_hand_arithmetic(tmp_path, capsys):
    """12 identical prompts at t = 0, one request at a time per replica, one token each: with R round-robin
    replicas, replica j serves its k-th request at k * s (s: the analytic price of one 512-token prefill step),
    so the TTFTs are {1..ceil(12/R)} * s and p90 TTFT <= 3.5 s first holds at R = 4 (R = 3: p90 = 4 s)."""
    from kvplan.sim.cost.features import step_features
    from kvplan.sim.run import analytic_cost
    from kvplan.sim.spec import SimSpec

    n, prompt = 12, 512
    trace = Trace.build(np.zeros(n), np.full(n, prompt), np.ones(n, dtype=np.int64))
    (tmp_path / "burst.jsonl").write_bytes(render(trace, "jsonl"))
    engine = {"block_size": 16, "max_num_seqs": 1, "max_num_batched_tokens": prompt,
              "enable_prefix_caching": False, "entry_point": "engine"}  # the engine's times: no API server
    cost, _ = analytic_cost(SimSpec(model="llama-3-8b", hardware="a100-40gb", block_size=16,
                                    max_num_batched_tokens=prompt, max_num_seqs=1))

    class Item:  # one whole prompt, from position 0, sampled
        num_new_tokens, start_pos, is_decode, samples, spec_token_ids = prompt, 0, False, 1, ()

    s_ms = float(cost.step_times(step_features([Item()], 16, 0))) * 1e3
    by_hand = {r: float(np.percentile([k * s_ms for j in range(r) for k in range(1, len(range(j, n, r)) + 1)], 90))
               for r in range(1, n + 1)}
    bound = 3.5 * s_ms
    assert by_hand[3] == pytest.approx(4 * s_ms) and by_hand[4] == pytest.approx(3 * s_ms)
    doc = {"name": "replicas", "model": "llama-3-8b", "hardware": "a100-40gb", "engine": engine,
           "cluster": {"router": "round_robin"}, "workload": {"trace": "burst.jsonl", "mode": "burst"},
           "search": {"target": "min_replicas", "low": 1, "high": n}, "slo": {"p90_ttft_ms": bound}}
    path = write_yaml(tmp_path / "replicas.yaml", doc)
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["points"][0]["answer"] == min(r for r, v in by_hand.items() if v <= bound) == 4
    runs = pd.read_parquet(tmp_path / "out" / "runs.parquet")
    for _, run in runs.iterrows():  # every probe's simulated p90 TTFT is the hand value
        assert run["p90_ttft_ms"] == pytest.approx(by_hand[int(run["probe"])], rel=1e-6)


def sweep_doc(name: str) -> dict:
    return {"name": name, "model": "llama-3-8b", "hardware": "a100-40gb", "workload": TINY_WORKLOAD,
            "probe": {"duration_s": 120, "min_requests": 100},
            "sweep": {"grid": {"engine.block_size": [8, 16, 32, 64], "engine.eviction_policy": ["lru", "fifo"]}},
            "slo": {"p99_ttft_ms": 2000}, "seeds": [0, 1], "outputs": {"plots": False, "report": False}}


def finished_runs(runs_dir: Path) -> int:
    """Runs renamed into place; a hidden `.KEY.PID.*.tmp` sibling is a run still being written (pathlib's glob
    matches hidden names too)."""
    return sum(1 for p in runs_dir.glob("*/summary.json") if not p.parent.name.startswith("."))


@pytest.mark.slow
def test_a_killed_sweep_resumes_with_only_the_missing_runs(tmp_path):
    path = write_yaml(tmp_path / "sweep.yaml", sweep_doc("sweep"))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "kvplan", "run", str(path), "--out", str(out), "--quiet"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    runs_dir = out.with_name("out.partial") / "runs"
    deadline = time.time() + 120
    while time.time() < deadline and finished_runs(runs_dir) < 3:
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = finished_runs(runs_dir)
    assert 3 <= finished < 16 and not out.exists()
    resumed = subprocess.run([*command, "--resume", "--json"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)
    assert (result["runs_reused"], result["runs_made"]) == (finished, 16 - finished)
    fresh = subprocess.run([sys.executable, "-m", "kvplan", "run", str(path), "--out", str(tmp_path / "fresh"),
                            "--quiet", "--json", "--workers", "2"], capture_output=True, text=True)
    assert fresh.returncode == 0, fresh.stderr
    pd.testing.assert_frame_equal(pd.read_parquet(out / "runs.parquet"),
                                  pd.read_parquet(tmp_path / "fresh" / "runs.parquet"))
    assert not out.with_name("out.partial").exists()


def reduced_quickstart(tmp_path: Path) -> Path:
    doc = yaml.safe_load((ROOT / "experiments" / "quickstart.yaml").read_text())
    doc = copy.deepcopy(doc)
    doc["workload"]["transforms"] = {"window": [0, 100]}
    # two points as cheap as this test was (the quickstart's own two, prefix caching on and off, take 68 s of CPU
    # here instead of 43)
    doc["sweep"]["grid"] = {"hardware": ["a100-40gb", "h100-sxm"], "engine.enable_prefix_caching": [True]}
    doc["search"].update({"high": 16, "tolerance": 0.3})
    doc["probe"] = {"duration_s": 120, "min_requests": 200}
    doc["seeds"] = [0, 1]
    return write_yaml(tmp_path / "quickstart.yaml", doc)


@pytest.mark.slow
def test_quickstart_end_to_end_outputs_agree(tmp_path, capsys, monkeypatch):
    from kvplan.sim.gpu import model_error

    monkeypatch.setattr(model_error, "MODEL_ERROR_FILE", ROOT / "tests" / "sim" / "data" / "model_error.json")
    out = tmp_path / "out"
    assert main(["run", str(reduced_quickstart(tmp_path)), "--out", str(out), "--workers", "2"]) == 0
    printed = capsys.readouterr().out
    result = json.loads((out / "result.json").read_text())
    runs = pd.read_parquet(out / "runs.parquet")
    points = pd.read_parquet(out / "points.parquet")
    assert len(runs) == result["runs"] == result["runs_made"] and len(points) == 2
    for _, point in points.iterrows():
        answers = []
        for seed in (0, 1):  # each seed's own answer: its highest stable, SLO-meeting probe, every probe above fails
            mine = runs[(runs["point"] == point["point"]) & (runs["seed"] == seed) & (runs["step_scale"] == 1)]
            met = mine[mine["slo_met"]]
            assert (met["verdict"] == "stable").all() and len(met)
            answers.append(met["probe"].max())
            above = mine[mine["probe"] > answers[-1]]
            assert point["search_outcome"] != "found" or (len(above) and not above["slo_met"].any())
        assert point["answer"] == pytest.approx(np.median(answers))
        assert (point["answer_low"], point["answer_high"]) == pytest.approx((min(answers), max(answers)))
        if point["label"] == result["recommendation"]["label"]:  # its model range (search.model_range's default)
            assert point["capacity_model_lo"] <= point["answer"] <= point["capacity_model_hi"]
            assert f"model range {point['capacity_model_lo']:.4g}-{point['capacity_model_hi']:.4g}" in printed
        else:
            assert np.isnan(point["capacity_model_lo"]) and "only for the recommended or tied points" in printed
    assert runs[["warmup_requests", "measured_requests", "cooldown_requests", "unfinished_requests"]].notna().all(
        axis=None)
    best = points.sort_values("answer", ascending=False).iloc[0]
    rec = result["recommendation"]
    assert rec["label"] == best["label"] and rec["tie"] == []  # 2 seeds on two GPUs ~3x apart: no tie
    words = " ".join(printed.split())  # the terminal answer: short labels, <= 100 columns, each binding limit named
    assert f"Recommended (*): {best['hardware']} prefix_caching, {best['answer']:.4g} req/s" in words
    assert max(map(len, printed.splitlines())) <= 100 and all(limit in words for limit in points["binding_limit"])
    summary = (out / "summary.md").read_text()
    assert f"**{rec['label']}**" in summary
    report = (out / "report.html").read_text()
    plots = sorted((out / "plots").glob("*.png"))
    assert {p.stem for p in plots} >= {"latency_vs_rate", "capacity", "memory_breakdown", "kv_over_time"}
    assert report.count("data:image/png;base64,") == len(plots) and rec["label"] in report
    assert "unfinished_requests" in report and "Capacity" in report
    assert (out / "experiment.yaml").read_text() == (tmp_path / "quickstart.yaml").read_text()
    for key in runs["run"]:
        assert (out / "runs" / key / "summary.json").is_file() and (out / "runs" / key / "requests.parquet").is_file()


@pytest.mark.slow
def test_ray_backend_runs_the_same_points(tmp_path, capsys):
    pytest.importorskip("ray")
    doc = sweep_doc("ray")
    doc["sweep"] = {"grid": {"engine.block_size": [16, 32]}}
    doc["seeds"] = [0]
    path = write_yaml(tmp_path / "ray.yaml", doc)
    assert main(["run", str(path), "--out", str(tmp_path / "ray"), "--backend", "ray", "--workers", "2",
                 "--json"]) == 0
    assert main(["run", str(path), "--out", str(tmp_path / "local"), "--json"]) == 0
    capsys.readouterr()
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "ray" / "runs.parquet"),
                                  pd.read_parquet(tmp_path / "local" / "runs.parquet"))


def test_a_replica_search_recommends_the_fewest_gpus_not_the_fewest_replicas():
    """3 replicas at TP 2 (6 GPUs) beat 2 replicas at TP 4 (8 GPUs): the recommendation ranks GPUs bought, and
    among equal GPU counts the fewer replicas, then the objective."""
    from kvplan.experiments.results import recommend

    exp = experiment(slo={"p99_ttft_ms": 1000}, search={"target": "min_replicas", "low": 1, "high": 16},
                     sweep={"grid": {"engine.tensor_parallel_size": [2, 4, 8]}})
    points = pd.DataFrame({"point": [0, 1, 2, 3], "label": ["tp2", "tp4", "tp8", "tp1"],
                           "answer": [3.0, 2.0, 1.0, 8.0], "gpus_per_replica": [2, 4, 8, 1],
                           "gpus": [6.0, 8.0, 8.0, 8.0], "p90_e2el_ms": [900.0, 500.0, 400.0, 100.0],
                           "answer_low": [3.0, 2.0, 1.0, 8.0], "answer_high": [3.0, 2.0, 1.0, 8.0],
                           "answers": ["3", "2", "1", "8"], "capacity_rps": [10.0] * 4,
                           "capacity_tok_s": [5000.0] * 4})
    rec = recommend(exp, points)
    assert rec.label == "tp2" and "= 6 GPUs" in rec.why and "ranked by GPUs" in rec.why
    rec = recommend(exp, points[points["label"] != "tp2"])  # 8 GPUs each: the fewest replicas wins
    assert rec.label == "tp8"
