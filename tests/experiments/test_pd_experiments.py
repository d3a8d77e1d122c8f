"""An experiment's `disaggregation:` block (experiments.pd_block): it parses into every point's configuration and
the run's SimSpec, refuses bad input in one line naming the key path (exit 2), and a P/D point runs through the
steady-state probe and a rate search, its rows carrying the P/D columns and its cost the pools' GPUs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from kvplan.cli import main
from kvplan.experiments.execute import build_spec
from kvplan.experiments.fields import SchemaError
from kvplan.experiments.pd_block import gpus
from kvplan.experiments.points import expand, run_config
from kvplan.experiments.schema import parse_experiment
from kvplan.reference.columns import MIN_COST_SEARCH, POINT_COLUMNS, undocumented

WORKLOAD = {"synthetic": {"seed": 4, "requests": 120, "arrivals": {"process": "poisson", "rate": 4},
                          "lengths": {"prompt": {"dist": "lognormal", "median": 600, "sigma": 0.6, "max": 3000},
                                      "output": {"dist": "lognormal", "median": 60, "sigma": 0.5, "max": 300}}}}
BASE = {"name": "t", "model": "llama-3-8b", "hardware": "h100-sxm", "engine": {"entry_point": "llm"},
        "workload": WORKLOAD}
PD = {"prefill_replicas": 1, "decode_replicas": 2}


def experiment(**doc):
    return parse_experiment({**BASE, **doc}, Path("t.yaml"))


def test_the_block_reaches_every_point_and_the_spec():
    exp = experiment(disaggregation={**PD, "decode_tensor_parallel_size": 2},
                     sweep={"grid": {"disaggregation.prefill_replicas": [1, 2]}})
    points = expand(exp)
    assert [p.label for p in points] == ["prefill_replicas=1", "prefill_replicas=2"]
    spec = build_spec(run_config(points[1].config, 0))
    assert (spec.disaggregation.prefill_replicas, spec.disaggregation.decode_replicas) == (2, 2)
    assert spec.disaggregation.decode_tensor_parallel_size == 2
    assert [gpus(p.config) for p in points] == [1 + 4, 2 + 4]  # each pool's replicas x its TP


def test_whole_blocks_sweep_against_co_located_points():
    exp = experiment(sweep={"zip": {"disaggregation": [None, PD], "cluster.replicas": [3, 1]}})
    points = expand(exp)
    # a P/D point does not use cluster.replicas: its 1 is left out of the label, any other value shows
    assert [p.label for p in points] == ["co-located replicas=3", "1P2D"]
    both = expand(experiment(sweep={"grid": {"disaggregation": [PD], "cluster.replicas": [1, 2]}}))
    assert [p.label for p in both] == ["1P2D", "1P2D replicas=2"]
    assert build_spec(run_config(points[0].config, 0)).disaggregation is None
    assert [gpus(p.config) for p in points] == [3, 3]


def test_a_pool_setting_is_a_block_key_and_a_sweep_key():
    exp = experiment(disaggregation={**PD, "prefill_pipeline_parallel_size": 2},
                     sweep={"grid": {"disaggregation.decode_max_num_seqs": [1, 64]}})
    points = expand(exp)
    assert [p.label for p in points] == ["decode_max_num_seqs=1", "decode_max_num_seqs=64"]
    spec = build_spec(run_config(points[0].config, 0))
    assert spec.disaggregation.pool("decode") == {"max_num_seqs": 1}
    assert spec.disaggregation.pool("prefill") == {"pipeline_parallel_size": 2}
    assert [gpus(p.config) for p in points] == [2 + 2, 2 + 2]  # the prefill pool's replica on 2 stages


@pytest.mark.parametrize(("doc", "expected"), [
    ({"disaggregation": {**PD, "prefill_replicas": 0}}, "disaggregation.prefill_replicas: 0; allowed: an integer"),
    ({"disaggregation": {"prefill_replicas": 1}}, "disaggregation.decode_replicas: missing"),
    ({"disaggregation": {**PD, "kv_link_bandwidth": 0}}, "disaggregation.kv_link_bandwidth: 0; allowed: a finite"),
    ({"disaggregation": {**PD, "kv_link": "pcie"}}, "disaggregation.kv_link: 'pcie'; allowed: rdma, nvlink"),
    ({"disaggregation": {**PD, "prefil_replicas": 1}}, "disaggregation.prefil_replicas: unknown key; did you mean"),
    ({"disaggregation": {**PD, "decode_max_num_seqs": 0}}, "disaggregation.decode_max_num_seqs: 0; allowed: an int"),
    ({"disaggregation": {**PD, "decode_block_size": 32}}, "disaggregation.decode_block_size: the transfer moves "
                                                           "whole blocks"),
    ({"disaggregation": PD, "sweep": {"grid": {"disaggregation.prefill_max_num_batched_tokens": [512, -1]}}},
     "sweep.grid.disaggregation.prefill_max_num_batched_tokens[1]: -1; allowed: an integer >= 1"),
    ({"disaggregation": {**PD, "prefill_tensor_parallel_size": 2, "decode_tensor_parallel_size": 1}},
     "disaggregation.decode_tensor_parallel_size: 1 with a prefill TP of 2 (point base)"),
    ({"disaggregation": {**PD, "prefill_tensor_parallel_size": 2},
      "sweep": {"grid": {"disaggregation.decode_tensor_parallel_size": [2, 3]}}},
     "sweep.grid.disaggregation.decode_tensor_parallel_size: 3 with a prefill TP of 2"),
    ({"sweep": {"zip": {"disaggregation": [None, {"decode_replicas": 0, "prefill_replicas": 1}]}}},
     "sweep.zip.disaggregation[1].decode_replicas: 0; allowed"),
    ({"sweep": {"grid": {"disaggregation.decode_replicas": [1, 2]}}},
     "sweep.grid.disaggregation.decode_replicas: varies an option of the disaggregation block, which this"),
    ({"disaggregation": PD, "workload": {**WORKLOAD, "concurrency": 4}},
     "disaggregation: a disaggregated point runs in mode sustained or burst"),
    ({"disaggregation": PD, "slo": {"p99_ttft_ms": 500}, "search": {"target": "min_replicas", "low": 1, "high": 4},
      "sweep": {"grid": {"disaggregation.decode_replicas": [1, 2]}}},
     "search.target: min_replicas varies disaggregation.decode_replicas on a disaggregated point, which the sweep "
     "also sets (sweep.grid.disaggregation.decode_replicas)"),
])
def test_bad_blocks_name_the_key_path(doc, expected):
    if doc.get("workload", {}).get("concurrency"):
        doc["workload"] = {**doc["workload"], "mode": "concurrency"}
    with pytest.raises(SchemaError) as info:
        experiment(**doc)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_the_cli_refuses_a_bad_block_in_one_line(tmp_path, capsys):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({**BASE, "disaggregation": {**PD, "decode_replicas": 0}}))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "disaggregation.decode_replicas: 0; allowed: an integer" in err


def test_a_pd_sweep_and_a_rate_search_run(tmp_path, capsys):
    probe = {"duration_s": 20, "min_requests": 40}
    sweep = {"zip": {"disaggregation": [None, PD], "cluster.replicas": [3, 1]}}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**BASE, "workload": {**WORKLOAD, "rate": 3}, "probe": probe, "sweep": sweep,
                                    "slo": {"p99_ttft_ms": 2000}, "outputs": {"plots": False, "report": False}}))
    assert main(["run", str(path), "--out", str(tmp_path / "sweep")]) == 0
    printed = " ".join(capsys.readouterr().out.split())  # (the answer wraps at its width)
    assert "P/D vs co-located (goodput; the best of each per GPU): 1P2D (3 GPUs, $" in printed
    assert "vs replicas=3 co-located (3 GPUs, $" in printed and "x per $." in printed
    runs = pd.read_parquet(tmp_path / "sweep" / "runs.parquet").set_index("point")
    assert runs.loc[1, "disaggregation.decode_replicas"] == 2 and pd.isna(runs.loc[0, "disaggregation.kv_link"])
    assert list(runs["gpus"]) == [3, 3] and list(runs["billed_gpus"]) == [3, 3]
    assert (runs["verdict"] == "stable").all() and (runs["measured_requests"] >= 40).all()

    # a rate search on the P/D point alone: it brackets a rate, and its runs carry the TTFT's parts
    path.write_text(yaml.safe_dump({**BASE, "disaggregation": PD, "probe": {"duration_s": 8, "min_requests": 20},
                                    "seeds": [0],
                                    "search": {"target": "max_rate", "low": 2, "high": 16, "tolerance": 0.5,
                                               "model_range": "none"},
                                    "slo": {"p99_ttft_ms": 100, "p90_tpot_ms": 30},
                                    "outputs": {"plots": False, "report": False}}))
    assert main(["run", str(path), "--out", str(tmp_path / "search"), "--json"]) == 0
    capsys.readouterr()
    points = pd.read_parquet(tmp_path / "search" / "points.parquet")
    answer = float(points["answer"].iloc[0])
    assert 2 <= answer < 16 and points["gpus"].iloc[0] == 3 and points["search_outcome"].iloc[0] == "found"
    # what search.rank_by ranks by: the answer per GPU and per $ (one size of point: the rate itself)
    assert points["answer_per_gpu"].iloc[0] == pytest.approx(answer / 3)
    assert points["answer_per_usd"].iloc[0] == pytest.approx(answer * 3600 / points["cost_per_hour"].iloc[0])
    assert undocumented(points.columns, POINT_COLUMNS, (MIN_COST_SEARCH, "a sweep", "a min_replicas search"))[0] == []
    assert json.loads((tmp_path / "search" / "result.json").read_text())["recommendation"]["rank_by"] == "rate"
    docs = [json.loads(p.read_text()) for p in (tmp_path / "search" / "runs").glob("*/summary.json")]
    assert all(d["info"]["disaggregation"]["decode_replicas"] == 2 for d in docs)
    assert all(d["summary"]["mean_transfer_ms"] > 0 for d in docs if d["summary"]["mean_transfer_ms"] is not None)


def test_a_replica_search_of_pd_points_counts_decode_replicas_and_ranks_by_all_their_gpus(tmp_path, capsys):
    """min_replicas on P/D points varies the decode pool (the prefill pool as each point sets it): 1P1D misses the
    TPOT bound (~10.4 ms at 150 req/s), 2 decode replicas meet it, and 1P2D (3 GPUs) beats 2P2D (4 GPUs)."""
    short = {"prompt": {"dist": "lognormal", "median": 100, "sigma": 0.3, "max": 400},
             "output": {"dist": "lognormal", "median": 100, "sigma": 0.3, "max": 300}}
    path = tmp_path / "pd_replicas.yaml"
    path.write_text(yaml.safe_dump({
        **BASE, "workload": {"synthetic": {**WORKLOAD["synthetic"], "lengths": short}, "rate": 150},
        "probe": {"duration_s": 20, "min_requests": 40}, "disaggregation": {**PD, "decode_replicas": 1},
        "sweep": {"grid": {"disaggregation.prefill_replicas": [1, 2]}}, "seeds": [0],
        "search": {"target": "min_replicas", "low": 1, "high": 4, "model_range": "none"},
        "slo": {"p90_tpot_ms": 9.5}, "outputs": {"plots": False, "report": False}}))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "Recommended (*): prefill_replicas=1, 2 decode replicas" in printed
    points = pd.read_parquet(tmp_path / "out" / "points.parquet").set_index("label")
    assert list(points["answer"]) == [2, 2] and list(points["fixed_gpus"]) == [1, 2]
    assert list(points["gpus"]) == [3, 4] and list(points["gpus_per_replica"]) == [1, 1]
    assert points["cost_per_hour"].iloc[1] == pytest.approx(points["cost_per_hour"].iloc[0] * 4 / 3)
    runs = pd.read_parquet(tmp_path / "out" / "runs.parquet")
    assert (runs["probe"] == runs["disaggregation.decode_replicas"]).all()  # the probed count is the decode pool's
    assert set(runs["gpus"] - runs["disaggregation.decode_replicas"]) == {1, 2}
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "the fewest decode replicas meeting the SLOs: 2 (model range not searched (search.model_range: none); " \
           "1 seed) = 3 GPUs (1 in the prefill pool + 2 decode replicas x 1 GPU each: TP x PP)" in summary


def test_a_cost_search_of_pd_shapes_pays_each_pool_at_its_gpus_price(tmp_path, capsys):
    """min_cost on P/D shapes: the prefill pool is paid as set, the decode replicas searched, each pool at its own
    GPU's price - in the answer, the lower bound and the cost bound's reason."""
    from kvplan.sim.specs.prices import price_table

    short = {"prompt": {"dist": "lognormal", "median": 100, "sigma": 0.3, "max": 400},
             "output": {"dist": "lognormal", "median": 100, "sigma": 0.3, "max": 300}}
    cheap = {**PD, "decode_replicas": 1, "decode_hardware": "a100-80gb"}
    path = tmp_path / "pd_cost.yaml"
    path.write_text(yaml.safe_dump({
        **BASE, "workload": {"synthetic": {**WORKLOAD["synthetic"], "lengths": short}, "rate": 150},
        "probe": {"duration_s": 20, "min_requests": 40}, "seeds": [0],
        "sweep": {"zip": {"disaggregation": [{**PD, "decode_replicas": 1}, cheap]}},
        "search": {"target": "min_cost", "low": 1, "high": 4, "model_range": "none"},
        "slo": {"p90_tpot_ms": 12}, "outputs": {"plots": False, "report": False}}))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    h100, a100 = (price_table(None).gpu_hour(name) for name in ("h100-sxm", "a100-80gb"))
    points = pd.read_parquet(tmp_path / "out" / "points.parquet").set_index("point")
    winner = points.loc[0]
    assert winner["status"] == "winner" and winner["fixed_gpus"] == 1 and winner["gpus"] == 1 + winner["answer"]
    assert winner["shape_cost_per_hour"] == pytest.approx(h100 + winner["answer"] * h100)
    assert points.loc[1, "lower_bound_per_hour"] == pytest.approx(h100 + points.loc[1, "lower_bound_replicas"] * a100)
    assert f"1 prefill GPUs + {winner['answer']:g} decode replicas x 1 GPUs" in printed
    if points.loc[1, "status"] == "cost bound":  # the A100 decode pool: TPOT 12 ms needs more than the ceiling
        assert f"at least the prefill pool's ${h100:.4g}/h + " in points.loc[1, "status_reason"]
    assert "P/D vs co-located" not in printed  # (no co-located point: no comparison)
