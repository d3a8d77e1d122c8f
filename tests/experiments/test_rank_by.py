"""`search.rank_by` (experiments.rank_by): a rate search over points of different sizes ranks per GPU by default,
per $ when asked, the seed intervals scaled by the same divisor (so ties follow it), the answer says what it
ranks by, and bad input is one line naming the key."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from kvplan.errors import ConfigError
from kvplan.experiments.answer import render
from kvplan.experiments.pd_block import comparison, comparison_line
from kvplan.experiments.rank_by import ranked_columns
from kvplan.experiments.ranking import recommend
from kvplan.experiments.schema import parse_experiment

WORKLOAD = {"synthetic": {"seed": 4, "requests": 50, "arrivals": {"process": "poisson", "rate": 4},
                          "lengths": {"prompt": {"dist": "lognormal", "median": 300, "sigma": 0.5, "max": 2000},
                                      "output": {"dist": "lognormal", "median": 40, "sigma": 0.5, "max": 200}}}}
PD = {"prefill_replicas": 1, "decode_replicas": 2}
SEARCH = {"target": "max_rate", "low": 1, "high": 64, "model_range": "none"}


def experiment(sweep: dict | None = None, **search) -> object:
    doc = {"name": "t", "model": "llama-3-8b", "hardware": "h100-sxm", "engine": {"entry_point": "llm"},
           "workload": WORKLOAD, "slo": {"p99_ttft_ms": 500}, "search": {**SEARCH, **search}, "seeds": [0, 1],
           "sweep": sweep or {"zip": {"disaggregation": [None, PD], "cluster.replicas": [1, 1]}}}
    return parse_experiment(doc, Path("t.yaml"))


def points(rows: list[tuple[str, float, float, float, float, float]]) -> pd.DataFrame:
    """Points as results.points_frame writes them: (label, answer, low, high, GPUs, $/h) per point."""
    out = []
    for i, (label, answer, low, high, gpus, hour) in enumerate(rows):
        row = {"point": i, "label": label, "answer": answer, "answer_low": low, "answer_high": high, "gpus": gpus,
               "cost_per_hour": hour, "p90_e2el_ms": 100.0, "capacity_rps": answer, "capacity_tok_s": 1000.0,
               "answers": f"{low}, {high}", "capacity_model_lo": math.nan, "capacity_model_hi": math.nan,
               "disaggregation": "co-located" if gpus == 1 else "1P2D", "goodput_per_gpu": answer / gpus,
               "goodput_per_usd": math.nan, "cluster.replicas": 1, "goodput_basis": "slo",
               "usd_per_m_input_tokens": 0.1, "usd_per_m_output_tokens": 1.0, "cost_note": ""}
        out.append(row | ranked_columns(row))
    return pd.DataFrame(out)


def test_points_of_different_sizes_rank_per_gpu_by_default():
    exp = experiment()
    assert exp.search["rank_by"] == "per_gpu"  # 1 GPU against 3
    assert experiment({"grid": {"engine.block_size": [16, 32]}}).search["rank_by"] == "rate"  # one size
    # 1P2D serves more req/s (4.5 on 3 GPUs) but less per GPU (1.5) than one co-located replica (2.0)
    frame = points([("co", 2.0, 1.95, 2.05, 1, 3.0), ("pd", 4.5, 4.4, 4.6, 3, 9.0)])
    rec = recommend(exp, frame)
    assert rec.label == "co" and "req/s per GPU (2; search.rank_by: per_gpu)" in rec.why
    assert "clear of the next best, pd (1.467-1.533 req/s per GPU)" in rec.why
    assert recommend(experiment(rank_by="rate"), frame).label == "pd"  # the raw rate says otherwise
    text = render(exp, frame.assign(binding_limit="none", binding_key="", binding_votes=1, binding_of=1), rec)
    assert "max_rate (req/s) ranked in req/s per GPU (search.rank_by: per_gpu)" in text
    assert "Recommended (*): co-located replicas=1, 2 req/s = 2 req/s per GPU (seeds 1.95-2.05 " \
           "req/s per GPU)" in " ".join(text.split())


def test_ties_follow_the_intervals_in_the_ranked_unit():
    # over the seeds 1.8-2.2 req/s on 1 GPU against 4.2-6.3 on 3 (1.4-2.1 per GPU): apart as rates, tied per GPU
    frame = points([("co", 2.0, 1.8, 2.2, 1, 3.0), ("pd", 5.0, 4.2, 6.3, 3, 9.0)])
    assert recommend(experiment(), frame).tie_labels == ["co", "pd"]
    assert recommend(experiment(rank_by="rate"), frame).label == "pd"


def test_per_usd_ranks_by_requests_per_dollar():
    # the P/D point is cheaper per GPU here ($2/h a GPU against $4.5): per GPU it loses, per $ it wins
    frame = points([("co", 2.0, 1.95, 2.05, 1, 4.5), ("pd", 4.5, 4.4, 4.6, 3, 6.0)])
    exp = experiment(rank_by="per_usd")
    rec = recommend(exp, frame)
    assert rec.label == "pd" and "req/$" in rec.why
    assert frame["answer_per_usd"][1] == pytest.approx(4.5 * 3600 / 6.0)
    doc = comparison(exp, frame)
    assert doc["by"] == "per_usd" and doc["disaggregated"]["label"] == "pd" and doc["co_located"]["label"] == "co"
    assert doc["ratio_per_gpu"] == pytest.approx(1.5 / 2.0)
    assert doc["ratio_per_usd"] == pytest.approx((4.5 / 6.0) / (2.0 / 4.5))
    line = comparison_line(exp, frame)
    assert line.startswith("P/D vs co-located (at the searched rate; the best of each per $): pd "
                           "(3 GPUs, $6/h) 1.5 req/s per GPU, 2700 req/$ vs co (1 GPUs, $4.5/h) 2, 1600")
    assert "0.75x per GPU, 1.69x per $" in line


def test_the_same_gpus_co_located_point_is_named_where_it_is_not_the_best():
    frame = points([("co1", 2.0, 1.95, 2.05, 1, 3.0), ("co3", 4.0, 3.9, 4.1, 3, 9.0), ("pd", 4.5, 4.4, 4.6, 3, 9.0)])
    frame.loc[2, "disaggregation"] = "1P2D"
    frame.loc[1, "disaggregation"] = "co-located"
    exp = experiment({"zip": {"disaggregation": [None, None, PD], "cluster.replicas": [1, 3, 1]}})
    doc = comparison(exp, frame)
    assert doc["co_located"]["label"] == "co1" and doc["same_gpus"]["label"] == "co3"
    assert "; co-located on the same GPUs: co3 (3 GPUs, $9/h) 1.333, 1600." in comparison_line(exp, frame)


@pytest.mark.parametrize(("search", "hardware", "expected"), [
    ({"target": "max_concurrency", "low": 1, "high": 8, "rank_by": "per_gpu"}, None,
     "search.rank_by: ranks a rate's answers, and search.target is max_concurrency; allowed: remove it"),
    ({**SEARCH, "rank_by": "per_watt"}, None, "search.rank_by: unknown value 'per_watt'"),
    ({**SEARCH, "rank_by": "per_usd"}, "cpu-local",  # (the shipped profile's CPU: no price)
     "search.rank_by: per_usd, and point base runs on cpu-local, which the prices lack; allowed: prices:"),
])
def test_bad_rank_by_is_one_line(search, hardware, expected):
    doc = {"name": "t", "model": "llama-3-8b", "hardware": hardware or "h100-sxm",
           "engine": {"entry_point": "llm"}, "workload": WORKLOAD, "slo": {"p99_ttft_ms": 500}, "search": search}
    if search["target"] == "max_concurrency":
        doc["workload"] = {**WORKLOAD, "mode": "concurrency"}
    with pytest.raises(ConfigError) as info:
        parse_experiment(doc, Path("t.yaml"))
    assert expected in str(info.value) and "\n" not in str(info.value)
