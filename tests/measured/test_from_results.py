"""`kvplan validate --from-results` end to end on the real vllm bench serve files (in process: one interpreter for
every case), and its one-line refusals of bad, partial and misused input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvplan.cli import main
from kvplan.output import verify_result_set
from tests.badinput.contract import refused

DATA = Path(__file__).parent / "data"
DETAILED = str(DATA / "vllm-bench-rate2-detailed.json")
AGGREGATE = str(DATA / "vllm-bench-conc4.json")


def run_json(capsys, *argv: str) -> dict:
    assert main(["validate", "--from-results", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def rows_of(entry: dict) -> dict:
    return {(r["metric"], r["point"]): r for r in entry["comparison"]}


def test_detailed_file_end_to_end(capsys):
    raw = json.loads(Path(DETAILED).read_text())
    doc = run_json(capsys, DETAILED, "--hardware", "cpu-local")
    assert doc["format"] == "vllm-bench" and len(doc["runs"]) == 1
    entry = doc["runs"][0]
    assert entry["model"] == {"file": raw["model_id"], "simulated": "smollm2-135m"}
    assert entry["hardware"] == "cpu-local" and not any(g.startswith("hardware") for g in entry["guessed"])
    assert entry["workload"] == "12 requests (64 prompt, 16 output tokens) at the file's send times"
    assert entry["simulated"]["completed"] == 12 and entry["simulated"]["rejected"] == 0
    rows = rows_of(entry)
    assert rows[("ttft", "99")]["measured"] == pytest.approx(raw["p99_ttft_ms"] / 1e3)
    for key in (("ttft", "mean"), ("tpot", "50"), ("itl", "90"), ("e2e", "99"), ("req/s", "")):
        row = rows[key]
        assert row["simulated"] > 0
        assert row["error_pct"] == pytest.approx((row["simulated"] - row["measured"]) / row["measured"] * 100)
    assert entry["model_error"]["source"] and "model error" in entry["model_error_line"]


def test_aggregate_file_with_flags_and_guesses(capsys, tmp_path):
    out = tmp_path / "set"
    doc = run_json(capsys, AGGREGATE, "--model", "smollm2-135m", "--hardware", "cpu-local", "--block-size", "32",
                   "--replicas", "2", "--out", str(out))
    entry = doc["runs"][0]
    assert entry["replicas"] == 2
    assert "by 4 concurrent users" in entry["workload"] and entry["simulated"]["completed"] == 16
    guessed = [g.split()[0] for g in entry["guessed"]]
    assert "block_size" not in guessed and "model" not in guessed and "hardware" not in guessed
    assert "tensor_parallel_size 1 (--tensor-parallel-size)" in entry["guessed"]
    assert ("e2e", "mean") in rows_of(entry)  # from the file's per-request latencies
    assert json.loads((out / "comparison.json").read_text()) == doc
    assert verify_result_set(out)["config"]["command"] == "validate --from-results"


def test_terminal_text_fits_100_columns_and_says_what_was_guessed(capsys):
    assert main(["validate", "--from-results", AGGREGATE]) == 0
    text = capsys.readouterr().out
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "GUESSED" in text and "hardware h100-sxm (--hardware)" in text and "model error" in text
    assert "HuggingFaceTB/SmolLM2-135M-Instruct as smollm2-135m on h100-sxm" in text


def test_bad_and_partial_files_get_one_line(capsys, tmp_path):
    raw = json.loads(Path(DETAILED).read_text())
    partial = dict(raw)
    del partial["total_output_tokens"]
    (tmp_path / "partial.json").write_text(json.dumps(partial))
    line = refused(capsys, ["validate", "--from-results", str(tmp_path / "partial.json")], "total_output_tokens",
                   tmp=tmp_path)
    assert "partial.json" in line
    (tmp_path / "cut.json").write_text(Path(DETAILED).read_text()[:3000])
    assert "cut.json" in refused(capsys, ["validate", "--from-results", str(tmp_path / "cut.json")], "not JSON",
                                 tmp=tmp_path)
    (tmp_path / "other.json").write_text('{"hello": "world"}')
    refused(capsys, ["validate", "--from-results", str(tmp_path / "other.json")], "no known result format",
            tmp=tmp_path)
    line = refused(capsys, ["validate", "--from-results", str(tmp_path / "other.json"), "--format", "vllm-bench"],
                   "model_id", tmp=tmp_path)
    assert "other.json" in line
    unknown = dict(raw, model_id="acme/unknown-7b")
    (tmp_path / "unknown.json").write_text(json.dumps(unknown))
    refused(capsys, ["validate", "--from-results", str(tmp_path / "unknown.json")], "--model", tmp=tmp_path)
    refused(capsys, ["validate", "--from-results", str(tmp_path / "missing.json")], "no such file", tmp=tmp_path)


def test_live_flags_and_from_results_do_not_mix(capsys):
    refused(capsys, ["validate", "--from-results", DETAILED, "--trace", DETAILED], "--trace")
    refused(capsys, ["validate", "--from-results", DETAILED, "--repeats", "3"], "--repeats")
    refused(capsys, ["validate", "--from-results", DETAILED, "--dtype", "float32"], "--dtype")
    refused(capsys, ["validate", "--model", "tiny-llama", "--mode", "policy"], "--trace")


@pytest.mark.parametrize(("path", "fmt"), [
    ("guidellm_constant.json", "guidellm"), ("guidellm_concurrent.json", "guidellm"),
    ("aiperf_rate/profile_export_aiperf.json", "aiperf"),
    ("aiperf_concurrency_errors/profile_export_aiperf.json", "aiperf"),
    ("inference_perf_poisson_stages/summary_lifecycle_metrics.json", "inference-perf"),
    ("inference_perf_concurrent_errors/summary_lifecycle_metrics.json", "inference-perf")])
def test_every_formats_real_file_end_to_end(capsys, path, fmt):
    """The other tools' real files (their fixtures, recorded with tiny models kvplan has no spec of: --model)
    go through detection, the workload, the simulation and the comparison."""
    doc = run_json(capsys, str(DATA / path), "--model", "smollm2-135m", "--hardware", "cpu-local")
    assert doc["format"] == fmt and doc["runs"]
    for entry in doc["runs"]:
        rows = rows_of(entry)
        assert any(metric == "ttft" and row["simulated"] is not None for (metric, _), row in rows.items())
        sent = int(entry["workload"].split()[0])
        assert entry["simulated"]["completed"] + entry["simulated"]["rejected"] == sent
        assert entry["model"]["simulated"] == "smollm2-135m" and entry["hardware"] == "cpu-local"
