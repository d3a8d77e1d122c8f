"""The experiment schema: every shipped example validates (and its points build), and broken files each fail
with the expected key path, bad value and allowed values, as one line with exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvplan.cli import main
from kvplan.commands.run import load
from kvplan.experiments.fields import SchemaError
from kvplan.experiments.points import expand

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "experiments").glob("*.yaml"))
BASE = {"name": "t", "model": "llama-3-8b", "hardware": "a100-40gb",
        "workload": {"trace": "sample:mooncake_style", "transforms": {"window": [0, 300]}}}


def test_the_examples_are_all_there():
    names = {p.stem for p in EXAMPLES}
    assert {"quickstart", "block_size_sweep", "eviction_policies", "paged_vs_reservation", "capacity_search",
            "sinks_window", "kv_dtype", "schedules"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_validates_and_documents_itself(path):
    assert path.read_text().startswith("# "), "each example is documented at its top"
    exp, points = load(path)
    assert exp.name == path.stem and points


def write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def merged(**changes) -> dict:
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = doc
        for key in parents:
            node = node.setdefault(key, {})
        if value is DROP:
            node.pop(leaf)
        else:
            node[leaf] = value
    return doc


DROP = object()
BROKEN = [
    (merged(engin={"block_size": 16}), "engin: unknown key; did you mean 'engine'?"),
    (merged(engine__block_sze=16), "engine.block_sze: unknown key; did you mean 'block_size'?"),
    (merged(engine__eviction_policy="lur"), "engine.eviction_policy: unknown value 'lur'; did you mean 'lru'?"),
    (merged(engine__block_size=True), "engine.block_size: must be an integer >= 1 and <= 256, got True"),
    (merged(engine__block_size=12.5), "engine.block_size: must be an integer"),
    (merged(engine__gpu_memory_utilization=1.5), "engine.gpu_memory_utilization: must be a finite number > 0 and"
                                                 " <= 1, got 1.5"),
    (merged(engine__watermark=float("nan")), "engine.watermark: must be a finite number"),
    (merged(cluster__replicas=0), "cluster.replicas: must be an integer >= 1"),
    (merged(cluster__router="random"), "cluster.router: unknown value 'random'; allowed: round_robin"),
    (merged(hardware="a100-40"), "hardware: unknown hardware 'a100-40'; did you mean 'a100-40gb'?"),
    (merged(model="llama-3-9b"), "model: unknown model 'llama-3-9b'; did you mean 'llama-3-8b'?"),
    (merged(workload__trace="sample:nope"), "workload.trace: no bundled sample 'nope'; allowed: sample:"),
    (merged(workload__trace="missing.jsonl"), "workload.trace: missing.jsonl: no such file"),
    (merged(workload__synthetic={"requests": 5}), "workload: needs exactly one of trace"),
    (merged(workload__transforms={"window": [10]}), "workload.transforms.window: must be [START_S, END_S]"),
    (merged(workload__transforms={"rate_scale": 2}), "workload.transforms.rate_scale: set workload.rate_scale"),
    (merged(workload__transforms={"windw": [0, 1]}), "workload.transforms.windw: unknown key; did you mean"
                                                     " 'window'?"),
    (merged(workload__rate_scale=-1), "workload.rate_scale: must be a finite number >= 1e-06 and <= 1000000, got -1"),
    (merged(workload__format="mooncak"), "workload.format: unknown value 'mooncak'; did you mean 'mooncake'?"),
    (merged(workload__hash_granularity=0), "workload.hash_granularity: must be an integer >= 1 and <= 10000000 or null,"
     " got 0"),
    (merged(workload__keep_failed="yes"), "workload.keep_failed: must be true or false, got 'yes'"),
    (merged(workload__trace=DROP, workload__transforms=DROP, workload__synthetic={"requests": 5},
            workload__skip_bad=True), "workload.skip_bad: applies to a trace file; allowed: with workload.trace"),
    (merged(sweep={"grid": {"engine.block_size": []}}), "sweep.grid.engine.block_size: must be a non-empty list"),
    (merged(sweep={"grid": {"engine.blocksize": [16]}}), "sweep.grid.engine.blocksize: unknown key; did you mean"
                                                         " 'engine.block_size'?"),
    (merged(sweep={"grid": {"engine.block_size": [16, "big"]}}), "sweep.grid.engine.block_size[1]: must be an"
                                                                 " integer"),
    (merged(sweep={"zip": {"engine.block_size": [16, 32], "cluster.replicas": [1]}}),
     "sweep.zip: lists of different lengths"),
    (merged(search={"target": "max_rate"}), "search: needs an slo section"),
    (merged(search={"target": "max_rates"}, slo={"p99_ttft_ms": 1000}),
     "search.target: unknown value 'max_rates'; did you mean 'max_rate'?"),
    (merged(search={"target": "max_rate", "low": 4, "high": 2}, slo={"p99_ttft_ms": 1000}),
     "search.low: must be below search.high"),
    (merged(search={"target": "min_replicas"}, slo={"p99_ttft_ms": 1000},
            sweep={"grid": {"cluster.replicas": [1, 2]}}), "search.target: min_replicas varies cluster.replicas"),
    # one setting under two names: both paths named (a dict would keep one list and drop the other)
    (merged(sweep={"grid": {"engine.kv_dtype": "fp8", "engine.kv_cache_dtype": ["auto", "int8"]}}),
     "sweep.grid.engine.kv_cache_dtype: sets engine.kv_cache_dtype, which sweep.grid.engine.kv_dtype already sets"),
    (merged(engine__kv_dtype="fp8", engine__kv_cache_dtype="int8"),
     "engine.kv_cache_dtype: sets kv_cache_dtype, which engine.kv_dtype already sets"),
    (merged(engine__kv_dtype="fp9"), "engine.kv_dtype: unknown value 'fp9'"),
    # a search end is a value of the key it varies, with that key's bounds
    (merged(search={"target": "max_concurrency", "high": 10**12}, slo={"p99_ttft_ms": 1000}),
     "search.high: max_concurrency varies workload.concurrency, which must be an integer >= 1 and <= 100000"),
    (merged(search={"target": "min_replicas", "high": 10**5}, slo={"p99_ttft_ms": 1000}),
     "search.high: min_replicas varies cluster.replicas, which must be an integer >= 1 and <= 10000"),
    (merged(search={"target": "max_rate", "tolerance": 1e-300}, slo={"p99_ttft_ms": 1000}),
     "search.tolerance: must be a finite number >= 0.0001"),
    # sections of a component the experiment does not have
    (merged(search={"target": "min_replicas", "tolerance": 0.1}, slo={"p99_ttft_ms": 1000}),
     "search.tolerance: min_replicas bisects whole replicas"),
    (merged(workload__mode="burst", probe={"duration_s": 60}), "probe: shapes a steady-state probe"),
    (merged(probe={"max_unfinished_backlogged": 1.5}), "probe.max_unfinished_backlogged: must be a finite number"
                                                       " >= 0 and <= 1, got 1.5"),
    (merged(slo={"p95_ttft_ms": 100}), "slo.p95_ttft_ms: unknown key; did you mean"),
    (merged(slo={"attainment": {"fraction": 0.9}}), "slo.attainment: needs at least one per-request bound"),
    (merged(slo={"attainment": {"ttft_ms": 100, "fraction": 1.5}}), "slo.attainment.fraction: must be a finite"
                                                                    " number > 0 and <= 1"),
    (merged(objective={"metric": "p99_ttft"}), "objective.metric: unknown value 'p99_ttft'; did you mean"),
    (merged(seeds=[0, 0]), "seeds: lists a seed twice"),
    (merged(seeds=[0], repeats=2), "seeds: set seeds or repeats, not both"),
    (merged(name=DROP), "name: must be set"),
    # Caught when the points are built, before anything runs: named by point and key path.
    (merged(engine__block_size=48), "point 0 (base): engine.block_size: 48 neither divides nor is a multiple of the"
                                    " trace's prefix-hash granularity 512; allowed: 1, 2, 4, 8, 16, 32, 64, 128, 256"
                                    " (or engine.enable_prefix_caching: false)"),
    (merged(engine__allocator="max"), "point 0 (base): engine.enable_prefix_caching: not supported with the"
                                      " contiguous reservation allocator"),
    # an option of a component no point configures: named as written, with the value's index in its sweep
    (merged(sweep={"grid": {"engine.sink_tokens": [0, 4]}}),
     "sweep.grid.engine.sink_tokens[1]: needs a sliding window (none configured); allowed: "
     "engine.window_tokens > 0"),
]


@pytest.mark.parametrize("doc,expected", BROKEN, ids=[e.split(":")[0] for _, e in BROKEN])
def test_a_broken_file_names_the_key_path(tmp_path, doc, expected):
    path = write(tmp_path, doc)
    with pytest.raises(SchemaError) as info:
        load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and expected in message, message
    assert "\n" not in message


def test_trace_reading_options_reach_the_loader(tmp_path):
    """A Mooncake-layout file of 16-token hashes is refused, with the suggestion, until workload.hash_granularity
    says so; a BurstGPT file's failed requests are kept with workload.keep_failed."""
    from tests.traces.trace_fixtures import BURSTGPT_FAILED, MOONCAKE_16, write_jsonl, write_text

    write_jsonl(tmp_path, "m16.jsonl", MOONCAKE_16)
    doc = {**BASE, "workload": {"trace": "m16.jsonl"}}
    with pytest.raises(SchemaError, match=r"point 0 \(base\): .*m16.jsonl:1: 7 hash_ids for 100 prompt tokens.*"
                                          r"--hash-granularity 16"):
        load(write(tmp_path, doc))
    doc["workload"]["hash_granularity"] = 16
    assert load(write(tmp_path, doc))[1]
    from kvplan.experiments.execute import build_trace
    from kvplan.experiments.points import run_config

    _, points = load(write(tmp_path, doc))
    assert build_trace(run_config(points[0].config, 0)).hash_granularity == 16
    write_text(tmp_path, "burst.csv", BURSTGPT_FAILED)
    doc = {**BASE, "workload": {"trace": "burst.csv", "keep_failed": True}}
    _, points = load(write(tmp_path, doc))
    assert len(build_trace(run_config(points[0].config, 0))) == 5


def test_the_cli_prints_one_line_and_exits_2(tmp_path, capsys):
    path = write(tmp_path, merged(engine__eviction_policy="lur"))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "engine.eviction_policy" in err and "allowed: fifo, lfu, lru, s3fifo" in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
    path.write_text("- name: a\n")  # a list, not a mapping
    assert main(["run", str(path), "--explain"]) == 2
    assert f"{path}: the experiment: must be a mapping with keys name, " in capsys.readouterr().err


def test_the_sweep_expands_grid_times_zip_in_a_stable_order(tmp_path):
    doc = merged(sweep={"grid": {"engine.block_size": [16, 32], "engine.eviction_policy": ["lru", "fifo"]},
                        "zip": {"engine.num_blocks": [4000, 8000], "cluster.replicas": [1, 2]}})
    exp, points = load(write(tmp_path, doc))
    assert len(points) == 8
    assert [p.label for p in points[:3]] == [
        "block_size=16 eviction_policy=lru num_blocks=4000 replicas=1",
        "block_size=16 eviction_policy=lru num_blocks=8000 replicas=2",
        "block_size=16 eviction_policy=fifo num_blocks=4000 replicas=1"]
    assert points[7].config["engine"]["block_size"] == 32 and points[7].config["cluster"]["replicas"] == 2
    assert exp.base["engine"]["block_size"] is None  # the base is never modified by a point (None: vLLM's default)
    assert [p.label for p in expand(exp)] == [p.label for p in points]


def test_explain_prints_the_resolved_points(tmp_path, capsys):
    path = write(tmp_path, merged(sweep={"grid": {"engine.block_size": [16, 32]}}, slo={"p99_ttft_ms": 500},
                                  search={"target": "max_rate"}))
    assert main(["run", str(path), "--explain"]) == 0
    out = capsys.readouterr().out
    assert "2 point(s)" in out and "search max_rate over [0.25, 256]" in out and "block_size=32" in out
    assert "p99_ttft_ms <= 500" in out
