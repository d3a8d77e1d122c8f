"""The terminal answer on constructed results (no simulation): a tie recommends nothing, a clear winner is
recommended over the next best, a gate-limited point names the gate and its key, a search that ran out of range
names the bound, the table fits 100 columns with long labels; and one small replica search end to end, with
--wide."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from kvplan.cli import main
from kvplan.experiments import binding
from kvplan.experiments.answer import WIDTH, markdown_answer, render
from kvplan.experiments.criteria import failures
from kvplan.experiments.points import expand
from kvplan.experiments.ranking import recommend
from kvplan.experiments.schema import parse_experiment
from kvplan.experiments.search import PointTask, slo_verdict
from kvplan.traces import Trace
from kvplan.traces.io import render as render_trace

WORKLOAD = {"synthetic": {"requests": 50, "arrivals": {"process": "poisson", "rate": 4},
                          "lengths": {"prompt": {"dist": "fixed", "value": 100},
                                      "output": {"dist": "fixed", "value": 10}}}}
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def experiment(**doc):
    base = {"name": "t", "model": "llama-3-8b", "hardware": "a100-40gb", "workload": WORKLOAD,
            "slo": {"p99_ttft_ms": 1000, "p90_tpot_ms": 50}, "seeds": [0, 1, 2],
            "search": {"target": "max_rate", "low": 0.5, "high": 48},
            "sweep": {"grid": {"hardware": ["a100-40gb", "h100-sxm"], "engine.enable_prefix_caching": [True, False]}}}
    return parse_experiment({**base, **doc}, Path("t.yaml"))


def points(exp, answers: list[tuple[float, float, float]], **extra) -> pd.DataFrame:
    """One row per point of `exp`: (median, low, high) answers; the binding columns say p90 TPOT."""
    rows = []
    for point, (answer, low, high) in zip(expand(exp), answers, strict=True):
        rows.append({"point": point.index, "label": point.label, **point.values, "answer": answer,
                     "answer_low": low, "answer_high": high, "capacity_model_lo": math.nan,
                     "capacity_model_hi": math.nan, "model_error_source": "analytic", "model_range_note": "",
                     "answers": ", ".join(f"{v:.4g}" for v in (low, answer, high)), "capacity_rps": answer,
                     "capacity_tok_s": 1000 * answer, "p90_e2el_ms": 900.0, "slo_met": True,
                     "search_outcome": "found", "binding_limit": "p90 TPOT", "binding_key": "slo.p90_tpot_ms",
                     "binding_detail": "p90_tpot_ms 60 > 50 at 9 req/s", "binding_votes": 3, "binding_of": 3,
                     "binding_at": 9.0, **extra})
    return pd.DataFrame(rows)


def test_overlapping_seed_intervals_are_a_tie_and_nothing_is_recommended():
    exp = experiment()
    frame = points(exp, [(7.5, 7.0, 8.0), (3.2, 3.0, 4.2), (21.9, 20.5, 23.5), (21.0, 19.0, 22.0)])
    rec = recommend(exp, frame)
    assert rec.point is None and rec.tie == [2, 3] and rec.why.startswith("tie: ")
    text = render(exp, frame, rec)
    assert "Tie: h100-sxm prefix_caching (20.5-23.5), h100-sxm no prefix_caching (19-22)" in text
    assert "Recommended" not in text and re.search(r"^= +h100-sxm prefix_caching ", text, re.M)
    summary = "\n".join(markdown_answer(exp, frame, rec))
    assert "Tie: h100-sxm prefix_caching (20.5-23.5)" in summary and "| = | h100-sxm prefix_caching |" in summary


def test_a_clear_winner_is_recommended_over_the_next_best():
    exp = experiment()
    frame = points(exp, [(7.5, 7.0, 8.0), (3.2, 3.0, 4.2), (21.9, 21.9, 23.5), (13.3, 13.3, 14.3)])
    rec = recommend(exp, frame)
    assert rec.point == 2 and rec.runner_up == 3 and not rec.tie
    text = render(exp, frame, rec)
    assert ("Recommended (*): h100-sxm prefix_caching, 21.9 req/s (seeds 21.9-23.5), clear of the next best, "
            "h100-sxm no prefix_caching (13.3-14.3).") in " ".join(text.split())
    assert re.search(r"^\* +h100-sxm prefix_caching ", text, re.M) and "p90 TPOT (3/3)" in text


def test_a_plain_sweep_ties_on_the_objectives_seed_spread():
    exp = experiment(search=None, sweep={"grid": {"engine.eviction_policy": ["lru", "lfu"]}}, seeds=[0, 1])
    frame = pd.DataFrame({"point": [0, 1], "label": ["eviction_policy=lru", "eviction_policy=lfu"],
                          "engine.eviction_policy": ["lru", "lfu"], "slo_met": [True, True],
                          "p90_e2el_ms": [900.0, 880.0], "objective_low": [850.0, 870.0],
                          "objective_high": [950.0, 890.0]})
    rec = recommend(exp, frame)
    assert rec.point is None and rec.tie == [1, 0]
    separated = frame.assign(objective_low=[930.0, 870.0], objective_high=[950.0, 890.0], p90_e2el_ms=[940.0, 880.0])
    assert recommend(exp, separated).point == 1


def test_equal_gpus_and_overlapping_replica_ranges_tie():
    exp = experiment(search={"target": "min_replicas", "low": 1, "high": 16},
                     sweep={"grid": {"engine.eviction_policy": ["lru", "lfu"]}})
    frame = pd.DataFrame({"point": [0, 1], "label": ["lru", "lfu"], "engine.eviction_policy": ["lru", "lfu"],
                          "answer": [3.0, 3.0], "answer_low": [3.0, 2.0], "answer_high": [3.0, 3.0],
                          "gpus_per_replica": [1, 1], "gpus": [3.0, 3.0], "p90_e2el_ms": [500.0, 400.0],
                          "answers": ["3, 3, 3", "2, 3, 3"], "capacity_rps": [1.0, 1.0], "capacity_tok_s": [1.0, 1.0]})
    rec = recommend(exp, frame)
    assert rec.point is None and set(rec.tie) == {0, 1}


def probe_doc(delay_s: float, ttft_ms: float = 400.0) -> dict:
    """A run's summary.json whose probe held the SLOs but queued requests `delay_s` (p99) before scheduling."""
    signals = {"window_s": [60, 540], "stopped_s": 700, "sent": 5000, "warmup_requests": 500,
               "measured_requests": 4000, "cooldown_requests": 500, "completed_measured": 4000,
               "rejected_measured": 0, "unfinished_requests": 0, "queue_first": 3.0, "queue_second": 3.2,
               "ttft_first_ms": 300.0, "ttft_second_ms": 320.0, "p99_queue_delay_ms": delay_s * 1e3,
               "offered_rps": 8.0, "stopped_early": ""}
    return {"summary": {"p99_ttft_ms": ttft_ms, "p90_tpot_ms": 40.0, "completed": 4000, "num_preemptions": 0,
                        "num_rejected": 0}, "attainment": None,
            "probe": {**signals, "verdict": "backlogged" if delay_s > 3 else "stable",
                      "reasons": [f"p99 scheduling delay {delay_s:.3g} s > 3 s"] if delay_s > 3 else []}}


def test_a_gate_limited_point_names_the_gate_and_its_key():
    exp = experiment(probe={"max_queue_delay_s": 3})
    doc = probe_doc(4.2)
    found = failures(exp, doc)
    assert [(f.limit, f.key, f.value, f.bound) for f in found] == [
        ("p99 scheduling delay", "probe.max_queue_delay_s", pytest.approx(4.2), 3.0)]
    assert slo_verdict(exp, doc) == (False, ["backlogged: p99 scheduling delay 4.2 s > 3 s"])
    point = expand(exp)[0]
    task = PointTask(exp, point, [0])
    task.probes, task.lo, task.hi, task.done = [(0.5, True), (48, False), (9.0, True), (9.5, False)], 9.0, 9.5, True
    runs = pd.DataFrame({"point": [0, 0], "seed": [0, 0], "step_scale": [1.0, 1.0], "probe": [9.0, 9.5],
                         "slo_met": [True, False], "failures": [[], [f.as_dict() for f in found]]})
    bound = binding.search_binding([task], runs)
    assert (bound.limit, bound.key, bound.at) == ("p99 scheduling delay", "probe.max_queue_delay_s", 9.5)
    frame = points(exp, [(9.0, 9.0, 9.0)] * 4, **{k: v for k, v in bound.columns().items()})
    text = " ".join(render(exp, frame, recommend(exp, frame)).split())
    assert "p99 scheduling delay" in text and "probe.max_queue_delay_s" in text
    assert "p99 scheduling delay <= 3 s (probe.max_queue_delay_s)" in text  # the gate, its value and key


def test_a_search_that_ran_out_of_range_is_bound_limited():
    exp = experiment()
    top = PointTask(exp, expand(exp)[0], [0])
    top.probes, top.lo, top.done = [(0.5, True), (48, True)], 48, True
    top.outcome = "meets the SLOs up to the highest value searched, 48 req/s"
    empty = pd.DataFrame(columns=["point", "seed", "step_scale", "probe", "slo_met", "failures"])
    assert binding.search_binding([top], empty).key == "search.high"
    low = PointTask(exp, expand(exp)[0], [0])
    low.probes, low.done, low.outcome = [(0.5, False)], True, "fails already at the lowest value searched, 0.5 req/s"
    failing = pd.DataFrame({"point": [0], "seed": [0], "step_scale": [1.0], "probe": [0.5], "slo_met": [False],
                            "failures": [[f.as_dict() for f in failures(exp, probe_doc(0.1, ttft_ms=2500.0))]]})
    found = binding.search_binding([low], failing)
    assert found.key == "search.low" and "p99_ttft_ms 2500.0 > 1000" in found.detail


def test_the_quickstart_like_answer_fits_100_columns_with_long_labels():
    exp = experiment(sweep={"grid": {"hardware": ["a100-40gb", "h100-sxm"],
                                     "engine.max_num_batched_tokens": [2048, 16384],
                                     "engine.eviction_policy": ["lru", "s3fifo"]}})
    frame = points(exp, [(7.5 + i, 7.0 + i, 8.0 + i) for i in range(8)],
                   capacity_model_lo=6.0, capacity_model_hi=9.0)
    frame["binding_limit"], frame["binding_key"] = "p99 scheduling delay", "probe.max_queue_delay_s"
    rec = recommend(exp, frame)
    plain = render(exp, frame, rec)
    assert "\x1b[" not in plain and max(map(len, plain.splitlines())) <= WIDTH
    colored = render(exp, frame, rec, terminal=True)
    assert "\x1b[" in colored and max(len(ANSI.sub("", line)) for line in colored.splitlines()) <= WIDTH
    assert "model range" in plain and "h100-sxm max_num_batched_tokens=16384" in " ".join(plain.split())


def test_a_replica_search_end_to_end_and_wide(tmp_path, capsys):
    """12 prompts at t = 0 on the burst path (milliseconds per run): the answer in <= 100 plain columns naming
    its binding limit, result.json's new fields, the latency plot against GPUs; --wide prints summary.md."""
    n = 12
    trace = Trace.build(np.zeros(n), np.full(n, 512), np.ones(n, dtype=np.int64))
    (tmp_path / "burst.jsonl").write_bytes(render_trace(trace, "jsonl"))
    doc = {"name": "replicas", "model": "llama-3-8b", "hardware": "a100-40gb",
           "engine": {"max_num_seqs": 1, "max_num_batched_tokens": 512, "enable_prefix_caching": False,
                      "entry_point": "engine"},
           "workload": {"trace": "burst.jsonl", "mode": "burst"},
           "search": {"target": "min_replicas", "low": 1, "high": n}, "slo": {"p90_ttft_ms": 250},
           "outputs": {"report": False}}
    path = tmp_path / "replicas.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert max(map(len, printed.splitlines())) <= WIDTH and "\x1b[" not in printed
    points_table = pd.read_parquet(out / "points.parquet")
    row = points_table.iloc[0]
    assert row["binding_key"] == "slo.p90_ttft_ms" and row["binding_at"] == row["answer"] - 1
    assert "p90 TTFT" in printed and "slo.p90_ttft_ms" in printed and "Recommended (*): base" in printed
    result = json.loads((out / "result.json").read_text())
    assert result["recommendation"]["tie"] == [] and any(g["key"] == "search.low, search.high"
                                                        for g in result["gates"])
    assert (out / "plots" / "latency_vs_gpus.png").is_file()
    runs = pd.read_parquet(out / "runs.parquet")
    assert all(f["key"] == "slo.p90_ttft_ms" for fs in runs["failures"] for f in fs)
    assert main(["run", str(path), "--out", str(out), "--quiet", "--resume", "--wide"]) == 0
    wide = capsys.readouterr().out
    assert wide.rstrip("\n") == (out / "summary.md").read_text().rstrip("\n") and "## Points" in wide
