"""Issue 34, what a trace means: a --hash-granularity must agree with the file (a too-small one understated
Mooncake's prefix reuse 30x, silently); every rejected request is named by its request_id and the file line it
came from, and is a row of the written table; a profile calibrated on another model is said, and a profile with
only the constant step term prices the simulator's fast path."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kvplan import traces
from kvplan.cli import main
from tests.badinput.test_outputs_and_classes import EXPERIMENT, MOONCAKE, ROOT, SAMPLE, one_line


# -- --hash-granularity must agree with the file -----------------------------------------------------------------
@pytest.mark.parametrize(("granularity", "accepted"), [(16, False), (256, False), (512, True), (1024, False)])
def test_hash_granularity_on_mooncake_rows(capsys, granularity, accepted):
    """Every Mooncake row carries exactly ceil(prompt / 512) hashes: another granularity makes the counts wrong,
    and is refused with the one the data implies (16 used to understate reuse 30x, silently)."""
    argv = ["trace", "stats", MOONCAKE, "--hash-granularity", str(granularity), "--json"]
    if accepted:
        assert main(argv) == 0
        assert json.loads(capsys.readouterr().out)["prefix"]["reuse_fraction"] == pytest.approx(0.6585, abs=1e-3)
    else:
        err = one_line(capsys, argv, f"at {granularity} tokens per hash allowed: exactly ceil(")
        assert "this file's counts fit 512-token hashes (--hash-granularity 512)" in err


def test_a_consistent_override_is_stated_and_a_stated_granularity_is_kept(tmp_path, capsys):
    short = tmp_path / "m.jsonl"  # one hash per row, every prompt <= 256: consistent at 256 and at 512
    short.write_text("".join(json.dumps({"timestamp": i, "input_length": 200, "output_length": 5, "hash_ids": [i % 2]})
                             + "\n" for i in range(4)))
    trace = traces.load(short, hash_granularity=256)
    assert trace.hash_granularity == 256
    assert "--hash-granularity 256: each of hash_ids covers 256 tokens, not the mooncake layout's 512" in \
        trace.report.notes
    native = tmp_path / "n.jsonl"  # our own format states its granularity in every row
    native.write_text("".join(json.dumps({"request_id": i, "arrival_s": i, "prompt_tokens": 32, "output_tokens": 2,
                                          "hash_granularity": 16, "prefix_hashes": [1, 2]}) + "\n" for i in range(3)))
    one_line(capsys, ["trace", "stats", str(native), "--hash-granularity", "32"],
             "--hash-granularity 32: " + str(native) + " states hash_granularity 16 in its rows; allowed: 16")


# -- rejected requests keep their file row and line --------------------------------------------------------------
def test_rejections_name_the_files_row_and_line_and_are_in_the_table(tmp_path, capsys):
    """Rows dropped (--skip-bad) and rows out of order move every later request's position: the report still
    names each rejected request by its request_id and the line it came from, and the written table has it."""
    rows = [{"timestamp": 2000, "input_length": 100, "output_length": 5},  # line 1
            {"timestamp": 0, "input_length": "bad", "output_length": 5},  # line 2: dropped (--skip-bad)
            {"timestamp": 1000, "input_length": 100, "output_length": 5},  # line 3: sorted before line 1
            {"timestamp": 3000, "input_length": 9000, "output_length": 5}]  # line 4: beyond the context, rejected
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    assert main(["simulate", "--trace", str(path), "--skip-bad", "--order-tolerance", "10", "--model",
                 "llama-100m", "--hardware", "a100-40gb", "--out", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)["info"]
    assert info["rejected_first"][0].startswith("request_id 3 (t.jsonl:4): ")
    table = pd.read_parquet(out / "requests.parquet")
    rejected = table[table["rejected"] != ""]
    assert rejected["request_id"].tolist() == [3] and rejected["ttft_ms"].isna().all()
    assert sorted(table["request_id"]) == [0, 2, 3]  # the file's rows: the dropped one (1) is not a request
    trace = traces.load(path, skip_bad=True, order_tolerance_s=10)
    assert [trace.reference(i) for i in range(len(trace))] == [
        "request_id 2 (t.jsonl:3)", "request_id 0 (t.jsonl:1)", "request_id 3 (t.jsonl:4)"]


# -- a profile of another model is said, a constant-only profile prices stretches --------------------------------
def test_a_profile_of_another_model_is_noted(capsys):
    profile = str(ROOT / "sim" / "profiles" / "cpu-local" / "smollm2-135m.yaml")
    assert main(["simulate", "--trace", SAMPLE, "--cost", "calibrated", "--profile", profile, "--model", "llama-3-8b",
                 "--num-blocks", "2000"]) == 0
    err = capsys.readouterr().err
    assert "the profile was calibrated on smollm2-135m (30 layers, hidden 576) but prices llama-3-8b" in err
    assert main(["simulate", "--trace", SAMPLE, "--cost", "calibrated", "--profile", profile, "--model",
                 "smollm2-135m", "--num-blocks", "2000"]) == 0
    assert "calibrated on" not in capsys.readouterr().err


def test_an_experiment_priced_by_another_models_profile_says_so(tmp_path, capsys):
    profile = ROOT / "sim" / "profiles" / "cpu-local" / "smollm2-135m.yaml"
    exp = tmp_path / "e.yaml"
    exp.write_text(EXPERIMENT.replace("hardware: a100-40gb", f"hardware: {profile}") + "engine: {num_blocks: 3000}\n")
    assert main(["run", str(exp), "--explain", "--json"]) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    assert "note: hardware: the profile was calibrated on smollm2-135m" in captured.err
    json.loads(captured.out)  # stdout stays one strict JSON object


def test_a_profile_with_only_a_step_coefficient_runs_the_fast_path(tmp_path, capsys):
    text = (ROOT / "sim" / "profiles" / "cpu-local" / "llama-100m.yaml").read_text()
    import yaml

    doc = yaml.safe_load(text)
    doc["coefficients"] = {"step": 0.03}
    doc["swap_seconds_per_block"] = doc["copy_seconds_per_block"] = 0.0
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["simulate", "--trace", SAMPLE, "--cost", "calibrated", "--profile", str(path), "--model",
                 "llama-100m", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    # every step costs 30 ms whatever it holds: a decode gap is 30 ms, or a multiple where a prefill chunk of
    # another request took a step of its own in between (recompute preemption aside)
    assert summary["completed"] > 0 and summary["median_tpot_ms"] == pytest.approx(30.0, rel=1e-6)
