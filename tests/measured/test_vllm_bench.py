"""`vllm bench serve` result files (real ones, tests/measured/data/README.md) read into MeasuredRun: each number
checked against the file as json reads it, and vLLM's own summary figures recomputed from its per-request records."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from kvplan.errors import UserError
from kvplan.measured.compare import measured
from kvplan.measured.formats import vllm_bench
from kvplan.measured.load import load_document, read_runs
from kvplan.measured.simulate import builtin_model, workload

DATA = Path(__file__).parent / "data"
DETAILED = DATA / "vllm-bench-rate2-detailed.json"
AGGREGATE = DATA / "vllm-bench-conc4.json"


def test_detailed_file_reads_every_request():
    raw = json.loads(DETAILED.read_text())
    fmt, runs = read_runs(DETAILED)
    assert fmt == "vllm-bench" and len(runs) == 1
    run = runs[0]
    assert run.model == raw["model_id"] and run.rate_rps == raw["request_rate"] == 2.0
    assert run.max_concurrency is None and run.num_requests == raw["num_prompts"] == 12
    assert run.requests is not None and len(run.requests) == len(raw["input_lens"])
    first = min(raw["start_times"])
    for i, r in enumerate(run.requests):
        assert (r.prompt_tokens, r.output_tokens) == (raw["input_lens"][i], raw["output_lens"][i])
        assert r.start_s == pytest.approx(raw["start_times"][i] - first)
        assert r.ttft_s == raw["ttfts"][i] and r.e2e_s == raw["latencies"][i] and r.itl_s == raw["itls"][i]
        assert r.ok
    assert run.percentiles["ttft"]["99"] == pytest.approx(raw["p99_ttft_ms"] / 1e3)
    assert run.percentiles["e2e"]["50"] == pytest.approx(raw["median_e2el_ms"] / 1e3)
    assert run.percentiles["tpot"]["mean"] == pytest.approx(raw["mean_tpot_ms"] / 1e3)
    assert run.throughput == {"request_rps": raw["request_throughput"], "output_tps": raw["output_throughput"],
                              "total_tps": raw["total_token_throughput"]}


def test_records_reproduce_vllms_own_figures():
    """The figures recomputed from the per-request records (compare.measured, the path a tool giving only
    records takes) are vLLM's own: the same definitions on both sides."""
    run = read_runs(DETAILED)[1][0]
    stated = measured(run)
    run.percentiles = {}
    recomputed = measured(run)
    for metric in ("ttft", "tpot", "itl", "e2e"):
        for point in ("mean", "50", "90", "99"):
            assert recomputed[metric][point] == pytest.approx(stated[metric][point], rel=1e-9), (metric, point)


def test_aggregate_file_uses_the_mean_lengths_and_the_latencies():
    raw = json.loads(AGGREGATE.read_text())
    run = read_runs(AGGREGATE, "vllm-bench")[1][0]
    assert run.requests is None and math.isinf(run.rate_rps) and run.max_concurrency == raw["max_concurrency"] == 4
    assert run.prompt_tokens == [raw["total_input_tokens"] // raw["completed"]] == [96]
    assert run.output_tokens == [24] and run.num_requests == 16
    assert "ttft" in run.percentiles and set(run.percentiles["ttft"]) == {"mean", "50", "99"}
    assert run.percentiles["e2e"]["mean"] == pytest.approx(np.mean(raw["latencies"]))
    assert run.percentiles["e2e"]["99"] == pytest.approx(np.percentile(raw["latencies"], 99))
    assert any("--save-detailed" in n for n in run.notes)
    work = workload(run, seed=0)
    assert work.users == 4 and len(work.trace) == 16 and set(work.trace.prompt_tokens) == {96}


def test_workload_at_a_rate_is_seeded_and_counted():
    run = read_runs(DETAILED)[1][0]
    replay = workload(run, seed=0)
    assert replay.users is None and "send times" in replay.how
    assert np.allclose(replay.trace.arrival_s, sorted(r.start_s for r in run.requests))
    run.requests = None
    run.prompt_tokens, run.output_tokens = [64], [16]
    a, b = workload(run, seed=3), workload(run, seed=3)
    assert len(a.trace) == 12 and np.array_equal(a.trace.arrival_s, b.trace.arrival_s) and "Poisson" in a.how
    assert not np.array_equal(a.trace.arrival_s, workload(run, seed=4).trace.arrival_s)


def test_append_result_lines_are_runs(tmp_path):
    path = tmp_path / "appended.json"
    path.write_text(AGGREGATE.read_text() + "\n" + AGGREGATE.read_text())  # as --append-result writes
    fmt, runs = read_runs(path)
    assert fmt == "vllm-bench" and [r.run_label for r in runs] == ["run 1", "run 2"]


@pytest.mark.parametrize(("name", "builtin"), [
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m"), ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b"),
    ("meta-llama/Llama-2-7b-chat-hf", "llama-2-7b"), ("mistralai/Mistral-7B-Instruct-v0.2", "mistral-7b"),
    ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"), ("/models/llama-3.1-8b/", "llama-3.1-8b"),
    ("acme/unknown-7b", None), ("", None)])
def test_served_names_map_to_builtin_models(name, builtin):
    assert builtin_model(name) == builtin


def test_a_missing_field_is_named():
    raw = json.loads(AGGREGATE.read_text())
    del raw["duration"]
    assert vllm_bench.detect(raw)
    with pytest.raises(UserError, match=r"f.json: no field `duration`"):
        vllm_bench.read(raw, "f.json")
    raw = json.loads(DETAILED.read_text())
    raw["ttfts"] = raw["ttfts"][:-1]
    with pytest.raises(UserError, match=r"`ttfts` is not a list of 12 entries"):
        vllm_bench.read(raw, "f.json")


def test_other_documents_are_not_vllm_bench(tmp_path):
    assert not vllm_bench.detect({"benchmarks": []}) and not vllm_bench.detect([]) and not vllm_bench.detect("x")
    csv = tmp_path / "x.csv"
    csv.write_text("Metric,avg\nttft,1.5\n")
    assert load_document(csv) == [{"Metric": "ttft", "avg": "1.5"}]


def test_closed_loop_sends_the_files_count_and_the_fast_path_agrees():
    """--max-concurrency C with N prompts: C users, N requests in all (ClosedLoop max_requests), the same result
    stepping one step at a time; fewer requests than users sends only those."""
    from dataclasses import replace

    from kvplan.measured.simulate import simulate_workload
    from kvplan.sim.spec import SimSpec

    run = read_runs(AGGREGATE)[1][0]
    work = workload(run, seed=0)
    spec = SimSpec(model="smollm2-135m", hardware="cpu-local")
    fast, slow = simulate_workload(work, spec, 0), simulate_workload(work, replace(spec, fast_path=False), 0)
    assert fast.summary["completed"] == len(fast.requests) == 16
    assert fast.requests.equals(slow.requests)
    starts = np.sort(fast.requests["arrival_s"].to_numpy())
    assert np.count_nonzero(starts == 0.0) == 4  # the four users' first requests, the rest on completions
    run.num_requests = 2
    assert simulate_workload(workload(run, seed=0), spec, 0).summary["completed"] == 2


def test_simulated_figures_beyond_the_summary_come_from_the_requests():
    from kvplan.measured.compare import simulated
    from kvplan.measured.simulate import simulate_workload
    from kvplan.sim.spec import SimSpec

    result = simulate_workload(workload(read_runs(DETAILED)[1][0], seed=0), SimSpec(model="smollm2-135m",
                                                                                      hardware="cpu-local"), 0)
    assert simulated(result, "ttft", "95") == pytest.approx(np.percentile(result.requests["ttft_ms"], 95) / 1e3)
    assert simulated(result, "ttft", "99") == pytest.approx(result.summary["p99_ttft_ms"] / 1e3)
    assert simulated(result, "itl", "95") is None  # the summary keeps the gaps' 50/90/99 and mean only
