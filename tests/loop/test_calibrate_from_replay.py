"""`kvplan calibrate --from-replay`: a replay directory written by hand from a known cost model (a continuous-
batching server simulated in numpy) must give back that model's coefficients; the CLI round trip feeds
`kvplan simulate`; bad input exits 2 with one line that names the file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from kvplan.calibration.from_replay import calibrate_from_replay
from kvplan.cli import main
from kvplan.results.request_table import RequestLog
from kvplan.sim.cost.calibrated import COEFFICIENTS, load_profile
from kvplan.traces import Trace
from kvplan.traces.io import render
from tests.core.test_no_torch import BLOCK_TORCH

MODEL = "llama-100m"  # the model a fitted profile prices: calibrate --from-replay takes a model simulate knows

TRUTH = {"step": 0.02, "prefill_tokens": 1e-4, "decode_context": 2e-6, "decode_requests": 1e-3}
SERVED = {"block_size": "16", "num_gpu_blocks": "4096", "enable_prefix_caching": "True"}


def serve(seed: int, requests: int = 150) -> tuple[dict, list[list[float]]]:
    """A continuous-batching server: every step decodes all running sequences and admits up to two waiting
    requests (their whole uncached prompt); the step lasts TRUTH · features, and its tokens are stamped at its
    end. Requests arrive in a Poisson stream, so the server is sometimes idle and sometimes queues."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(0.12, requests))
    prompt = rng.integers(16, 300, requests)
    output = rng.integers(2, 30, requests)
    cached = np.minimum(rng.choice([0, 16, 32], requests), prompt - 1)
    times: list[list[float]] = [[] for _ in range(requests)]
    running: list[int] = []  # requests decoding; token k of request r comes next with k = len(times[r])
    now, waiting = 0.0, 0
    while waiting < requests or running:
        if not running and arrival[waiting] > now:
            now = float(arrival[waiting])  # idle until the next arrival
        admitted = []
        while waiting < requests and arrival[waiting] <= now and len(admitted) < 2:
            admitted.append(waiting)
            waiting += 1
        context = sum(int(prompt[r]) + len(times[r]) for r in running)  # token k attends prompt + k
        now += (TRUTH["step"] + TRUTH["prefill_tokens"] * sum(int(prompt[r] - cached[r]) for r in admitted)
                + TRUTH["decode_requests"] * len(running) + TRUTH["decode_context"] * context)
        for r in running + admitted:
            times[r].append(now)
        running = [r for r in running + admitted if len(times[r]) < output[r]]
    columns = {"arrival": arrival, "prompt": prompt, "output": output, "cached": cached}
    return columns, times


def write_replay(out, columns: dict, times: list[list[float]], *, jitter_s: float = 0.0, seed: int = 0,
                 cache_config: dict | None = None):
    """The files `kvplan replay --endpoint` writes (the columns and lines calibrate reads, in its format)."""
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    table, lines = RequestLog(), []
    for r, stamps in enumerate(times):
        # The client reads each token a little after the server wrote it: a delay >= 0, in order per stream.
        seen = np.maximum.accumulate(np.asarray(stamps) + rng.exponential(jitter_s, len(stamps)))
        table.add(r, 0, 0, columns["arrival"][r], columns["arrival"][r], seen[0], seen[-1], columns["prompt"][r],
                  len(seen), columns["cached"][r], 0, float(np.diff(seen).max(initial=0.0)))
        lines.append(json.dumps({"row": r, "sample": 0, "times_s": seen.tolist(), "token_ids": None}))
    table.to_frame(np.arange(len(times))).to_parquet(out / "requests.parquet", index=False)
    (out / "tokens.jsonl").write_text("".join(f"{line}\n" for line in lines))
    (out / "failed.jsonl").write_text("")
    (out / "endpoint.json").write_text(json.dumps({"url": "http://synthetic:8000", "model": None,
                                                   "cache_config": SERVED if cache_config is None else cache_config,
                                                   "server_counters": {}}))
    return out


@pytest.fixture(scope="module")
def served():
    return serve(seed=11)


def test_exact_stamps_give_back_the_coefficients(served, tmp_path):
    result = calibrate_from_replay(write_replay(tmp_path / "r", *served), seed=0)
    cost = result.calibration.cost
    fit = cost.meta["fit"]
    for name in COEFFICIENTS:
        truth = TRUTH.get(name, 0.0)
        if name not in fit["unidentified"]:
            assert cost.coefficients[name] == pytest.approx(truth, rel=0.01, abs=1e-12), name
    # A black box sees every row sample a token, so `sampled` is `request` again; transfers are never seen.
    assert {"sampled", "swap_seconds_per_block", "copy_seconds_per_block"} <= set(fit["unidentified"])
    assert not set(TRUTH) & set(fit["unidentified"])
    assert cost.kv_capacity_blocks == 4096 and fit["kv_capacity_source"].startswith("server")
    assert fit["steps"] >= 0.8 * fit["token_clusters"]  # only steps after idle (and the first) are dropped
    assert fit["heldout_median_abs_error_pct"] < 1e-6


def test_jittered_stamps_within_a_few_percent(served, tmp_path):
    result = calibrate_from_replay(write_replay(tmp_path / "r", *served, jitter_s=3e-4, seed=2), seed=1)
    cost = result.calibration.cost
    for name, truth in TRUTH.items():
        assert cost.coefficients[name] == pytest.approx(truth, rel=0.05), name
    assert cost.meta["fit"]["heldout_median_abs_error_pct"] < 2.0


def test_stalled_streams_drop_their_steps_not_the_fit(served, tmp_path):
    """Streams that stall and flush five tokens at once, and streams read so late in one step that their token
    looks like a step of its own (both beside other streams, which a client can check them against): those
    steps are dropped, and every step kept is then exactly the model's."""
    columns, times = served
    width = Counter(t for stamps in times for t in stamps)  # sequences per step
    times = [list(t) for t in times]
    hit = [r for r, t in enumerate(times) if len(t) >= 12 and min(width[s] for s in t[3:8]) >= 2]
    for r in hit[::2]:
        times[r][3:8] = [times[r][7]] * 5
    for r in hit[1::2]:
        times[r][5] += 0.5 * (times[r][6] - times[r][5])  # over the gap threshold, still before token 6
    assert len(hit) >= 40
    cal = calibrate_from_replay(write_replay(tmp_path / "r", columns, times, cache_config={}), seed=0).calibration
    assert np.abs(cal.predicted / cal.measured - 1).max() < 1e-9
    for name, truth in TRUTH.items():
        assert cal.cost.coefficients[name] == pytest.approx(truth, rel=1e-6), name
    fit = cal.cost.meta["fit"]
    assert fit["steps"] < 0.6 * fit["token_clusters"]
    assert cal.cost.kv_capacity_blocks is None and "kv_capacity_blocks" in fit["unidentified"]


def test_cli_round_trip_and_simulate(served, tmp_path, capsys):
    columns, times = served
    replay = write_replay(tmp_path / "replay", columns, times, jitter_s=1e-4)
    profile = tmp_path / "p.yaml"
    assert main(["calibrate", "--from-replay", str(replay), "--model", "llama-100m", "--out", str(profile)]) == 0
    text = capsys.readouterr().out
    assert "unidentified" in text and "sampled" in text and "decode" in text
    cost = load_profile(profile)
    assert cost.meta["model"] == "llama-100m" and cost.meta["block_size"] == 16
    assert cost.meta["provenance"]["source"] == f"endpoint replay {replay} (url http://synthetic:8000)"
    assert "torch" not in cost.meta["provenance"] and profile.with_suffix(".png").stat().st_size > 0
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(render(Trace.build(columns["arrival"], columns["prompt"], columns["output"]), "jsonl"))
    assert main(["simulate", "--trace", str(trace), "--model", "llama-100m", "--cost", "calibrated", "--profile",
                 str(profile), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["completed"] == len(times)
    assert main(["calibrate", "--from-replay", str(replay), "--model", MODEL, "--out", str(profile), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["coefficients"]["step"] > 0 and "sampled" in doc["fit"]["unidentified"] and doc["residuals"]


def test_runs_without_torch(served, tmp_path):
    replay = write_replay(tmp_path / "replay", *served)
    code = (f"from kvplan.cli import main\nassert main(['calibrate', '--from-replay', {str(replay)!r}, '--model', "
            f"{MODEL!r}, '--out', {str(tmp_path / 'p.yaml')!r}, '--json']) == 0\nassert sys.modules['torch'] is None\n")
    result = subprocess.run([sys.executable, "-c", BLOCK_TORCH + code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _bad_inputs(tmp_path, served) -> list[tuple[str, object, str]]:
    good = write_replay(tmp_path / "good", *served)
    cases = [("missing", tmp_path / "nope", r"nope: not a directory")]
    (tmp_path / "engine-replay").mkdir()
    cases.append(("not a replay", tmp_path / "engine-replay", r"endpoint\.json: missing"))
    broken = write_replay(tmp_path / "broken", *served)
    lines = (broken / "tokens.jsonl").read_text().splitlines()
    (broken / "tokens.jsonl").write_text("\n".join([lines[0], '{"row": 1, "times_s": [0.1]}', *lines[2:]]) + "\n")
    cases.append(("malformed line", broken, r"tokens\.jsonl:2: not a token-times line"))
    few = write_replay(tmp_path / "few", *serve(seed=3, requests=3))
    cases.append(("too few steps", few, r"tokens\.jsonl: only \d+ busy engine steps"))
    unordered = write_replay(tmp_path / "unordered", *served)
    (unordered / "tokens.jsonl").write_text('{"row": 0, "sample": 0, "times_s": [2.0, 1.0]}\n')
    cases.append(("times out of order", unordered, r"tokens\.jsonl:1: times_s"))
    # Python's json reads Infinity, NaN and 1e400 (as inf); int() makes 16.7 into 16 and true into 1: each of
    # these is a strict-JSON or exact-integer error naming the file, in every file of the replay
    for name, text, pattern in (
            ("row Infinity", '{"row": Infinity, "sample": 0, "times_s": [0.1]}', r"tokens\.jsonl:1: .*Infinity"),
            ("times NaN", '{"row": 0, "sample": 0, "times_s": [NaN]}', r"tokens\.jsonl:1: .*NaN"),
            ("row 1e400", '{"row": 1e400, "sample": 0, "times_s": [0.1]}', r"tokens\.jsonl:1: .*beyond float64"),
            ("row 0.5", '{"row": 0.5, "sample": 0, "times_s": [0.1]}', r"tokens\.jsonl:1: .*0\.5 is not an integer"),
            ("sample true", '{"row": 0, "sample": true, "times_s": [0.1]}', r"tokens\.jsonl:1: .*is a boolean")):
        bad = write_replay(tmp_path / name.replace(" ", "-"), *served)
        (bad / "tokens.jsonl").write_text(text + "\n")
        cases.append((name, bad, pattern))
    for name, cache, pattern in (("block 16.7", '{"block_size": 16.7}', r"block_size: 16\.7 is not an integer"),
                                 ("block true", '{"block_size": true}', r"block_size: True is a boolean"),
                                 ("blocks Infinity", '{"num_gpu_blocks": Infinity}', r"endpoint\.json: .*Infinity")):
        bad = write_replay(tmp_path / name.replace(" ", "-"), *served)
        (bad / "endpoint.json").write_text('{"cache_config": ' + cache + ', "server_counters": {}}')
        cases.append((name, bad, pattern))
    (good / "endpoint.json").write_text('{"cache_config": {"block_size": "sixteen"}}')
    cases.append(("bad cache_config", good, r"endpoint\.json: cache_config\.block_size"))
    return cases


def test_bad_input_exits_2_with_one_line_naming_the_file(served, tmp_path, capsys):
    for what, directory, pattern in _bad_inputs(tmp_path, served):
        code = main(["calibrate", "--from-replay", str(directory), "--model", MODEL, "--out", str(tmp_path / "p.yaml")])
        err = capsys.readouterr().err
        assert code == 2, what
        assert err.count("\n") == 1 and err.startswith("kvplan calibrate: error: "), (what, err)
        assert re.search(pattern, err), (what, err)
    assert not (tmp_path / "p.yaml").exists()
    assert main(["calibrate", "--from-replay", str(tmp_path / "good"), "--model", MODEL, "--out",
                 str(tmp_path / "p.yaml"), "--steps-out", str(tmp_path / "s.jsonl")]) == 2
    assert "--steps-out" in capsys.readouterr().err


def test_a_fit_that_prices_prompts_at_zero_says_so():
    from kvplan.calibration.from_replay import _warnings

    unpriced = _warnings({}, np.zeros(3), {"prefill_tokens": 0.0, "prefill_attention": 0.0},
                         ["decode", "mixed", "decode", "prefill"])
    assert unpriced["warnings"] == ["prompt tokens are priced at 0: only 2 of 4 busy steps carried a prefill, too "
                                    "few for the robust fit; replay a trace with more (or longer) prompts"]
    assert _warnings({}, np.zeros(3), {"prefill_tokens": 1e-3, "prefill_attention": 0.0}, ["mixed"]) == {}
