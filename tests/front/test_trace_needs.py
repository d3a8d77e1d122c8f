"""`kvplan run` warns in one line, before any run, when the experiment compares prefix caching, eviction or a
prefix tier but its workload carries no prefix hashes (the simulator shares blocks only through them)."""

from __future__ import annotations

import json

import pytest

from kvplan.cli import main
from tests.badinput.contract import SAMPLE

ROWS = 60


def trace(path, *, hashes: bool, sessions: bool):
    """A small kvplan-jsonl trace: 60 requests, 3 turns per session, a shared 2-block system prompt when hashed."""
    with open(path, "w") as f:
        for i in range(ROWS):
            row = {"request_id": i, "arrival_s": i * 0.5, "prompt_tokens": 64, "output_tokens": 16}
            if sessions:
                row |= {"session_id": i // 3, "turn": i % 3 + 1}
            if hashes:
                row |= {"hash_granularity": 16, "prefix_hashes": [0, 1, 100 + 2 * i, 101 + 2 * i]}
            f.write(json.dumps(row) + "\n")
    return path


def experiment(tmp_path, workload: str, sweep: str) -> str:
    path = tmp_path / "x.yaml"
    path.write_text(f"name: x\nmodel: llama-3-8b\nhardware: a100-40gb\nworkload: {workload}\nsweep: {sweep}\n"
                    "search: {target: max_rate, low: 0.5, high: 4}\nslo: {p99_ttft_ms: 1000}\n")
    return str(path)


def warnings(capsys, path: str) -> list[str]:
    assert main(["run", path, "--explain"]) == 0
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]


PREFIX = "{grid: {engine.enable_prefix_caching: [true, false]}}"


@pytest.mark.parametrize(("hashes", "sessions", "sweep", "says"), [
    (False, False, PREFIX, "compares engine.enable_prefix_caching, but workload.trace "
                           "{trace} has no prefix hashes (hash_ids / prefix_hashes) and no session ids"),
    (False, True, "{grid: {engine.eviction_policy: [lru, s3fifo]}}",
     "compares engine.eviction_policy, but workload.trace {trace} has no prefix hashes (hash_ids / "
     "prefix_hashes); its session ids alone share no KV block"),
    (False, False, "{grid: {engine.block_size: [16, 32]}, zip: {engine.kv_offloading_blocks: [100, 200]}}",
     "compares engine.kv_offloading_blocks, but"),
    (False, False, "{grid: {engine.block_size: [16, 32]}}", None),  # compares nothing prefix sharing moves
    (False, False, "{grid: {engine.enable_prefix_caching: [false]}}", None),  # one value: no comparison
    (True, False, PREFIX, None),
    (True, True, PREFIX, None),
])
def test_the_warning_names_what_is_missing(capsys, tmp_path, hashes, sessions, sweep, says):
    path = trace(tmp_path / "t.jsonl", hashes=hashes, sessions=sessions)
    found = warnings(capsys, experiment(tmp_path, f"{{trace: {path}}}", sweep))
    if says is None:
        assert found == []
        return
    assert len(found) == 1, found
    assert says.format(trace=path) in found[0]
    assert found[0].endswith("or workload.synthetic with a prefix: section (`kvplan trace synth --help`)")


def test_the_bundled_chat_sample_carries_its_prefixes(capsys, tmp_path):
    assert warnings(capsys, experiment(tmp_path, f"{{trace: {SAMPLE}}}", PREFIX)) == []


def test_a_synthetic_workload_without_a_prefix_section(capsys, tmp_path):
    synthetic = ("{synthetic: {requests: 60, arrivals: {process: poisson, rate: 2}, "
                 "lengths: {prompt: {dist: fixed, value: 64}, output: {dist: fixed, value: 16}}}}")
    found = warnings(capsys, experiment(tmp_path, synthetic, PREFIX))
    assert len(found) == 1 and "but workload.synthetic has no prefix: section" in found[0], found


def test_a_refused_file_still_says_one_line(capsys, tmp_path):
    """The warning comes after every point is checked: an error in a later point is the only line."""
    path = trace(tmp_path / "t.jsonl", hashes=False, sessions=False)
    bad = experiment(tmp_path, f"{{trace: {path}}}", "{grid: {engine.enable_prefix_caching: [true, false], "
                                                    "engine.num_blocks: [1]}}")
    assert main(["run", bad, "--explain"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "warning" not in err, err
