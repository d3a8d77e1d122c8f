"""The per-op GPU model against Vidur-format profiles: the profile reader and its refusals, the laws against their
definitions, the measured table, `kvplan bench fidelity` on the project's fixture rows (copied from
github.com/microsoft/vidur, MIT: tests/sim/data/vidur_profiles/LICENSE), and the docs table it generates."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvplan.cli import main
from kvplan.errors import UserError
from kvplan.sim.cost.analytic import AnalyticCost
from kvplan.sim.cost.features import FEATURE_NAMES, StepFeatures, decode_stretch_features
from kvplan.sim.gpu.fit import predict
from kvplan.sim.gpu.laws import GpuLaws, shipped_laws
from kvplan.sim.gpu.profiles import read_profiles
from kvplan.sim.gpu.table import MeasuredTable
from kvplan.sim.gpu.validation import markdown, step_band
from kvplan.sim.specs.hardware import HardwareSpec, get_hardware
from kvplan.sim.specs.models import get_model

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "data" / "vidur_profiles"
MLP = "compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv"
DOC = ROOT / "docs" / "gpu_fidelity.md"


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`kvplan` in this process (its exit code, stdout, stderr): `main` returns what the command would exit with and
    prints what it would print, so a process start (1-2 s each) buys nothing here."""
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_reader_gives_one_tidy_row_per_op_and_bytes_for_collectives():
    rows = read_profiles(FIXTURE)
    assert set(rows["family"]) == {"gemm", "elementwise", "allreduce", "send_recv"}
    mlp = pd.read_csv(FIXTURE / MLP)
    a100 = rows[rows["source"] == "meta-llama/Meta-Llama-3-8B"]
    assert len(a100) == len(mlp) * 10  # ten ops timed per row
    first = a100[(a100["op"] == "attn_pre_proj") & (a100["line"] == 2)].iloc[0]
    assert (first["tokens"], first["tp"], first["hidden"]) == (mlp["num_tokens"][0],
                                                              mlp["num_tensor_parallel_workers"][0], 4096)
    assert first["measured_ms"] == mlp["time_stats.attn_pre_proj.median"][0]
    reduce = rows[rows["op"] == "all_reduce"]
    raw = pd.read_csv(FIXTURE / "network/a100_dgx/all_reduce.csv")
    assert sorted(reduce["message_bytes"].unique()) == sorted(raw["size"].unique())  # Vidur's size is bytes
    assert set(rows["gpu"]) == {"a100", "a40"}


def _broken(tmp_path: Path, edit) -> Path:
    root = tmp_path / "profiles"
    shutil.copytree(FIXTURE, root)
    frame = pd.read_csv(root / MLP)
    edit(frame)
    frame.to_csv(root / MLP, index=False)
    return root


@pytest.mark.parametrize("edit,match", [
    (lambda f: f.pop("num_tokens"), r"mlp\.csv: line 1: missing column 'num_tokens'"),
    (lambda f: f.insert(0, "time_stats.softmax.median", f.pop("time_stats.add.median")),
     r"mlp\.csv: line 1: column 'time_stats\.softmax\.median': unknown op 'softmax'"),
    (lambda f: f.loc.__setitem__((2, "time_stats.mlp_act.median"), 0.0),
     r"mlp\.csv: line 4: column 'time_stats\.mlp_act\.median': 0\.0 is not a number > 0"),
    (lambda f: f.loc.__setitem__((0, "time_stats.add.median"), float("nan")),
     r"mlp\.csv: line 2: column 'time_stats\.add\.median': nan is not a number > 0"),
    (lambda f: f.loc.__setitem__((5, "num_tokens"), -3), r"mlp\.csv: line 7: column 'num_tokens'"),
])
def test_bad_profiles_name_the_file_line_and_column(tmp_path, edit, match):
    with pytest.raises(UserError, match=match):
        read_profiles(_broken(tmp_path, edit))


def test_the_cli_refuses_bad_input_in_one_line_with_exit_2(tmp_path, capsys):
    root = _broken(tmp_path, lambda f: f.pop("n_embd"))
    code, _, err = _cli(capsys, "bench", "fidelity", "--profiles", str(root), "--hardware", "a100-80gb")
    assert code == 2 and "missing column 'n_embd'" in err and "Traceback" not in err
    code, _, err = _cli(capsys, "bench", "fidelity", "--profiles", str(FIXTURE), "--hardware", "tpu-v5")
    assert code == 2
    assert "allowed: a100-40gb, a100-80gb, a10g, a40, b200, h100-sxm, h200" in err


def test_bench_fidelity_json_and_the_docs_table(capsys):
    code, out, err = _cli(capsys, "bench", "fidelity", "--profiles", str(FIXTURE), "--hardware", "a100-80gb", "--json")
    assert code == 0, err
    result = json.loads(out)
    families = result["families"]
    assert [f["family"] for f in families] == ["gemm", "elementwise", "allreduce", "send_recv"]
    for f in families:
        assert {"family", "rows", "median_abs_err_pct", "p90_abs_err_pct", "bias_pct"} <= set(f)
        assert 0 <= f["median_abs_err_pct"] <= f["p90_abs_err_pct"]
    rows = read_profiles(FIXTURE)
    a100 = rows[rows["gpu"] == "a100"]
    assert families[0]["rows"] == int((a100["family"] == "gemm").sum())  # only the A100's rows, all of them
    # the docs print exactly this table
    doc = DOC.read_text()
    start = doc.index("<!-- fidelity-table")
    body = doc[doc.index("\n", start) + 1:doc.index("<!-- /fidelity-table -->")].strip()
    assert body == markdown(families)


def test_gemm_law_is_its_definition():
    hw = get_hardware("a100-80gb")
    law = GpuLaws(gemm_compute_efficiency=0.7, gemm_memory_efficiency=0.8, gemm_floor_s=5e-6, gemm_tile_m=128,
                  gemm_tile_n=128, gemm_waves=True)
    k, n = 4096, 1536  # 12 column tiles
    # 300 rows: 3 row tiles x 12 = 36 tiles, one wave over 108 SMs: 108 tiles of 128 x 128 are paid for
    flops = 2 * k * 108 * 128 * 128
    moved = (k * n + 300 * (k + n)) * 2
    expected = 5e-6 + max(flops / (312e12 * 0.7), moved / (2.039e12 * 0.8))
    assert law.gemm_time(300, k, n, hw) == pytest.approx(expected, rel=1e-12)
    # one row in one wave still pays a whole wave (what makes wave quantization lose on held-out rows); without
    # waves and with 64-row tiles, one row is memory bound: the weight read once
    assert law.gemm_time(1, k, n, hw) == pytest.approx(5e-6 + flops / (312e12 * 0.7), rel=1e-12)
    rows64 = replace(law, gemm_waves=False, gemm_tile_m=64)
    assert rows64.gemm_time(1, k, n, hw) == pytest.approx(5e-6 + (k * n + k + n) * 2 / (2.039e12 * 0.8), rel=1e-12)
    assert np.array_equal(law.gemm_time(np.array([1, 300]), k, n, hw),
                          [law.gemm_time(1, k, n, hw), law.gemm_time(300, k, n, hw)])


def test_elementwise_law_is_its_definition():
    a40 = get_hardware("a40")  # 84 SMs, 1740 MHz, 696 GB/s
    law = GpuLaws(elementwise_bandwidth_efficiency=0.8, elementwise_power=2.0,
                  elementwise_floor_cycles={"input_layernorm": 3480.0, "emb": 1740.0, "add": 870.0},
                  elementwise_cycle_rate={"input_layernorm": 4.0, "emb": 200.0}, elementwise_whole_gpu=("emb",))
    memory = 1 / (0.8 * 696e9)
    norm_cores = 1 / (84 * 1.74e9 * 4.0)  # bytes per cycle per SM
    assert law.elementwise_time("input_layernorm", 1e6, a40) == pytest.approx(
        2e-6 + 1e6 * (memory**2 + norm_cores**2) ** 0.5, rel=1e-12)
    emb_cores = 1 / (1.74e9 * 200.0)  # a whole-GPU rate: not multiplied by the SM count
    assert law.elementwise_time("emb", 1e6, a40) == pytest.approx(1e-6 + 1e6 * (memory**2 + emb_cores**2) ** 0.5,
                                                                  rel=1e-12)
    # no core rate: bandwidth alone; the same floor in cycles is shorter at a higher clock
    assert law.elementwise_time("add", 1e6, a40) == pytest.approx(0.5e-6 + 1e6 * memory, rel=1e-12)
    assert law.elementwise_floor("add", get_hardware("l40s")) == pytest.approx(870 / 2.52e9, rel=1e-12)
    # p = 1: the two limits' times add
    summed = replace(law, elementwise_power=1.0)
    assert summed.elementwise_rate("input_layernorm", a40) == pytest.approx(memory + norm_cores, rel=1e-12)
    # per resident warp: W = 84 SMs × 1536 threads / 32 = 4032 warps on the A40 (2048 threads: 6912 on the A100)
    warps = replace(law, elementwise_per_warp=True)
    assert warps.elementwise_rate("input_layernorm", a40) == pytest.approx(
        (memory**2 + (1 / (4032 * 1.74e9 * 4.0))**2) ** 0.5, rel=1e-12)
    assert warps.elementwise_rate("emb", a40) == law.elementwise_rate("emb", a40)  # whole-GPU rates keep W = 1
    # threads per SM not known: the per-warp core limit is unknown, bandwidth alone
    assert warps.elementwise_rate("input_layernorm", replace(a40, threads_per_sm=0)) == memory
    # a GPU with neither clock nor SM count: no floor, bandwidth alone
    bare = HardwareSpec("bare", 1e14, 1e12, 24e9, 25e9)
    assert law.elementwise_time("input_layernorm", 1e6, bare) == pytest.approx(1e6 / (0.8 * 1e12), rel=1e-12)
    tokens = np.array([1, 300])
    assert np.array_equal(law.elementwise_time("input_layernorm", tokens * 4096, a40),
                          [law.elementwise_time("input_layernorm", 4096, a40),
                           law.elementwise_time("input_layernorm", 300 * 4096, a40)])


def test_collective_laws_are_their_definitions():
    law = GpuLaws(allreduce_latency_s=20e-6, allreduce_hop_latency_s=1e-6, allreduce_efficiency=0.5,
                  p2p_latency_s=10e-6, p2p_efficiency=0.9, network_latency_s=30e-6, network_efficiency=0.3)
    a100, h100 = get_hardware("a100-80gb"), get_hardware("h100-sxm")
    assert law.allreduce_time(1e6, 8, a100) == pytest.approx(27e-6 + 1.75e6 / (0.5 * 300e9))  # ring
    assert law.allreduce_time(1e6, 8, h100) == pytest.approx(27e-6 + 1e6 / (0.5 * 450e9))  # NVLS: each byte once
    assert law.allreduce_time(1e6, 1, h100) == 0.0
    assert law.send_recv_time(1e6, a100, False) == pytest.approx(10e-6 + 1e6 / (0.9 * 300e9))
    assert law.send_recv_time(1e6, a100, True) == pytest.approx(30e-6 + 1e6 / (0.3 * 25e9))


def test_shipped_laws_are_fitted_fractions_and_price_the_fixture_close():
    law = shipped_laws()
    for value in (law.gemm_compute_efficiency, law.gemm_memory_efficiency, law.elementwise_bandwidth_efficiency,
                  law.allreduce_efficiency, law.p2p_efficiency, law.network_efficiency):
        assert 0 < value <= 1
    rows = read_profiles(FIXTURE)
    a100 = rows[(rows["gpu"] == "a100") & (rows["family"] == "gemm")]
    err = predict(a100, law, get_hardware("a100-80gb")) / a100["measured_ms"].to_numpy() - 1
    assert np.median(np.abs(err)) < 0.15


def test_measured_table_interpolates_its_rows_and_extrapolates_with_the_law():
    rows = read_profiles(FIXTURE)
    a100 = rows[rows["gpu"] == "a100"]
    hw = get_hardware("a100-80gb")
    table = MeasuredTable.from_rows(a100, hw, shipped_laws())
    series = a100[(a100["op"] == "mlp_up_proj") & (a100["tp"] == 1)].sort_values("tokens")
    # at a profiled point: the measurement (monotone: a running maximum)
    assert table.predict(series) == pytest.approx(np.maximum.accumulate(series["measured_ms"].to_numpy()))
    # between two points: linear in log-log
    lo, hi = series.iloc[2], series.iloc[3]
    mid = series.iloc[[2]].assign(tokens=int(np.sqrt(lo["tokens"] * hi["tokens"])))
    t = np.log(mid["tokens"].iloc[0] / lo["tokens"]) / np.log(hi["tokens"] / lo["tokens"])
    expected = np.exp((1 - t) * np.log(lo["measured_ms"]) + t * np.log(hi["measured_ms"]))
    assert table.predict(mid)[0] == pytest.approx(expected)
    # past the last point: the law's growth from the last measurement
    end = series.iloc[[-1]]
    far = end.assign(tokens=int(end["tokens"].iloc[0]) * 2)
    law = predict(far, shipped_laws(), hw)[0] / predict(end, shipped_laws(), hw)[0]
    assert table.predict(far)[0] == pytest.approx(end["measured_ms"].iloc[0] * law)
    assert step_band([{"p10_signed_err_pct": -5.0, "p90_signed_err_pct": 10.0, "measured_ms": 1.0}]) == [-5.0, 10.0]


def test_a_profiled_gpu_prices_steps_from_its_table_bit_identically_for_stretches():
    rows = read_profiles(FIXTURE)
    hw = get_hardware("a100-80gb")
    table = MeasuredTable.from_rows(rows[rows["gpu"] == "a100"], hw, shipped_laws())
    model = get_model("llama-3-8b")
    measured = AnalyticCost(model, hw, 16, table=table)
    analytic = AnalyticCost(model, hw, 16)
    assert len(measured._table_gemms) == 4 and len(analytic._table_gemms) == 0
    stretch = decode_stretch_features(np.full(80, 700), np.full(80, 6), 6, 16)
    times = measured.step_times(stretch)
    assert not np.array_equal(times, analytic.step_times(stretch))
    for j in range(6):
        single = StepFeatures(*(int(np.broadcast_to(getattr(stretch, name), 6)[j]) for name in FEATURE_NAMES))
        assert measured.step_times(single) == times[j]  # bit-identical


def test_the_gpu_profile_setting_prices_with_the_table_and_refuses_a_missing_directory(tmp_path):
    from kvplan.sim.run import analytic_cost
    from kvplan.sim.spec import SimSpec

    cost, _ = analytic_cost(SimSpec(model="llama-3-8b", hardware="a100-80gb", gpu_profile=str(FIXTURE)))
    assert cost.table is not None and len(cost._table_gemms) == 4
    with pytest.raises(UserError, match="not a directory"):
        analytic_cost(SimSpec(model="llama-3-8b", hardware="a100-80gb", gpu_profile=str(tmp_path / "none")))
    with pytest.raises(UserError, match="holds profiles of a100, a40, none of them for h100-sxm"):
        analytic_cost(SimSpec(model="llama-3-8b", hardware="h100-sxm", gpu_profile=str(FIXTURE)))


def test_an_attention_profile_is_read_and_priced_by_the_attention_cost(tmp_path):
    # two made-up rows in Vidur's attention.csv layout (not measurements): a prefill and a decode
    folder = tmp_path / "compute" / "a100" / "org" / "model"
    folder.mkdir(parents=True)
    (folder / "attention.csv").write_text(
        "n_embd,n_q_head,n_kv_head,block_size,num_tensor_parallel_workers,max_model_len,batch_size,"
        "prefill_chunk_size,kv_cache_size,is_prefill,time_stats.attn_prefill.median,time_stats.attn_decode.median\n"
        "4096,32,8,16,1,4096,1,512,0,True,0.2,\n"
        "4096,32,8,16,1,4096,32,0,1024,False,,0.15\n")
    rows = read_profiles(tmp_path)
    assert list(rows["op"]) == ["attn_decode", "attn_prefill"] or list(rows["op"]) == ["attn_prefill", "attn_decode"]
    from kvplan.bench.fidelity import run

    result = run(tmp_path, "a100-80gb")
    assert [f["family"] for f in result["families"]] == ["attention"] and result["families"][0]["rows"] == 2
    bad = folder / "attention.csv"
    bad.write_text(bad.read_text().replace(",0.15", ",-1"))
    with pytest.raises(UserError, match=r"attention\.csv: line 3: column 'time_stats\.attn_decode\.median'"):
        read_profiles(tmp_path)
