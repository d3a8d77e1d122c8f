"""The inference-perf reader on inference-perf 0.7.0's own reports of runs against `kvplan serve`
(tests/measured/data/README_inference_perf.md): a summary with stage reports beside it is one run per stage, the
per-request report splits into the stages and reproduces the tool's own percentiles, numbers are the files'
(checked against the files parsed here with plain json), and a partial report is one line naming the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from kvplan import strict_json
from kvplan.errors import UserError
from kvplan.measured.formats import aiperf, inference_perf

DATA = Path(__file__).parent / "data"
STAGES = DATA / "inference_perf_poisson_stages"
ERRORS = DATA / "inference_perf_concurrent_errors"
SUMMARY = "summary_lifecycle_metrics.json"
PER_REQUEST = "per_request_lifecycle_metrics.json"


def _read(path: Path):
    return inference_perf.read(strict_json.loads(path.read_bytes()), str(path))


def _raw(path: Path):
    return json.loads(path.read_text())


def test_a_summary_with_stage_reports_is_one_run_per_stage():
    runs = _read(STAGES / SUMMARY)
    assert [run.run_label for run in runs] == ["stage 0", "stage 1"]
    for index, run in enumerate(runs):
        raw = _raw(STAGES / f"stage_{index}_lifecycle_metrics.json")
        latency = raw["successes"]["latency"]
        assert (run.format, run.model, run.source) == ("inference-perf", "tiny-tok",
                                                      str(STAGES / f"stage_{index}_lifecycle_metrics.json"))
        assert run.rate_rps == raw["load_summary"]["requested_rate"] == [2.0, 4.0][index]
        assert run.max_concurrency is None
        assert run.num_requests == raw["load_summary"]["count"] == len(run.requests)
        assert run.duration_s == raw["benchmark_time_seconds"]
        assert run.percentiles["ttft"]["50"] == latency["time_to_first_token"]["median"]
        assert run.percentiles["tpot"]["90"] == latency["time_per_output_token"]["p90"]
        assert run.percentiles["itl"]["99"] == latency["inter_token_latency"]["p99"]
        assert run.percentiles["e2e"]["mean"] == latency["request_latency"]["mean"]
        assert run.throughput["request_rps"] == raw["successes"]["throughput"]["requests_per_sec"]
        assert run.throughput["output_tps"] == raw["successes"]["throughput"]["output_tokens_per_sec"]


def test_the_per_request_report_splits_into_the_stages_and_reproduces_their_percentiles():
    """The tool pools every token gap of a stage for ITL (numpy's percentiles): the split records give the stage
    reports' own figures, which they would not if one request sat in the wrong stage."""
    runs = _read(STAGES / SUMMARY)
    entries = sorted(_raw(STAGES / PER_REQUEST), key=lambda entry: entry["start_time"])
    first_of_stage_1 = entries[runs[0].num_requests]
    request = runs[1].requests[0]
    assert request.start_s == 0.0
    assert request.ttft_s == pytest.approx(first_of_stage_1["info"]["response_metrics"]["output_token_times"][0]
                                           - first_of_stage_1["start_time"])
    assert request.output_tokens == first_of_stage_1["info"]["response_metrics"]["server_usage"]["completion_tokens"]
    assert request.prompt_tokens == first_of_stage_1["info"]["request_metrics"]["text"]["input_tokens"]
    for run in runs:
        gaps = [gap for r in run.requests for gap in r.itl_s]
        assert np.percentile(gaps, 50) == pytest.approx(run.percentiles["itl"]["50"])
        assert np.percentile([r.ttft_s for r in run.requests], 90) == pytest.approx(run.percentiles["ttft"]["90"])
        assert np.percentile([r.e2e_s for r in run.requests], 99) == pytest.approx(run.percentiles["e2e"]["99"])


def test_a_stage_report_is_that_stage_only():
    (run,) = _read(STAGES / "stage_1_lifecycle_metrics.json")
    assert (run.run_label, run.rate_rps, len(run.requests)) == ("stage 1", 4.0, 12)


def test_a_concurrent_run_with_failures():
    (run,) = _read(ERRORS / SUMMARY)
    raw = _raw(ERRORS / "stage_0_lifecycle_metrics.json")
    assert (run.rate_rps, run.max_concurrency) == (12.0, 2)  # all 12 queued within a second behind 2 slots
    failed = [r for r in run.requests if not r.ok]
    assert len(failed) == raw["failures"]["count"] == 7
    assert all(r.ttft_s is None and r.itl_s is None for r in failed)
    assert sum(r.ok for r in run.requests) == raw["successes"]["count"]


def test_a_summary_alone_takes_the_rate_of_the_configs_one_stage(tmp_path):
    for name in (SUMMARY, "config.yaml"):
        shutil.copy(ERRORS / name, tmp_path / name)
    (run,) = _read(tmp_path / SUMMARY)
    raw = _raw(ERRORS / SUMMARY)
    assert (run.run_label, run.rate_rps, run.max_concurrency, run.requests) == ("", 12.0, 2, None)
    assert run.prompt_tokens == [round(raw["successes"]["prompt_tokens"]["mean"])]
    # several stages pooled in one summary: no one rate describes them
    for name in (SUMMARY, "config.yaml"):
        shutil.copy(STAGES / name, tmp_path / name)
    (run,) = _read(tmp_path / SUMMARY)
    assert (run.rate_rps, run.max_concurrency, run.model) == (None, None, "tiny-tok")


def test_a_partial_stage_report_names_the_missing_field(tmp_path):
    shutil.copytree(STAGES, tmp_path / "run")
    path = tmp_path / "run" / "stage_1_lifecycle_metrics.json"
    raw = _raw(path)
    del raw["successes"]["latency"]["request_latency"]
    path.write_text(json.dumps(raw))
    with pytest.raises(UserError) as caught:
        _read(tmp_path / "run" / SUMMARY)
    message = str(caught.value)
    assert message.startswith(f"{path}: inference-perf report: missing successes.latency.request_latency;")
    assert "\n" not in message


def test_a_per_request_report_of_another_run_is_refused(tmp_path):
    shutil.copytree(STAGES, tmp_path / "run")
    entries = _raw(STAGES / PER_REQUEST)
    (tmp_path / "run" / PER_REQUEST).write_text(json.dumps(entries[1:]))
    with pytest.raises(UserError, match=r"per-request report: 19 requests, but the reports beside it count 20"):
        _read(tmp_path / "run" / SUMMARY)
    del entries[3]["info"]["request_metrics"]
    (tmp_path / "run" / PER_REQUEST).write_text(json.dumps(entries))
    with pytest.raises(UserError, match=r"missing \[3\]\.info\.request_metrics;"):
        _read(tmp_path / "run" / SUMMARY)


def test_detect_knows_its_own_reports_and_no_others():
    for path in (STAGES / SUMMARY, STAGES / "stage_0_lifecycle_metrics.json", ERRORS / SUMMARY):
        assert inference_perf.detect(strict_json.loads(path.read_bytes()))
    others = [
        strict_json.loads((DATA / "aiperf_rate" / "profile_export_aiperf.json").read_bytes()),
        strict_json.loads((STAGES / PER_REQUEST).read_bytes()),
        # the server-metrics summary inference-perf writes from Prometheus (summarize_prometheus_metrics)
        {"benchmark_time_seconds": 0.0, "load_summary": {}, "failures": {}, "successes": {"count": 3}},
        {"backend": "vllm", "request_throughput": 1.0, "ttfts": [0.1]},  # vllm bench serve
        {"benchmarks": []},  # GuideLLM
    ]
    assert not any(inference_perf.detect(document) for document in others)
    assert not aiperf.detect(strict_json.loads((STAGES / SUMMARY).read_bytes()))


def test_a_report_file_prefix_is_followed(tmp_path):
    """`storage.local_storage.report_file_prefix` goes before every file name (client/filestorage/local.py)."""
    for path in STAGES.iterdir():
        shutil.copy(path, tmp_path / f"run[1]_{path.name}")
    runs = _read(tmp_path / f"run[1]_{SUMMARY}")
    assert [(run.run_label, len(run.requests), run.model) for run in runs] == [
        ("stage 0", 8, "tiny-tok"), ("stage 1", 12, "tiny-tok")]
