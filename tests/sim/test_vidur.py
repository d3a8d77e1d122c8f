"""The analytic per-op times against Vidur's A100 profiles: the table in docs/parallel_validation.md is what the
project's copy of the rows gives (tests/sim/data/vidur_*.csv, from github.com/microsoft/vidur, MIT: see
tests/sim/data/VIDUR_SOURCE.txt), and the decode-sized GEMMs and the one-node all-reduce stay close."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kvplan.sim.cost.vidur import collective_predictions, compute_predictions, error_table, markdown

DATA = Path(__file__).parent / "data"
DOC = Path(__file__).resolve().parents[2] / "docs" / "parallel_validation.md"


def _tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    compute = compute_predictions(pd.read_csv(DATA / "vidur_mlp.csv"))
    network = collective_predictions(pd.read_csv(DATA / "vidur_network.csv"))
    return compute, network


def test_the_docs_table_is_recomputed_from_the_rows():
    compute, network = _tables()
    text = markdown(error_table(compute), "TP degree") + "\n\n" + markdown(error_table(network), "GPUs")
    doc = DOC.read_text()
    start = doc.index("<!-- vidur-table")
    body = doc[doc.index("\n", start) + 1:doc.index("<!-- /vidur-table -->")].strip()
    assert body == text


def test_decode_gemms_and_one_node_all_reduces_are_close():
    compute, network = _tables()
    gemm = compute[compute["op"].isin(["attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj"])]
    decode = gemm[(gemm["tokens"] <= 64) & (gemm["degree"] <= 4)]
    error = ((decode["analytic_ms"] - decode["measured_ms"]).abs() / decode["measured_ms"]).median()
    assert error < 0.10
    reduce = network[network["family"] == "all-reduce"]
    assert ((reduce["analytic_ms"] - reduce["measured_ms"]).abs() / reduce["measured_ms"]).median() < 0.10
