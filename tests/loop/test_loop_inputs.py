"""Inputs of the calibrate/replay/validate loop: step profiles, recorded costs, config lists, sizes, shipped
profiles, and the atomic result directory. (The live runs themselves are in tests/engine/test_replay_validate.py.)"""

from __future__ import annotations

import argparse
import json

import pytest

from kvplan.cli import main
from kvplan.engine.options import EngineOptions
from kvplan.engine_args import load_configs, parse_bytes
from kvplan.output import atomic_dir
from kvplan.sim.cost.recorded import RecordedCost, read_step_profile
from kvplan.sim.run import build_cost, simulate
from kvplan.sim.spec import SimSpec
from kvplan.traces.io import render
from tests.sim.helpers import random_trace

META = {"meta": {"model": "m", "block_size": 16, "num_blocks": 40}}
STEP = {"step": 0, "block_size": 16, "items": [["0", 5, 0, False, True]], "num_batched_tokens": 5, "num_copies": 0,
        "num_swap_out": 0, "num_swap_in": 0, "times_s": {"forward": 0.01}, "wall_s": 0.01}


def write_lines(path, *records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_step_profile_errors_name_the_file_and_line(tmp_path):
    path = write_lines(tmp_path / "s.jsonl", META, STEP, {"step": 1})
    with pytest.raises(ValueError, match=r"s\.jsonl:3: not a step record"):
        read_step_profile(path)
    with pytest.raises(ValueError, match=r"s\.jsonl:1: not a \{'meta'"):
        read_step_profile(write_lines(tmp_path / "s.jsonl", STEP))
    # strict JSON and exact numbers: Infinity, a fractional count or a string flag is the line's error
    for bad in ('{"wall_s": Infinity}', '{"num_copies": 1.5}', '{"items": [["0", 5, 0, "no", true]]}',
                '{"step": true}', '{"wall_s": -1}'):
        (tmp_path / "s.jsonl").write_text(json.dumps(META) + "\n" + json.dumps(STEP)[:-1] + ", "
                                          + bad[1:] + "\n")
        with pytest.raises(ValueError, match=r"s\.jsonl:2: not a step record"):
            read_step_profile(tmp_path / "s.jsonl")
    meta, steps = read_step_profile(write_lines(tmp_path / "s.jsonl", META, STEP))
    assert meta["num_blocks"] == 40 and steps[0].items[0].num_new_tokens == 5
    with pytest.raises(ValueError, match="not the step profile of a live replay"):
        RecordedCost(steps, "s.jsonl")  # a calibration profile has no start_s/end_s


def test_recorded_cost_refuses_another_block_size_and_another_schedule(tmp_path, capsys):
    trace = random_trace(1, 6)
    path = write_lines(tmp_path / "s.jsonl", META, {**STEP, "start_s": 0.0, "end_s": 0.5})
    with pytest.raises(ValueError, match="--block-size: 8 differs from the recorded run's 16"):
        build_cost(SimSpec(cost="recorded", profile=path, block_size=8))
    trace_path = tmp_path / "t.jsonl"
    trace_path.write_bytes(render(trace, "jsonl"))
    code = main(["simulate", "--trace", str(trace_path), "--cost", "recorded", "--profile", path, "--model",
                 "llama-100m"])
    assert code == 2
    assert "step 0 differs" in capsys.readouterr().err
    with pytest.raises(ValueError, match="differs"):
        simulate(trace, SimSpec(model="llama-100m", cost="recorded", profile=path))


def test_cpu_local_uses_the_shipped_profile():
    cost, blocks = build_cost(SimSpec(model="llama-100m", hardware="cpu-local", block_size=32))
    assert cost.meta["device"] == "cpu-local" and blocks == cost.kv_capacity_blocks * 16 // 32  # measured at 16
    with pytest.raises(ValueError, match="no shipped profile for model 'llama-3-8b'; allowed: llama-100m, "
                                         "smollm2-135m"):
        build_cost(SimSpec(model="llama-3-8b", hardware="cpu-local"))


def test_sizes_and_config_lists(tmp_path):
    assert parse_bytes("64MiB") == 64 << 20 and parse_bytes("1e6") == 10**6 and parse_bytes("2 GB") == 2 * 10**9
    for bad in ("", "12 parsecs", "-3", "0"):
        with pytest.raises(argparse.ArgumentTypeError, match="size"):
            parse_bytes(bad)
    path = tmp_path / "c.yaml"
    path.write_text("- {name: a, block_size: 8, kv_cache_memory: 8MiB}\n- {name: b, schedule: prefill_first}\n")
    (a, opts_a), (b, opts_b) = load_configs(path, EngineOptions(block_size=16))
    assert (a, opts_a.block_size, opts_a.kv_cache_memory) == ("a", 8, 8 << 20)
    assert (b, opts_b.block_size, opts_b.schedule) == ("b", 16, "prefill_first")
    for text, match in (("{}", "a non-empty YAML list"), ("- {block_size: 8}", r"\[0\]: not a configuration"),
                        ("- {name: a}\n- {name: a}", r"\[1\]\.name: 'a' is used twice"),
                        ("- {name: a, blocksize: 8}", r"\[0\]\.blocksize: unknown option; allowed: name, block_size"),
                        ("- {name: a, enable_prefix_caching: 1}",
                         r"\[0\]\.enable_prefix_caching: must be true or false, got 1"),
                        ("- {name: a, kv_cache_memory: lots}", r"\[0\]\.kv_cache_memory: must be a size in bytes"),
                        ("- [unclosed", "not valid YAML")):
        path.write_text(text)
        with pytest.raises(ValueError, match=match):
            load_configs(path, EngineOptions())


def test_a_failed_run_leaves_the_previous_result_directory_whole(tmp_path):
    out = tmp_path / "result"
    with atomic_dir(out) as d:
        (d / "a.txt").write_text("old")
    with pytest.raises(RuntimeError), atomic_dir(out) as d:
        (d / "a.txt").write_text("new, half done")
        raise RuntimeError("crash")
    assert [p.name for p in tmp_path.iterdir()] == ["result"] and (out / "a.txt").read_text() == "old"
    with atomic_dir(out) as d:
        (d / "b.txt").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["b.txt", "manifest.json"]
