"""`kvplan validate` against a live prefill/decode pair (two processes, the real transport): the P/D simulator priced
by each instance's recorded steps and the pair's recorded handoffs gives every request the live timeline; a
simulator configured otherwise is caught, naming the instance and the step; the CLI writes its report and strict
JSON; what the pair cannot be is refused in one line; a killed instance fails the run, never hangs."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import replace

import numpy as np
import pytest

from kvplan.cli import main
from kvplan.commands.validate_pd import check_pair
from kvplan.live import EngineOptions
from kvplan.live_pd import PairFailed, run_pair
from kvplan.sim.cost.recorded import read_step_profile
from kvplan.strict_json import loads
from kvplan.traces import Trace
from kvplan.traces.io import render
from kvplan.traces.synth import synthesize

pytestmark = pytest.mark.slow

OPTIONS = EngineOptions(block_size=8, num_blocks=40, dtype="float32", max_num_batched_tokens=64, max_model_len=320)
# A burst and a trickle: requests queue behind busy steps on both instances; two system prompts share prefixes. At
# 120 req/s some always arrive while an instance computes a step (at 40 req/s an unloaded run sometimes had none).
SPEC = {"seed": 3, "requests": 14, "arrivals": {"process": "poisson", "rate": 120},
        "lengths": {"prompt": {"dist": "lognormal", "median": 40, "sigma": 0.7, "max": 160},
                    "output": {"dist": "lognormal", "median": 8, "sigma": 0.6, "max": 24}},
        "prefix": {"granularity": 16, "system_prompts": {"count": 2, "tokens": {"dist": "uniform", "min": 32,
                                                                                 "max": 64}, "zipf": 1.0}}}
ENGINE_FLAGS = ["--block-size", "8", "--num-blocks", "40", "--dtype", "float32", "--max-num-batched-tokens", "64",
                "--max-model-len", "320"]


@pytest.fixture(scope="module")
def pair(tiny_models, tmp_path_factory):
    trace = synthesize(SPEC)
    return trace, run_pair(tiny_models["tiny-llama"], trace, OPTIONS, tmp_path_factory.mktemp("pair"))


def during_a_step(arrivals: dict[int, float], steps_path: str) -> int:
    """How many requests reached an instance while it was computing a step."""
    steps = read_step_profile(steps_path)[1]
    return sum(any(s.start_s < t < s.end_s for s in steps) for t in arrivals.values())  # type: ignore[operator]


def test_the_simulator_reproduces_the_live_pair_exactly(pair):
    trace, run = pair
    checks, timeline = check_pair(trace, OPTIONS, run)
    assert [c["instance"] for c in checks] == ["prefill", "decode"]
    for c in checks:
        assert c["identical"], c["differences"]
        assert c["sequences"] == len(trace) and c["live_counters"] == c["sim_counters"]
    assert timeline["identical"] and timeline["requests"] == len(trace), timeline["differences"]
    # what made it a test: shared prefixes hit, and requests reached each instance in the middle of a step
    assert checks[0]["live_counters"]["prefix_cache_hits"] > 0
    assert during_a_step(run.prefill.arrived_s, run.prefill.steps_path) > 0
    assert during_a_step(run.decode.arrived_s, run.decode.steps_path) > 0
    assert len(run.decode.pull_s) == len(trace) and all(a <= b for a, b in run.decode.pull_s.values())


def test_a_simulator_configured_otherwise_is_caught_naming_the_instance_and_step(pair):
    trace, run = pair
    checks, timeline = check_pair(trace, OPTIONS, run, sim_options=replace(OPTIONS, max_num_seqs=2))
    assert not any(c["identical"] for c in checks) and not timeline["identical"]
    first = next(d for c in checks for d in c["differences"] if "not compared" not in d)
    assert " instance: " in first and "step " in first and "differs" in first


def test_the_cli_writes_the_report_and_strict_json(tiny_models, tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_bytes(render(synthesize({**SPEC, "requests": 6}), "jsonl"))
    out = tmp_path / "v"
    assert main(["validate", "--trace", str(path), "--model", tiny_models["tiny-llama"], "--prefill-replicas", "1",
                 "--decode-replicas", "1", "--out", str(out), "--repeats", "1", "--mode", "policy",
                 *ENGINE_FLAGS]) == 0
    text = capsys.readouterr().out
    assert "P/D validation: 1 prefill + 1 decode" in text and "prefill instance): 6 sequences, token times identical" \
        in text and "timeline (live run 1)" in text
    doc = loads((out / "validation.json").read_bytes())  # strict: NaN or Infinity would fail here
    assert doc["kind"] == "pd" and all(p["identical"] for p in doc["configs"][0]["policy"])
    assert doc["configs"][0]["link"]["pulls"] == 6
    assert "live prefill/decode pair" in (out / "report.md").read_text()
    for name in ("prefill.steps.jsonl", "decode.steps.jsonl", "pair.json", "requests.parquet"):
        assert (out / "default" / "live-1" / name).is_file()
    record = json.loads((out / "default" / "live-1" / "pair.json").read_text())
    assert len(record["requests"]) == 6 and all(r["pull_ended_s"] >= r["pull_began_s"] for r in record["requests"])


@pytest.mark.parametrize(("flags", "message"), [
    (["--endpoint", "http://127.0.0.1:9"], "--endpoint: the P/D flags validate kvplan's own live pair"),
    (["--prefill-replicas", "2"], "--prefill-replicas/--decode-replicas: 2 x 1; allowed: 1 x 1"),
    (["--kv-link-bandwidth", "1e9"], "--kv-link-bandwidth: the live pair runs on this machine"),
    (["--window-tokens", "32"], "--window-tokens: a sink+window cache"),
])
def test_what_the_pair_cannot_be_is_refused_in_one_line(tiny_models, tmp_path, capsys, flags, message):
    path = tmp_path / "t.jsonl"
    path.write_bytes(render(Trace.build(np.array([0.0]), np.array([8]), np.array([2])), "jsonl"))
    given = ["--prefill-replicas", "1", "--decode-replicas", "1"]
    if "--prefill-replicas" in flags:
        given = ["--decode-replicas", "1"]
    code = main(["validate", "--trace", str(path), "--model", tiny_models["tiny-llama"], "--out",
                 str(tmp_path / "v"), "--mode", "policy", *given, *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "v").exists()


@pytest.mark.parametrize(("sig", "message"), [
    (signal.SIGKILL, r"the decode instance \(pid \d+\) exited with code -9 before it finished"),
    (signal.SIGSTOP, r"stalled: nothing from either instance for 5 s|the prefill instance failed: RuntimeError: "
                     r"waited 5 s for a request or a KV transfer|did not load within 30 s"),
], ids=["killed", "stopped"])
def test_a_dead_or_stalled_instance_fails_the_run_and_nothing_hangs(tiny_models, tmp_path, sig, message):
    n = 40  # arrivals over ~4 s: the decode instance dies or stops while it serves them
    trace = Trace.build(np.linspace(0.0, 4.0, n), np.full(n, 24), np.full(n, 8))

    def signal_decode() -> None:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            for child in multiprocessing.active_children():
                if child.name == "kvplan-pd-decode" and child.pid is not None:
                    time.sleep(6.0)  # loaded and serving (a load takes a few seconds here)
                    os.kill(child.pid, sig)
                    return
            time.sleep(0.05)

    threading.Thread(target=signal_decode, daemon=True).start()
    start = time.monotonic()
    with pytest.raises(PairFailed, match=message):
        run_pair(tiny_models["tiny-llama"], trace, OPTIONS, tmp_path, stall_s=5, transfer_timeout_s=5, load_s=30)
    assert time.monotonic() - start < 90
