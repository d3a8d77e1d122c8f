"""Steady-state capacity: the answer does not depend on how many requests the trace holds nor (beyond its
interval) on the probe's length; the stability gate fails a probe just past capacity that a percentile SLO
alone would pass; warm-up, cool-down and unfinished requests are counted; concurrency and burst searches run."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from kvplan.cli import main
from kvplan.sim.probe import Probe, run_probe
from kvplan.sim.spec import SimSpec
from kvplan.traces.steady import population
from kvplan.traces.synth import synthesize

ROOT = Path(__file__).resolve().parents[2]
CHAT = yaml.safe_load((ROOT / "traces" / "samples" / "chat.yaml").read_text())  # the quickstart's workload spec
# Llama-3-8B on an A100-40GB without prefix caching: a few requests per second, so probes stay cheap.
BASE = {"model": "llama-3-8b", "hardware": "a100-40gb", "engine": {"block_size": 16, "enable_prefix_caching": False},
        "outputs": {"plots": False, "report": False}}


def chat(requests: int) -> dict:
    return {**CHAT, "requests": requests}


def run(tmp_path: Path, name: str, capsys, **doc) -> dict:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, **BASE, **doc}, sort_keys=False))
    assert main(["run", str(path), "--out", str(tmp_path / name), "--json", "--workers", "2"]) == 0
    return json.loads(capsys.readouterr().out)["points"][0]


def capacity(tmp_path, capsys, name: str, requests: int, duration: float, min_requests: int = 1000) -> dict:
    # Five seeds: on this workload a seed's p90 TPOT at one rate spreads by up to 1.6x (how many 2048-token
    # prefill chunks land inside a request's decode), so a median of three moves by more than 5% between two
    # draws of the same population; a median of five holds still.
    return run(tmp_path, name, capsys, workload={"synthetic": chat(requests)}, seeds=[0, 1, 2, 3, 4],
               probe={"duration_s": duration, "min_requests": min_requests},
               search={"target": "max_rate", "low": 1, "high": 16, "tolerance": 0.05},
               slo={"p90_ttft_ms": 1000, "p90_tpot_ms": 50})


@pytest.mark.slow
def test_capacity_does_not_depend_on_the_traces_length_or_the_probes(tmp_path, capsys):
    """The same workload spec generated at N and 10N requests gives the same sustained capacity within the
    seeds' range and within 5%; doubling the probe duration moves it by less than the range's width."""
    small = capacity(tmp_path, capsys, "n", 240, 300)
    large = capacity(tmp_path, capsys, "ten_n", 2400, 300)
    longer = capacity(tmp_path, capsys, "n_long", 240, 600)
    for point in (small, large, longer):
        assert point["search_outcome"] == "found" and point["seeds"] == 5
        assert point["answer_low"] <= point["answer"] <= point["answer_high"]
    assert abs(large["answer"] - small["answer"]) <= 0.05 * small["answer"]
    assert small["answer_low"] <= large["answer"] <= small["answer_high"]
    width = small["answer_high"] - small["answer_low"]
    assert abs(longer["answer"] - small["answer"]) <= width


@pytest.mark.slow
def test_the_gate_fails_a_probe_past_capacity_that_its_percentiles_would_pass(tmp_path, capsys):
    """With an SLO too loose to bind (p99 TTFT <= 60 s), capacity is where the server stops being stable (found to
    2%): a probe at 1.05x is backlogged or overloaded although its p99 TTFT is under the SLO, and one at 0.9x is
    stable."""
    loose = 60_000.0
    point = run(tmp_path, "gate", capsys, workload={"synthetic": chat(120)}, seeds=[0],
                probe={"duration_s": 300, "min_requests": 300},
                search={"target": "max_rate", "low": 1, "high": 16, "tolerance": 0.02},
                slo={"p99_ttft_ms": loose})
    found = point["answer"]
    pop = population(synthesize({**chat(120), "seed": CHAT["seed"]}))  # the experiment's seed 0 workload
    spec = SimSpec(model="llama-3-8b", hardware="a100-40gb", enable_prefix_caching=False)

    def probe(rate: float):
        return run_probe(pop, spec, Probe(rate=rate, duration_s=300, min_requests=300), seed=0)

    over, under = probe(1.05 * found), probe(0.9 * found)
    assert over.info["probe"]["verdict"] in ("backlogged", "overloaded"), over.info["probe"]
    assert over.summary["p99_ttft_ms"] < loose  # the percentile alone would have passed it
    assert under.info["probe"]["verdict"] == "stable", under.info["probe"]


def test_warm_up_cool_down_and_unfinished_requests_are_counted(tmp_path, capsys):
    """Every sent request is in exactly one phase; an overloaded probe's unfinished requests are counted and
    kept out of the latencies; the counts reach runs.parquet."""
    pop = population(synthesize(chat(120)))
    spec = SimSpec(model="llama-3-8b", hardware="a100-40gb", enable_prefix_caching=False)
    for rate, verdict in ((2.0, "stable"), (12.0, "overloaded")):
        result = run_probe(pop, spec, Probe(rate=rate, duration_s=300, min_requests=100), seed=1)
        info = result.info["probe"]
        assert info["verdict"] == verdict
        assert info["warmup_requests"] + info["measured_requests"] + info["cooldown_requests"] == info["sent"]
        table = result.requests
        assert set(table["phase"]) <= {"warmup", "measured", "cooldown"}
        assert info["completed_measured"] == table.loc[(table["phase"] == "measured") & (table["sample"] == 0),
                                                       "request"].nunique()
        assert info["sent"] - table["request"].nunique() == info["unfinished_requests"] + result.info["rejected"]
        if verdict == "overloaded":
            assert info["unfinished_requests"] > 0 and info["stopped_early"]
        else:
            assert info["unfinished_requests"] == 0
    point = run(tmp_path, "counts", capsys, workload={"synthetic": chat(120), "rate": 2.0},
                probe={"duration_s": 300, "min_requests": 100}, slo={"p99_ttft_ms": 1000})
    runs = pd.read_parquet(tmp_path / "counts" / "runs.parquet")
    assert (runs["verdict"] == "stable").all() and (runs["measured_requests"] > 0).all()
    assert (runs[["warmup_requests", "cooldown_requests", "unfinished_requests"]] >= 0).all(axis=None)
    assert point["measured_requests"] == runs["measured_requests"].mean()
    assert "measured_requests" in (tmp_path / "counts" / "summary.md").read_text()


@pytest.mark.slow
def test_concurrency_and_burst_searches_answer_their_own_questions(tmp_path, capsys):
    """max_concurrency bisects on users in a closed loop; max_burst_scale replays the recorded trace time-scaled
    and served to its end."""
    users = run(tmp_path, "users", capsys, workload={"synthetic": chat(120), "think_s": 2},
                probe={"duration_s": 150, "min_requests": 100}, seeds=[0],
                search={"target": "max_concurrency", "low": 1, "high": 128}, slo={"p90_tpot_ms": 50})
    runs = pd.read_parquet(tmp_path / "users" / "runs.parquet")
    runs = runs[runs["step_scale"] == 1.0]  # the answer's own search, not the model range's edge searches
    assert (runs["workload.mode"] == "concurrency").all() and users["search_outcome"] == "found"
    assert 1 < users["answer"] < 128 and users["capacity_rps"] > 0
    best = runs.loc[runs["slo_met"], "probe"].max()  # the answer: every probe above it fails
    assert best == users["answer"] and runs.loc[runs["probe"] > best, "slo_met"].eq(False).all()
    burst = run(tmp_path, "burst", capsys, workload={"synthetic": chat(120)}, seeds=[0],
                search={"target": "max_burst_scale", "low": 0.5, "high": 64, "tolerance": 0.1},
                slo={"p90_tpot_ms": 50})
    runs = pd.read_parquet(tmp_path / "burst" / "runs.parquet")
    assert runs["verdict"].eq("burst").all() and runs["measured_requests"].isna().all()
    trace = synthesize({**chat(120), "seed": CHAT["seed"]})
    own_rate = len(trace) / (trace.arrival_s[-1] - trace.arrival_s[0])
    assert burst["search_outcome"] == "found"
    assert burst["offered_rate_rps"] == pytest.approx(burst["answer"] * own_rate)  # the recording, time-scaled
    assert (runs["completed"] == len(trace)).all()  # every request served to its end: nothing trimmed


@pytest.mark.slow
def test_goodput_is_in_every_summary_and_can_be_searched(tmp_path, capsys):
    """max_goodput: the highest sustained rate at which the attainment SLO holds; request_goodput counts the
    measured requests within every per-request bound, per second of window."""
    bounds = {"ttft_ms": 1000, "tpot_ms": 50, "fraction": 0.9}
    point = run(tmp_path, "goodput", capsys, workload={"synthetic": chat(120)}, seeds=[0],
                probe={"duration_s": 200, "min_requests": 100},
                search={"target": "max_goodput", "low": 0.5, "high": 16, "tolerance": 0.1},
                slo={"attainment": bounds})
    runs = pd.read_parquet(tmp_path / "goodput" / "runs.parquet")
    runs = runs[runs["step_scale"] == 1.0]  # the answer's own search, not the model range's edge searches
    assert point["search_outcome"] == "found" and runs["request_goodput"].notna().all()
    at = runs[runs["probe"] == point["answer"]].iloc[0]
    assert at["attainment"] >= 0.9 and at["slo_met"]
    assert at["request_goodput"] == pytest.approx(at["attainment"] * at["offered_rate_rps"], rel=0.02)
    assert not runs.loc[runs["probe"] > point["answer"], "slo_met"].any()
    assert "goodput" in (tmp_path / "goodput" / "summary.md").read_text()
