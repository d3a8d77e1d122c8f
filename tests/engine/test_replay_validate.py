"""The loop on a small case: live replay, the simulator priced by the replay's own steps (token times identical),
the calibrated profile from `kvplan calibrate`, and the `replay`/`validate` CLIs."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from kvplan.cli import main
from kvplan.errors import UserError
from kvplan.live import EngineOptions, replay, sample_interval, sim_spec
from kvplan.output import verify_result_set
from kvplan.sim.cost.calibrated import load_profile
from kvplan.sim.cost.recorded import PolicyDivergence, ProfiledItem, ProfiledStep
from kvplan.sim.run import simulate
from kvplan.traces import Trace
from kvplan.traces.io import render
from kvplan.traces.synth import synthesize
from kvplan.validation import policy_check

SHARED = {"seed": 3, "requests": 60, "arrivals": {"process": "poisson", "rate": 60},
          "lengths": {"prompt": {"dist": "lognormal", "median": 40, "sigma": 0.7, "max": 160},
                      "output": {"dist": "lognormal", "median": 14, "sigma": 0.6, "max": 60}},
          "prefix": {"granularity": 16, "system_prompts": {"count": 3, "tokens": {"dist": "uniform", "min": 32,
                                                                                   "max": 80}, "zipf": 1.0}}}
# The same requests arriving at once: every step finds them all queued, so which steps preempt, hit and move tier
# blocks does not depend on how fast this machine runs the model (spread arrivals met a loaded machine with no
# preemption at all).
BURST = {**SHARED, "arrivals": {"process": "poisson", "rate": 100_000}}


def sampling_trace() -> Trace:
    """Parallel sampling (n = 2, 3) beside plain requests: forks, copy-on-write, group preemption."""
    rng = np.random.default_rng(5)
    size = 24
    return Trace.build(np.sort(rng.uniform(0, 0.3, size)), rng.integers(5, 60, size), rng.integers(2, 30, size),
                       n=rng.choice([1, 1, 2, 3], size))


def run_both(model: str, trace: Trace, options: EngineOptions, tmp_path):
    steps = tmp_path / "steps.jsonl"
    live, meta = replay(model, trace, options, steps_path=steps)
    sim = simulate(trace, sim_spec(options, meta, cost="recorded", profile=str(steps),
                                   interval=sample_interval(trace), record_tokens=True))
    return live, sim, meta


@pytest.mark.parametrize("options,trace", [
    (EngineOptions(block_size=8, num_blocks=40, dtype="float32", max_num_batched_tokens=64, max_model_len=320),
     synthesize(BURST)),
    (EngineOptions(block_size=4, num_blocks=48, dtype="float32", max_num_batched_tokens=48, max_model_len=100,
                   preemption_mode="swap", schedule="prefill_first", enable_prefix_caching=False),
     sampling_trace()),
    (EngineOptions(block_size=8, num_blocks=40, dtype="float32", max_num_batched_tokens=64, max_model_len=320,
                   kv_offloading_blocks=48), synthesize(BURST)),
], ids=["recompute-prefix-sharing", "swap-parallel-sampling-prefill-first", "cpu-tier"])
def test_simulator_priced_by_the_live_steps_gives_identical_token_times(tiny_models, tmp_path, options, trace):
    live, sim, _ = run_both(tiny_models["tiny-llama"], trace, options, tmp_path)
    check = policy_check(live, sim)
    assert check.identical, check.differences
    assert check.sequences == int(trace.n.sum())
    assert live.summary["num_preemptions"] > 0  # memory pressure exercised preemption
    if options.enable_prefix_caching:
        assert live.summary["prefix_cache_hits"] > 0
    if options.kv_offloading_blocks:  # the tier moved blocks both ways; its counters are compared below
        assert live.summary["kv_offload_cpu_promotions"] > 0 and live.summary["kv_offload_cpu_demotions"] > 0
    for key, value in live.summary.items():
        if value is None:  # request_goodput without per-request bounds
            assert sim.summary[key] is None, key
            continue
        assert sim.summary[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key


def test_a_different_policy_is_caught_at_the_first_differing_step(tiny_models, tmp_path):
    options = EngineOptions(block_size=8, num_blocks=40, dtype="float32", max_num_batched_tokens=64,
                            max_model_len=320)
    trace = synthesize(SHARED)
    _, _, meta = run_both(tiny_models["tiny-llama"], trace, options, tmp_path)
    other = replace(options, max_num_batched_tokens=48)
    with pytest.raises(PolicyDivergence, match=r"step \d+ differs"):
        simulate(trace, sim_spec(other, meta, cost="recorded", profile=str(tmp_path / "steps.jsonl"),
                                 interval=sample_interval(trace)))


@pytest.mark.slow
def test_replay_and_validate_cli(tiny_models, tmp_path, capsys):
    trace_path = tmp_path / "trace.jsonl"
    trace_path.write_bytes(render(synthesize({**SHARED, "requests": 30}), "jsonl"))
    model = tiny_models["tiny-llama"]
    common = ["--model", model, "--trace", str(trace_path), "--dtype", "float32", "--block-size", "8",
              "--num-blocks", "40", "--max-num-batched-tokens", "64", "--max-model-len", "320"]
    assert main(["replay", *common, "--out", str(tmp_path / "live"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["completed"] == 30
    assert {p.name for p in (tmp_path / "live").iterdir()} == {"requests.parquet", "series.parquet", "summary.json",
                                                                "steps.jsonl", "engine.json", "manifest.json"}
    verify_result_set(tmp_path / "live")
    configs = tmp_path / "configs.yaml"
    configs.write_text("- {name: mixed}\n- {name: prefill-first, schedule: prefill_first, block_size: 16}\n"
                       "- {name: cpu-tier, kv_offloading_size: 0.001}\n")  # vLLM's GiB: the engine sizes the tier
    assert main(["validate", *common, "--mode", "policy", "--repeats", "1", "--configs", str(configs),
                 "--out", str(tmp_path / "val")]) == 0
    out = capsys.readouterr().out
    assert out.count("token times identical") == 3 and "DIFFERENT" not in out
    tier = out[out.index("== cpu-tier"):]  # the tier's counters, live and simulated, are compared and shown
    assert tier.count("kv_offload_cpu_demotions=") == 2 and "kv_offload_cpu_" not in out[:out.index("== cpu-tier")]
    report = (tmp_path / "val" / "report.md").read_text()
    assert "## prefill-first" in report and (tmp_path / "val" / "mixed" / "cdf.png").stat().st_size > 0
    configs.write_text("- {name: a, block_size: 0.5}\n")
    assert main(["validate", *common, "--mode", "policy", "--configs", str(configs), "--out",
                 str(tmp_path / "bad")]) == 2
    assert "[0].block_size: must be an integer >= 1 and <= 256, got 0.5" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_calibrate_cli_writes_a_profile_the_simulator_runs(tiny_models, tmp_path, capsys):
    profile = tmp_path / "tiny.yaml"
    assert main(["calibrate", "--model", tiny_models["tiny-llama"], "--dtype", "float32", "--block-sizes", "8",
                 "--phases", "prefill", "decode", "--out", str(profile)]) == 0
    out = capsys.readouterr().out
    assert "decode" in out and "coefficients (s)" in out
    assert profile.with_suffix(".png").stat().st_size > 0
    trace_path = tmp_path / "trace.jsonl"
    trace_path.write_bytes(render(synthesize(SHARED), "jsonl"))
    assert main(["simulate", "--trace", str(trace_path), "--model", tiny_models["tiny-llama"], "--cost",
                 "calibrated", "--profile", str(profile), "--block-size", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["completed"] == 60
    # Timing mode: a speed probe around the live run, and the comparison both as calibrated and speed-adjusted.
    assert main(["validate", "--trace", str(trace_path), "--model", tiny_models["tiny-llama"], "--profile",
                 str(profile), "--dtype", "float32", "--block-size", "8", "--mode", "timing", "--repeats", "1",
                 "--out", str(tmp_path / "val"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    speed = doc["configs"][0]["speed"]
    assert len(speed["probe_factors"]) == 2 and speed["factor"] > 0
    assert len(speed["in_run_factors"]) == 1 and speed["in_run_factor"] > 0
    for key in ("targets_speed_adjusted", "targets_in_run_speed"):
        assert {t["metric"] for t in doc[key]} == {t["metric"] for t in doc["targets"]}
    adjusted = load_profile(tmp_path / "val" / "default" / "profile-speed-adjusted.yaml")
    assert adjusted.coefficients["step"] == pytest.approx(load_profile(profile).coefficients["step"] * speed["factor"])
    assert "## Across configurations, profile scaled by the speed probe" in (tmp_path / "val" / "report.md").read_text()


@pytest.mark.slow
def test_the_speed_probe_prices_its_steps_as_the_simulator_does(tiny_models):
    from kvplan.calibration.probe import predicted_seconds, speed_probe
    from kvplan.sim.cost.calibrated import COEFFICIENTS, CalibratedCost
    from kvplan.sim.cost.features import step_features

    rng = np.random.default_rng(0)
    cost = CalibratedCost(dict(zip(COEFFICIENTS, rng.uniform(1e-5, 1e-3, len(COEFFICIENTS)), strict=True)),
                          swap_seconds_per_block=2e-4, copy_seconds_per_block=3e-5, meta={"block_size": 16})
    probe = speed_probe(tiny_models["tiny-llama"], cost, block_size=8, dtype="float32")
    assert probe.steps > 20 and probe.measured_s > 0
    slower = speed_probe(tiny_models["tiny-llama"], cost.scaled(2.0), block_size=8, dtype="float32")
    assert slower.predicted_s == pytest.approx(2 * probe.predicted_s)  # same fixed workload, twice the price
    # Independently: each step priced by the simulator's own path (features -> step_times + transfer_time).
    items = [ProfiledItem("a", 5, 0, False, True), ProfiledItem("b", 1, 40, True, True)]
    steps = [ProfiledStep(0, 8, items, 2, 1, 0.1)]
    expected = cost.step_times(step_features(steps[0].items, 8, 0)) + cost.transfer_time(2 * 8 / 16, 1 * 8 / 16)
    assert predicted_seconds(cost, steps)[0] == pytest.approx(expected)


def test_a_step_whose_prefix_tier_moves_differ_is_caught():
    """The same batch with other tier copies (the simulator promoting a block the live run recomputed) is a
    policy difference too: the step profile records each step's promoted and demoted blocks."""
    from kvplan.engine.core.outputs import ScheduledRequest, SchedulerOutput
    from kvplan.engine.core.request import make_request
    from kvplan.engine.core.tier_transfers import GPU, TierTransfer
    from kvplan.sim.cost.recorded import RecordedCost

    live = ProfiledStep(0, 8, [ProfiledItem("a", 5, 0, False, True)], 0, 0, 0.1, 0.0, 0.1, tier_moves=(0, 1))
    step = SchedulerOutput(0, [ScheduledRequest(make_request("a", prompt_token_ids=[1] * 5, max_tokens=1), 5, 0, 0,
                                                [0], True, False)])
    step.tier_transfers = [TierTransfer(GPU, 3, "cpu", 0)]
    assert RecordedCost([live]).recorded_step_time(step) == pytest.approx(0.1)
    step.tier_transfers.append(TierTransfer("cpu", 0, GPU, 4))
    step.promotions = [("cpu", 4)]
    with pytest.raises(PolicyDivergence, match=r"step 0 differs: the simulation promoted and demoted \(1, 1\) "
                                               r"prefix-tier blocks, the live run \(0, 1\)"):
        RecordedCost([live]).recorded_step_time(step)


def test_calibrate_lora_options_need_max_lora_rank(tmp_path, capsys):
    for extra, why in ((["--max-loras", "2"], "allowed: with --max-lora-rank"),
                       (["--profile", str(tmp_path / "base.yaml")], "allowed: with --max-lora-rank"),
                       (["--max-lora-rank", "4"], "max_lora_rank: 4 is not a rank vLLM serves; allowed: 1, 8")):
        assert main(["calibrate", "--model", "tiny-llama", *extra, "--out", str(tmp_path / "p.yaml")]) == 2
        assert why in capsys.readouterr().err


@pytest.mark.slow
def test_calibrate_adds_a_measured_lora_section_to_a_profile_keeping_its_fit(tmp_path):
    from kvplan.sim.cost.calibrated import CalibratedCost, save_profile

    base = tmp_path / "base.yaml"
    save_profile(CalibratedCost({"step": 0.01, "prefill_tokens": 1e-4}, 1e-4, 1e-5, 100,
                                {"model": "tiny-llama", "block_size": 16, "dtype": "float32"}), base)
    out = tmp_path / "lora.yaml"
    assert main(["calibrate", "--model", "tiny-llama", "--profile", str(base), "--max-lora-rank", "8",
                 "--max-loras", "2", "--out", str(out)]) == 0
    before, after = load_profile(base), load_profile(out)
    assert after.coefficients == before.coefficients and after.kv_capacity_blocks == 100
    lora = after.meta["lora"]
    assert lora["rank"] == 8 and lora["fit"]["designs"] >= 3
    assert lora["seconds_per_slot"] >= 0 and lora["seconds_per_row_rank"] >= 0
    assert "--max-lora-rank 8" in after.meta["provenance"]["sections_command"]


@pytest.mark.slow
def test_calibrate_measures_draft_acceptance_on_a_corpus(tmp_path, capsys):
    from kvplan.sim.cost.calibrated import CalibratedCost, save_profile
    from kvplan.sim.spec_decode import counts_from_records

    base = tmp_path / "base.yaml"
    save_profile(CalibratedCost({"step": 0.01}, meta={"model": "tiny-llama", "block_size": 16}), base)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("one two three one two three one two three\n\nfor i in range(3): print(i)\nfor i in range(3):"
                      " print(i)\n\n\n")
    out = tmp_path / "spec.yaml"
    spec = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}'
    assert main(["calibrate", "--model", "tiny-llama", "--dtype", "float32", "--profile", str(base),
                 "--speculative-config", spec, "--acceptance-corpus", str(corpus), "--acceptance-max-tokens", "16",
                 "--temperature", "0", "--out", str(out)]) == 0
    assert "mean acceptance length" in capsys.readouterr().err
    section = load_profile(out).meta["speculative"]
    assert section["method"] == "ngram" and section["num_speculative_tokens"] == 3
    assert section["corpus"].startswith("corpus.txt: 2 prompts, 16 tokens each")
    counts = counts_from_records(section["counts"])
    assert counts and all(0 <= accepted <= drafts <= 3 for drafts, accepted in counts)


def test_an_empty_acceptance_corpus_is_refused_in_one_line(tmp_path):
    from kvplan.calibration.acceptance import read_corpus

    (tmp_path / "c.txt").write_text("\n\n  \n")
    with pytest.raises(UserError, match=r"--acceptance-corpus: .*c\.txt: no prompt in it; allowed"):
        read_corpus(tmp_path / "c.txt")
    (tmp_path / "d.txt").write_text("a\nb\n\nc")
    assert read_corpus(tmp_path / "d.txt") == ["a b", "c"]
