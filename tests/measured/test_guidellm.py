"""The GuideLLM reader on real reports (tests/measured/data/README_guidellm.md says how they were recorded): each
number checked against the report's own figures, or recomputed from its raw per-request timestamps; detection; and a
report with a required field removed naming that field in one line."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from kvplan import strict_json
from kvplan.errors import UserError
from kvplan.measured.formats import FORMATS, format_module, guidellm

DATA = Path(__file__).parent / "data"
CONSTANT, CONCURRENT = DATA / "guidellm_constant.json", DATA / "guidellm_concurrent.json"


def _load(path: Path) -> dict:
    document = strict_json.loads(path.read_bytes())
    assert isinstance(document, dict)
    return document


@pytest.fixture(scope="module")
def documents() -> dict[str, dict]:
    return {path.name: _load(path) for path in (CONSTANT, CONCURRENT)}


def test_the_registry_names_this_module():
    assert format_module("guidellm") is guidellm and FORMATS["guidellm"] == "guidellm"


@pytest.mark.parametrize("name", [CONSTANT.name, CONCURRENT.name])
def test_the_reports_own_figures_in_seconds(documents, name):
    document = documents[name]
    [run] = guidellm.read(document, name)
    [bench] = document["benchmarks"]
    metrics = bench["metrics"]
    assert run.tool == f"GuideLLM {document['metadata']['guidellm_version']}" == "GuideLLM 0.8.1"
    assert run.format == "guidellm" and run.source == name and run.model == "tiny-smol"
    ttft = metrics["time_to_first_token_ms"]["successful"]
    assert run.percentiles["ttft"]["50"] == pytest.approx(ttft["percentiles"]["p50"] / 1000)
    assert run.percentiles["ttft"]["mean"] == pytest.approx(ttft["mean"] / 1000)
    assert run.percentiles["itl"]["90"] == pytest.approx(
        metrics["inter_token_latency_ms"]["successful"]["percentiles"]["p90"] / 1000)
    assert run.percentiles["e2e"]["99"] == pytest.approx(metrics["request_latency"]["successful"]["percentiles"]["p99"])
    assert set(run.percentiles) == {"ttft", "itl", "e2e"}  # GuideLLM's TPOT includes the TTFT: not vLLM's
    assert run.throughput["request_rps"] == pytest.approx(metrics["requests_per_second"]["successful"]["mean"])
    # GuideLLM's mean rates are the window's successful output (or all) tokens over its duration
    ok = [r for r in run.requests if r.ok]
    assert run.duration_s == pytest.approx(bench["duration"])
    assert run.throughput["output_tps"] == pytest.approx(sum(r.output_tokens for r in ok) / run.duration_s)
    assert run.throughput["total_tps"] == pytest.approx(
        sum(r.prompt_tokens + r.output_tokens for r in ok) / run.duration_s)


@pytest.mark.parametrize("name", [CONSTANT.name, CONCURRENT.name])
def test_each_request_from_its_raw_timestamps(documents, name):
    document = documents[name]
    [run] = guidellm.read(document, name)
    [bench] = document["benchmarks"]
    raw = bench["requests"]
    assert run.num_requests == len(run.requests) == sum(len(raw[s]) for s in ("successful", "errored", "incomplete"))
    starts = [r.start_s for r in run.requests]
    assert starts == sorted(starts) and starts[0] == 0.0  # send order; the first request opens the benchmark
    by_start = {round(r.start_s, 9): r for r in run.requests}
    origin = bench["scheduler_metrics"]["request_start_time"]
    for item in raw["successful"]:
        timings = item["info"]["timings"]
        record = by_start[round(timings["request_start"] - origin, 9)]
        assert record.ok and record.itl_s is None
        assert record.ttft_s == pytest.approx(timings["first_token_iteration"] - timings["request_start"])
        assert record.e2e_s == pytest.approx(timings["request_end"] - timings["request_start"])
        assert (record.prompt_tokens, record.output_tokens) == (item["input_metrics"]["total_tokens"],
                                                               item["output_metrics"]["total_tokens"])
    failed = [r for r in run.requests if not r.ok]
    assert len(failed) == len(raw["errored"]) + len(raw["incomplete"])
    assert all(r.ttft_s is None and r.e2e_s is None and r.output_tokens == 0 for r in failed)


def test_how_each_strategy_sent_its_requests(documents):
    [constant] = guidellm.read(documents[CONSTANT.name], "c.json")
    assert (constant.run_label, constant.rate_rps, constant.max_concurrency) == ("constant@4.00", 4.0, 10240)
    assert constant.settings == {"arrival_process": "constant"} and all(r.ok for r in constant.requests)
    [concurrent] = guidellm.read(documents[CONCURRENT.name], "k.json")
    assert (concurrent.run_label, concurrent.rate_rps, concurrent.max_concurrency) == ("concurrent@4", None, 4)
    assert concurrent.settings == {} and sum(not r.ok for r in concurrent.requests) == 8  # the server's 503s


def test_every_benchmark_of_a_report_in_its_order(documents):
    joined = copy.deepcopy(documents[CONSTANT.name])
    joined["benchmarks"] += copy.deepcopy(documents[CONCURRENT.name]["benchmarks"])
    runs = guidellm.read(joined, "sweep.json")
    assert [r.run_label for r in runs] == ["constant@4.00", "concurrent@4"]
    assert [r.num_requests for r in runs] == [12, 10]


def test_a_reservoir_sample_gives_lengths_not_requests(documents):
    sampled = copy.deepcopy(documents[CONSTANT.name])
    bench = sampled["benchmarks"][0]
    bench["config"]["sample_size"] = len(bench["requests"]["successful"])  # full: more requests may have run
    [run] = guidellm.read(sampled, "s.json")
    assert run.requests is None and run.num_requests == bench["scheduler_state"]["processed_requests"]
    assert run.prompt_tokens == [32] * 12 and run.output_tokens == [16] * 12


def test_detect(documents):
    assert all(guidellm.detect(d) for d in documents.values())
    vllm_bench = {"date": "20261203-181600", "backend": "vllm", "model_id": "m", "num_prompts": 10,
                  "request_rate": 4.0, "completed": 10, "input_lens": [32] * 10, "ttfts": [0.01] * 10}
    assert not guidellm.detect(vllm_bench)
    assert not guidellm.detect([documents[CONSTANT.name]]) and not guidellm.detect({"benchmarks": []})


@pytest.mark.parametrize("path", [
    ("metadata", "guidellm_version"),
    ("benchmarks", 0, "duration"),
    ("benchmarks", 0, "config", "strategy", "rate"),
    ("benchmarks", 0, "metrics", "time_to_first_token_ms"),
    ("benchmarks", 0, "metrics", "requests_per_second", "successful", "mean"),
    ("benchmarks", 0, "requests", "successful", 3, "prompt_tokens"),
])
def test_a_missing_field_is_named(documents, path):
    broken = copy.deepcopy(documents[CONSTANT.name])
    parent = broken
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    dotted = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path).lstrip(".")
    with pytest.raises(UserError) as caught:
        guidellm.read(broken, "results/x.json")
    message = str(caught.value)
    assert message.startswith(f"results/x.json: GuideLLM report: missing {dotted}; allowed: ")
    assert "\n" not in message


@pytest.mark.parametrize(("where", "value", "expected"), [
    (("metadata", "version"), 1, "metadata.version 1 is not supported; allowed: 2 "),
    (("benchmarks", 0, "config", "strategy", "type_"), "knee", "'knee' is not a strategy kvplan reads; allowed: sync"),
    (("benchmarks", 0, "requests", "successful", 0, "output_tokens"), 16.5,
     "benchmarks[0].requests.successful[0].output_tokens is 16.5; allowed: a whole number >= 0"),
    (("benchmarks", 0, "metrics", "request_latency", "successful", "mean"), "fast",
     "benchmarks[0].metrics.request_latency.successful.mean is 'fast'; allowed: a number >= 0"),
    (("benchmarks", 0, "config", "strategy", "max_concurrency"), 0,
     "benchmarks[0].config.strategy.max_concurrency is 0; allowed: a whole number >= 1"),
])
def test_a_wrong_value_is_named(documents, where, value, expected):
    broken = copy.deepcopy(documents[CONSTANT.name])
    parent = broken
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = value
    with pytest.raises(UserError, match="^x.json: GuideLLM report: .*" + re.escape(expected)):
        guidellm.read(broken, "x.json")
