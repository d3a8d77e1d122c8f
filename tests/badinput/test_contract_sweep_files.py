"""The contract sweep over files: every key of the experiment schema's tables (an unknown key at every level,
bad values for each), experiment structure (sweeps, searches, seeds, traces, --out, --resume), every key of a
calibrated profile and of a `validate --configs` entry. The check is tests/badinput/contract.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvplan.cli import main
from kvplan.experiments import schema
from tests.badinput.contract import SAMPLE, refused

# -- experiments: every key of the schema's tables ---------------------------------------------------------------
BASE = {"name": "t", "model": "llama-3-8b", "hardware": "a100-40gb", "workload": {"trace": "sample:chat"}}
SECTIONS = {"engine": schema.ENGINE, "cluster": schema.CLUSTER, "probe": schema.PROBE, "search": schema.SEARCH,
            "objective": schema.OBJECTIVE, "outputs": schema.OUTPUTS, "slo.attainment": schema.ATTAINMENT,
            "workload": {**schema.TRACE_LOAD, **schema.LOAD}}
MAPPINGS = ["", "engine", "cluster", "workload", "workload.transforms", "probe", "sweep", "search", "slo",
            "slo.attainment", "objective", "outputs"]


def _with(doc: dict, dotted: str, value: object) -> dict:
    """`doc` with `dotted` (a.b.c) set to value, creating mappings on the way."""
    out = yaml.safe_load(yaml.safe_dump(doc))
    *parents, last = dotted.split(".")
    node = out
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return out


def _run_refused(capsys, tmp_path: Path, doc: dict, *where: str, extra: tuple[str, ...] = ("--explain",)) -> str:
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump(doc))
    return refused(capsys, ["run", str(path), *extra], *where, tmp=tmp_path)


@pytest.mark.parametrize("mapping", MAPPINGS)
def test_an_unknown_key_is_refused_at_every_level(capsys, tmp_path, mapping):
    dotted = f"{mapping}.no_such_key" if mapping else "no_such_key"
    doc = _with(BASE, dotted, 1)
    if mapping == "search":  # a search section needs its target to be read at all
        doc["search"]["target"] = "max_rate"
    _run_refused(capsys, tmp_path, doc, "no_such_key")


def _field_cases():
    for section, table in SECTIONS.items():
        for key, field in table.items():
            bad: list[object] = {"int": [float("nan"), float("inf"), True, "abc", 1.5],
                                 "float": [float("nan"), float("inf"), -float("inf"), True, "abc"],
                                 "bool": [1, "abc", None], "choice": ["bogus", 3],
                                 "str": [[1, 2]]}.get(field.kind, [])
            if field.kind in ("int", "float") and field.maximum is not None:
                bad.append(field.maximum * 10 + 1)
            if field.kind in ("int", "float") and field.minimum is not None:
                bad.append(field.minimum - 1)
            if not field.nullable and field.kind != "bool":
                bad.append(None)
            yield pytest.param(f"{section}.{key}", bad, id=f"{section}.{key}")


@pytest.mark.parametrize(("dotted", "values"), list(_field_cases()))
def test_every_experiment_key_refuses_bad_values(capsys, tmp_path, dotted, values):
    for value in values:
        doc = _with(BASE, dotted, value)
        if dotted.startswith("search.") and dotted != "search.target":
            doc["search"]["target"] = "max_rate"
        _run_refused(capsys, tmp_path, doc, dotted.split(".", 1)[1] if dotted.startswith("workload") else dotted)


@pytest.mark.parametrize(("change", "where"), [
    ({"sweep": {"grid": {}}}, "sweep"),
    ({"sweep": {"grid": {"engine.block_size": []}}}, "engine.block_size"),
    ({"sweep": {"zip": {"engine.block_size": [8, 16], "cluster.replicas": [1]}}}, "sweep.zip"),
    ({"sweep": {"grid": {"engine.num_blocks": list(range(1, 201)), "cluster.replicas": list(range(1, 101))}}},
     "10000"),
    ({"sweep": {"grid": {"engine.no_such": [1, 2]}}}, "engine.no_such"),
    ({"search": {"target": "max_rate", "low": 10, "high": 1}}, "search"),
    ({"search": {"target": "max_rate", "low": float("nan")}}, "search.low"),
    ({"search": {"target": "no_such"}}, "search.target"),
    ({"seeds": []}, "seeds"),
    ({"seeds": [2**64]}, "seeds"),
    ({"repeats": 0}, "repeats"),
    ({"workload": {"trace": "no-such.jsonl"}}, "no-such.jsonl"),
    ({"workload": {"trace": "sample:no_such"}}, "no_such"),
    ({"workload": {}}, "workload"),
    ({"workload": {"trace": "sample:chat", "synthetic": {"requests": 10}}}, "workload"),
    ({"workload": {"trace": "sample:chat", "transforms": {"jitter": float("inf")}}}, "jitter"),
    ({"slo": {"p99_ttft_ms": -1}}, "slo.p99_ttft_ms"),
    ({"name": "../escape"}, "name"),
    ({"name": "x" * 5000}, "name"),
], ids=lambda v: str(v)[:60] if not isinstance(v, str) else v)
def test_experiment_structure_is_refused_naming_the_key(capsys, tmp_path, change, where):
    _run_refused(capsys, tmp_path, {**BASE, **change}, where)


def test_an_experiment_trace_that_is_binary_names_the_file(capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(bytes(range(256)) * 8)
    _run_refused(capsys, tmp_path, {**BASE, "workload": {"trace": str(trace)}}, "t.jsonl")


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_run_out_that_cannot_be_a_directory_is_refused(capsys, tmp_path, where):
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    out = blocker if where == "a file" else blocker / "sub"
    _run_refused(capsys, tmp_path, BASE, "--out", str(out), extra=("--out", str(out)))
    assert blocker.read_text() == "mine"


def test_resume_into_another_experiments_set_is_refused(capsys, tmp_path):
    out = tmp_path / "out"
    first = tmp_path / "a.yaml"
    first.write_text(yaml.safe_dump({**BASE, "name": "first", "outputs": {"plots": False, "report": False},
                                     "probe": {"duration_s": 5, "min_requests": 10}}))
    assert main(["run", str(first), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    _run_refused(capsys, tmp_path, {**BASE, "name": "second"}, "--resume", "first",
                 extra=("--out", str(out), "--resume"))


# -- calibrated profiles, validate --configs entries -------------------------------------------------------------
PROFILE = {"model": "llama-100m", "device": "cpu-local", "block_size": 16, "block_sizes": [8, 16, 32],
           "kv_capacity_blocks": 341, "coefficients": {"step": 0.03, "request": 0.005, "prefill_tokens": 0.004,
                                                       "decode_requests": 0.002},
           "swap_seconds_per_block": 0.0004, "copy_seconds_per_block": 0.0}


def _profile_cases():
    for key in [*PROFILE, *(f"coefficients.{c}" for c in PROFILE["coefficients"])]:
        for value in (float("nan"), float("inf"), -1, True, "abc", [1], 10**30):
            if (key in ("model", "device") and value == "abc") or (key == "block_sizes" and value == [1]):
                continue  # a free name; a list of block sizes
            yield pytest.param(key, value, id=f"{key}={value}")


@pytest.mark.parametrize(("key", "value"), list(_profile_cases()))
def test_every_profile_key_refuses_bad_values(capsys, tmp_path, key, value):
    doc = _with(PROFILE, key, value)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    refused(capsys, ["simulate", "--trace", SAMPLE, "--model", "llama-100m", "--cost", "calibrated",
                     "--profile", str(path)], key.split(".")[-1], tmp=tmp_path)


def test_a_profile_with_the_analytic_cost_is_refused_not_ignored(capsys, tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(PROFILE))
    line = refused(capsys, ["simulate", "--trace", SAMPLE, "--profile", str(path)], "--profile", tmp=tmp_path)
    assert "--cost calibrated" in line


CONFIG_ENTRY_BAD = {"block_size": [0, -1, 1.5, True, "abc", float("nan"), 10**12], "num_blocks": [0, 10**12, True],
                    "dtype": ["float7", 3], "kv_cache_dtype": ["fp3"], "max_num_seqs": [0, float("inf")],
                    "no_such_key": [1], "name": ["../x", "a/b", "", "x" * 5000]}


@pytest.mark.parametrize(("key", "value"), [(k, v) for k, vs in CONFIG_ENTRY_BAD.items() for v in vs],
                         ids=lambda v: str(v)[:30])
def test_every_validate_config_entry_refuses_bad_values(capsys, tmp_path, key, value):
    entry = {"name": "a", key: value}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump([entry]))
    refused(capsys, ["validate", "--model", "tiny-llama", "--mode", "policy", "--trace", SAMPLE, "--configs",
                     str(path), "--out", str(tmp_path / "out")], key, "c.yaml", tmp=tmp_path)


