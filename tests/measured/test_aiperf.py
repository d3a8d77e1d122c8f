"""The AIPerf reader on AIPerf 0.13.0's own exports of runs against `kvplan serve` (tests/measured/data/
README_aiperf.md): the numbers it reads are the files' (checked against the files parsed here with plain json),
the per-request records beside the summary reproduce AIPerf's own percentiles, and a partial file is one line
naming the missing field."""

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
RATE = DATA / "aiperf_rate"
ERRORS = DATA / "aiperf_concurrency_errors"
SUMMARY = "profile_export_aiperf.json"


def _read(folder: Path):
    source = folder / SUMMARY
    (run,) = aiperf.read(strict_json.loads(source.read_bytes()), str(source))
    return run


def _raw(folder: Path) -> tuple[dict, list[dict]]:
    summary = json.loads((folder / SUMMARY).read_text())
    records = [json.loads(line) for line in (folder / "profile_export.jsonl").read_text().splitlines()]
    return summary, records


def test_the_rate_run_is_read_as_the_file_says():
    run = _read(RATE)
    raw, records = _raw(RATE)
    phase = raw["input_config"]["phases"][0]
    assert (run.format, run.tool, run.model) == ("aiperf", f"AIPerf {raw['aiperf_version']}", "tiny-tok")
    assert (run.rate_rps, run.max_concurrency) == (phase["rate"], phase["concurrency"]) == (4.0, 4)
    assert run.num_requests == raw["request_count"]["avg"] == len(records) == 16
    assert run.duration_s == pytest.approx(raw["benchmark_duration"]["avg"])
    assert raw["time_to_first_token"]["unit"] == "ms"  # the figures below are converted to seconds
    assert run.percentiles["ttft"]["50"] == pytest.approx(raw["time_to_first_token"]["p50"] / 1e3)
    assert run.percentiles["tpot"]["mean"] == pytest.approx(raw["inter_token_latency"]["avg"] / 1e3)
    assert run.percentiles["itl"]["95"] == pytest.approx(raw["inter_chunk_latency"]["p95"] / 1e3)
    assert run.percentiles["e2e"]["99"] == pytest.approx(raw["request_latency"]["p99"] / 1e3)
    assert run.throughput == pytest.approx({"request_rps": raw["request_throughput"]["avg"],
                                            "output_tps": raw["output_token_throughput"]["avg"],
                                            "total_tps": raw["total_token_throughput"]["avg"]})


def test_records_are_the_requests_in_send_order_with_the_servers_token_counts():
    run = _read(RATE)
    _, records = _raw(RATE)
    assert run.requests is not None and run.prompt_tokens is None
    by_start = sorted(records, key=lambda record: record["metadata"]["request_start_ns"])
    first_ns = by_start[0]["metadata"]["request_start_ns"]
    for request, record in zip(run.requests, by_start, strict=True):
        metrics = record["metrics"]
        assert request.start_s == pytest.approx((record["metadata"]["request_start_ns"] - first_ns) / 1e9)
        assert request.prompt_tokens == metrics["usage_prompt_tokens"]["value"]
        assert request.output_tokens == metrics["usage_completion_tokens"]["value"]
        assert request.ttft_s == pytest.approx(metrics["time_to_first_token"]["value"] / 1e3)
        assert request.ok
    assert [r.start_s for r in run.requests] == sorted(r.start_s for r in run.requests)


def test_the_records_reproduce_aiperfs_own_percentiles():
    """AIPerf pools every chunk gap for ITL and takes numpy's percentiles: the records give the same figures."""
    run = _read(RATE)
    gaps = [gap for request in run.requests for gap in request.itl_s]
    assert np.percentile(gaps, 50) == pytest.approx(run.percentiles["itl"]["50"])
    assert np.percentile([r.ttft_s for r in run.requests], 90) == pytest.approx(run.percentiles["ttft"]["90"])
    assert np.percentile([r.e2e_s for r in run.requests], 99) == pytest.approx(run.percentiles["e2e"]["99"])


def test_failed_requests_are_kept_as_not_ok_with_the_prompt_aiperf_sent():
    run = _read(ERRORS)
    raw, records = _raw(ERRORS)
    failed = [r for r in run.requests if not r.ok]
    assert len(failed) == raw["error_request_count"]["avg"] == 3
    assert run.num_requests == len(run.requests) == 12
    assert (run.rate_rps, run.max_concurrency) == (None, 2)  # a concurrency phase: closed loop, no rate
    assert sorted(r.prompt_tokens for r in failed) == sorted(
        record["metrics"]["error_isl"]["value"] for record in records if record.get("error"))
    assert all(r.output_tokens == 0 and r.e2e_s is None for r in failed)


def test_the_summary_alone_gives_the_mean_lengths(tmp_path):
    shutil.copy(RATE / SUMMARY, tmp_path / SUMMARY)
    run = _read(tmp_path)
    raw, _ = _raw(RATE)
    assert run.requests is None
    assert run.prompt_tokens == [round(raw["usage_prompt_tokens"]["avg"])]
    assert run.output_tokens == [round(raw["usage_completion_tokens"]["avg"])]


def test_records_of_another_run_are_refused(tmp_path):
    shutil.copy(RATE / SUMMARY, tmp_path / SUMMARY)
    lines = (RATE / "profile_export.jsonl").read_text().splitlines()
    (tmp_path / "profile_export.jsonl").write_text("\n".join(lines[:10]) + "\n")
    with pytest.raises(UserError, match=r"profile_export\.jsonl: AIPerf records: 10 profiling records, but .* "
                                        r"counts 16 requests"):
        _read(tmp_path)


@pytest.mark.parametrize("path", [("request_latency",), ("input_config", "phases"), ("request_count", "avg")])
def test_a_partial_summary_names_the_missing_field(tmp_path, path):
    raw = json.loads((RATE / SUMMARY).read_text())
    node = raw
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    (tmp_path / SUMMARY).write_text(json.dumps(raw))
    with pytest.raises(UserError) as caught:
        _read(tmp_path)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / SUMMARY}: AIPerf export: missing {'.'.join(path)};")
    assert "\n" not in message


def test_a_partial_record_names_its_line_and_field(tmp_path):
    shutil.copy(RATE / SUMMARY, tmp_path / SUMMARY)
    _, records = _raw(RATE)
    del records[2]["metrics"]["request_latency"]
    (tmp_path / "profile_export.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    with pytest.raises(UserError, match=r"profile_export\.jsonl:3: AIPerf record: missing metrics\.request_latency;"):
        _read(tmp_path)


def test_detect_knows_its_own_files_and_no_others():
    assert aiperf.detect(strict_json.loads((RATE / SUMMARY).read_bytes()))
    assert aiperf.detect(strict_json.loads((ERRORS / SUMMARY).read_bytes()))
    inference_perf_report = DATA / "inference_perf_poisson_stages" / "summary_lifecycle_metrics.json"
    others = [
        strict_json.loads(inference_perf_report.read_bytes()),
        {"backend": "vllm", "request_throughput": 1.0, "ttfts": [0.1], "input_lens": [10]},  # vllm bench serve
        {"benchmarks": [{"type_": "generative_benchmark"}]},  # GuideLLM
        [json.loads((RATE / "profile_export.jsonl").read_text().splitlines()[0])],
    ]
    assert not any(aiperf.detect(document) for document in others)
    assert not inference_perf.detect(strict_json.loads((RATE / SUMMARY).read_bytes()))


def test_records_are_found_beside_a_prefixed_export(tmp_path):
    """`--profile-export-prefix foo` writes foo.json beside foo.jsonl (AIPerf's config/artifacts.py)."""
    assert aiperf.records_name("out/profile_export_aiperf.json") == "profile_export.jsonl"
    shutil.copy(RATE / SUMMARY, tmp_path / "foo.json")
    shutil.copy(RATE / "profile_export.jsonl", tmp_path / "foo.jsonl")
    source = tmp_path / "foo.json"
    (run,) = aiperf.read(strict_json.loads(source.read_bytes()), str(source))
    assert run.requests is not None and len(run.requests) == 16


def test_a_document_that_is_not_an_object_is_one_line():
    with pytest.raises(UserError, match=r"^x\.json: AIPerf export: the document is \[1, 2\]; allowed: an object$"):
        aiperf.read([1, 2], "x.json")
