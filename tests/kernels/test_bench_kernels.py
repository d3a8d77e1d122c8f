"""`kvplan bench kernels`: its data setup, its report, and its CPU behaviour. Nothing here checks speed."""

from __future__ import annotations

import csv
import io
import json

import pytest
import torch

from kvplan.bench.hbm import peak_gbps
from kvplan.bench.kernels import TARGET, Grid, check_target, run, to_csv
from kvplan.cli import main
from tests.kernels.kernel_cases import DEVICE

TINY = Grid(decode_batches=(2,), decode_contexts=(40,), prefill_batches=(2,), prefill_contexts=(24,),
            prefill_chunk=16, block_sizes=(8, 16), num_heads=4, num_kv_heads=2, head_dim=32,
            dtype=torch.float32, warmup=0, reps=1)


def test_tiny_grid_matches_sdpa_and_writes_csv() -> None:
    """The paged kernels read the same K/V as SDPA: their outputs agree, so the setup is right. On a CPU this
    runs through the interpreter; on a GPU it also exercises the CUDA-event timing."""
    result = run(torch.device(DEVICE), TINY, peak_override=100.0)
    rows = result["rows"]
    assert [(r["kind"], r["block_size"]) for r in rows] == [
        ("decode", 8), ("decode", 16), ("prefill", 8), ("prefill", 16)]
    assert all(r["max_abs_diff"] < 1e-4 for r in rows)
    assert all(r["gbps"] > 0 and r["frac_peak"] == pytest.approx(r["gbps"] / 100.0) for r in rows)
    assert rows[2]["chunk"] == 16 and result["peak_source"] == "--peak-gbps"
    assert result["target"]["measured"] is False
    parsed = list(csv.DictReader(io.StringIO(to_csv(result))))
    assert len(parsed) == 4 and parsed[0]["device"] == result["device"] and parsed[3]["kind"] == "prefill"
    assert {"batch", "context", "block_size", "kernel_ms", "sdpa_ms", "gbps", "frac_peak", "vs_sdpa"} <= set(
        parsed[0])


@pytest.mark.parametrize(("frac", "ratio", "ok"), [(0.8, 1.1, (True, True)), (0.5, 1.3, (False, False)),
                                                   (None, 1.0, (False, True))])
def test_target_verdict(frac: float | None, ratio: float, ok: tuple[bool, bool]) -> None:
    point = {"kind": "decode", "batch": TARGET["batch"], "context": TARGET["context"],
             "block_size": TARGET["block_size"], "frac_peak": frac, "vs_sdpa": ratio}
    verdict = check_target([{**point, "block_size": 8}, point])
    assert verdict["measured"] and (verdict["frac_peak_ok"], verdict["vs_sdpa_ok"]) == ok


@pytest.mark.parametrize(("name", "expected"), [
    ("NVIDIA H200", 4800.0), ("NVIDIA GH200 480GB", 4000.0), ("NVIDIA H100 80GB HBM3", 3350.0),
    ("NVIDIA H100 PCIe", 2000.0), ("NVIDIA A100-SXM4-80GB", 2039.0), ("NVIDIA L40S", 864.0),
    ("NVIDIA L4", 300.0), ("Some Future GPU", None),
])
def test_peak_table(name: str, expected: float | None) -> None:
    assert peak_gbps(name) == expected


def test_peak_override() -> None:
    assert peak_gbps("NVIDIA H200", 1000.0) == 1000.0
    with pytest.raises(ValueError, match="--peak-gbps"):
        peak_gbps("NVIDIA H200", 0.0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path only runs without a GPU")
def test_cli_without_gpu_says_so_and_exits_zero(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    assert main(["bench", "kernels", "--json", "--csv", str(tmp_path / "k.csv")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["skipped"] is True and "no CUDA GPU" in out["reason"]
    assert not (tmp_path / "k.csv").exists()
