"""The `vllm-bench` trace format (per-request timings of a vLLM offline bench run, LLMServingSim's
requests.jsonl layout) on a made-up fixture, its bad input, and the comparison code of
scripts/serving_replay.py (which scripts/serving_validation.py writes its page from) on the fixture's rows (never
on ../shared)."""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from kvplan import traces
from kvplan.cli import main
from kvplan.traces import TraceFormatError
from kvplan.traces.loaders.vllm_bench import read_timings

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).resolve().parent / "data" / "vllm_bench_requests.jsonl"


@functools.cache
def _script(name: str = "serving_replay"):
    """scripts/<name>.py as a module, loaded by path as the page's tests always have (registered first: its
    dataclasses resolve their annotations through sys.modules). A script already imported by a sibling (the
    page imports serving_replay) is that module, not a second copy."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _rows() -> list[dict]:
    return [json.loads(line) for line in FIXTURE.read_text().splitlines()]


def _write(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_detected_and_loaded_as_arrivals_and_token_counts():
    t = traces.load(FIXTURE)
    assert t.report.format == "vllm-bench"
    np.testing.assert_allclose(t.arrival_s, [0.0, 0.25, 1.0, 1.5])
    assert t.prompt_tokens.tolist() == [120, 40, 300, 64]
    assert t.output_tokens.tolist() == [11, 5, 1, 21]
    assert not t.has_prefix  # the prompts are unknown: nothing for a prefix cache to hit


def test_timings_are_engine_internal_latencies():
    m = read_timings(FIXTURE)
    assert m.request_id == ("bench-0", "bench-1", "bench-2", "bench-3")
    np.testing.assert_allclose(m.ttft_s, [0.1, 0.2, 0.48, 0.2], atol=1e-9)
    np.testing.assert_allclose(m.e2e_s, [0.6, 0.6, 0.48, 1.2], atol=1e-9)
    np.testing.assert_allclose(m.tpot_s[[0, 1, 3]], [0.05, 0.1, 0.05], atol=1e-9)
    assert math.isnan(m.tpot_s[2])  # one output token: no TPOT


@pytest.mark.parametrize(("change", "fragment"), [
    ({"first_token_ts": 500.0005}, ":1: first_token_ts 500.000500 is before scheduled_ts 500.001000; allowed: "
                                   "queued_ts <= scheduled_ts <= first_token_ts <= last_token_ts"),
    ({"last_token_ts": "soon"}, ":1: non-numeric last_token_ts 'soon'; allowed: a number"),
    ({"output_toks": 0}, ":1: output_toks 0 is out of range; allowed: an integer >= 1"),
    ({"queued_ts": None}, ":1: missing value for column 'queued_ts'"),
])
def test_bad_rows_name_file_line_and_field(tmp_path, change, fragment):
    rows = _rows()
    rows[0].update(change)
    path = _write(tmp_path, rows)
    with pytest.raises(TraceFormatError) as err:
        read_timings(path)
    assert str(err.value).startswith(f"{path}{fragment}"), err.value


def test_a_missing_stamp_column_is_one_line_from_the_cli(tmp_path, capsys):
    rows = [{k: v for k, v in r.items() if k != "scheduled_ts"} for r in _rows()]
    path = _write(tmp_path, rows)
    assert main(["trace", "stats", str(path), "--format", "vllm-bench"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{path}:1: missing column 'scheduled_ts'" in err


def test_per_run_table_from_fixture_rows():
    sv = _script()
    m = read_timings(FIXTURE)
    measured = sv.per_request_stats(m.ttft_s * 1e3, m.tpot_s * 1e3, m.e2e_s * 1e3)
    assert measured["ttft"]["mean"] == pytest.approx(245.0)
    assert measured["ttft"]["p50"] == pytest.approx(200.0)
    assert measured["tpot"]["mean"] == pytest.approx(200.0 / 3)  # the one-token request has no TPOT
    assert measured["e2e"]["mean"] == pytest.approx(720.0)
    assert measured["e2e"]["p99"] == pytest.approx(np.percentile([600, 600, 480, 1200], 99))
    # a simulator 10% slow on everything, and one exact
    slow = {k: {s: v * 1.1 for s, v in stats.items()} for k, stats in measured.items()}
    rows = sv.comparison_rows(measured, slow, measured)
    assert len(rows) == 12
    assert all(r["kvplan_err_pct"] == pytest.approx(10.0) for r in rows)
    assert all(r["llmservingsim_err_pct"] == pytest.approx(0.0) for r in rows)
    assert sv.median_abs_mean_error({"a": rows}) == pytest.approx(10.0)
    table = sv.markdown_table(rows)
    assert "| **TTFT mean** | 245.0 | 245.0 | +0.0% | 269.5 | +10.0% |" in table
    assert "| E2E p50 | 600.0 | 600.0 | +0.0% | 660.0 | +10.0% |" in table


def test_median_of_means_ignores_percentiles_and_takes_absolute_values():
    sv = _script()
    rows = [{"stat": "mean", "kvplan_err_pct": e} for e in (-30.0, 5.0, 8.0)]
    rows += [{"stat": "p99", "kvplan_err_pct": 500.0}]
    assert sv.median_abs_mean_error({"run": rows}) == pytest.approx(8.0)


def test_summary_txt_columns(tmp_path):
    sv = _script()
    lines = ["Metric                           vLLM         Sim     Diff%", "-" * 59]
    for name in ("TTFT", "TPOT", "Latency"):
        for stat, value in (("Mean", 10.0), ("Median", 9.0), ("P90", 20.0), ("P95", 21.0), ("P99", 30.0)):
            lines.append(f"{name} {stat}  {value:.1f}  {value * 2:.1f}  +100.0%")
    path = tmp_path / "summary.txt"
    path.write_text("\n".join(lines) + "\n")
    vllm, sim = sv.read_summary(path)
    assert vllm["e2e"] == {"mean": 10.0, "p50": 9.0, "p90": 20.0, "p99": 30.0}
    assert sim["ttft"]["p99"] == 60.0
    path.write_text("\n".join(lines[:4]) + "\n")
    with pytest.raises(SystemExit, match="missing rows"):
        sv.read_summary(path)


def test_running_counts_every_replica_on_one_clock():
    """Replicas sample at their own step ends; the count at a tick adds each one's last sample before it."""
    import pandas as pd

    sv = _script()
    series = pd.DataFrame({"replica": [0, 0, 0, 1, 1], "time_s": [0.0, 0.9, 2.5, 0.4, 1.6],
                           "running": [2, 4, 0, 3, 1]})
    # ticks 0, 1, 2, 3: replica 0 has 2, 4, 4, 0; replica 1 has 0, 3, 1, 1 -> 2, 7, 5, 1
    assert sv.median_running(series) == pytest.approx(3.5)


def test_page_script_loads_by_path_with_its_siblings(tmp_path, capsys):
    """The page's script imports serving_replay and serving_diagnosis from its own folder, run as a script or loaded
    by path as here; a missing data folder is one line and exit 2 (the check before any run is read)."""
    page = _script("serving_validation")
    assert page.load_run is _script("serving_replay").load_run
    assert page.diagnose is _script("serving_diagnosis").diagnose
    missing = tmp_path / "no-such-folder"
    assert page.main(["--data", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err == f"{missing}: no such folder; allowed: the llmservingsim-rtx data folder (--data)\n"
