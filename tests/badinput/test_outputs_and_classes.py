"""Issue 34's classes of mishandled input, each with cases across the commands it reaches: an output location
that holds a user's files; names from user files that would leave --out; numbers and names a flag refuses but a
file let through (--configs, --dtype, seeds, rates); archives corrupt inside; repeated YAML keys; sizes that never
finish (sweeps, KV blocks); values echoed whole (test_granularity_and_references.py has the granularity rule and
the request references). Each bad case exits 2 with one line and no traceback; each silent case is now an error
or a note."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pandas as pd
import pytest

from kvplan.cli import main
from kvplan.output import verify_result_set

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = str(ROOT / "traces" / "samples" / "chat.jsonl")
MOONCAKE = str(ROOT / "traces" / "samples" / "mooncake_style.jsonl")
EXPERIMENT = 'name: t\nmodel: llama-3-8b\nhardware: a100-40gb\nworkload: {trace: "sample:chat"}\n'


def one_line(capsys, argv: list[str], fragment: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert fragment in err, err
    return err


# -- --out never deletes what kvplan did not write -----------------------------------------------------------------
OUT_COMMANDS = {
    "simulate": ["simulate", "--trace", SAMPLE],
    "run": ["run", "example:quickstart"],
    "replay": ["replay", "--model", "tiny-llama", "--trace", SAMPLE],
    "replay-endpoint": ["replay", "--endpoint", "http://127.0.0.1:9", "--trace", SAMPLE, "--vocab-size", "100"],
    "validate": ["validate", "--model", "tiny-llama", "--trace", SAMPLE, "--mode", "policy"],
}


@pytest.mark.parametrize("command", OUT_COMMANDS)
def test_out_on_a_users_directory_leaves_the_file(tmp_path, capsys, command):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    one_line(capsys, [*OUT_COMMANDS[command], "--out", str(mine)], "is a directory kvplan did not write (it "
                                                                  "holds 'notes.txt' and no kvplan manifest.json)")
    assert (mine / "notes.txt").read_text() == "precious" and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_an_earlier_set_or_an_empty_directory_is_replaced(tmp_path, capsys):
    out = tmp_path / "r"
    out.mkdir()  # empty: nothing to lose
    assert main(["simulate", "--trace", SAMPLE, "--out", str(out), "--json"]) == 0
    assert main(["simulate", "--trace", SAMPLE, "--block-size", "8", "--out", str(out), "--json"]) == 0
    assert verify_result_set(out)["config"]["options"]["block_size"] == [8]
    capsys.readouterr()


def test_a_file_appearing_during_the_run_is_not_replaced(tmp_path, capsys, monkeypatch):
    """The check before the work is repeated at the swap: a user's file that appeared meanwhile is kept, and this
    run's set is not half-published."""
    from kvplan import sim
    out = tmp_path / "r"
    real = sim.run.simulate

    def simulate_then_a_user_writes(*args, **kwargs):
        out.mkdir(exist_ok=True)
        (out / "draft.txt").write_text("mine")
        return real(*args, **kwargs)

    monkeypatch.setattr(sim.run, "simulate", simulate_then_a_user_writes)
    one_line(capsys, ["simulate", "--trace", SAMPLE, "--out", str(out)], "holds 'draft.txt'")
    assert sorted(p.name for p in out.iterdir()) == ["draft.txt"]


def test_a_users_folder_named_like_the_staging_folder_is_left(tmp_path, capsys):
    out = tmp_path / "res"
    partial = tmp_path / "res.partial"
    partial.mkdir()
    (partial / "thesis.tex").write_text("mine")
    exp = tmp_path / "e.yaml"
    exp.write_text(EXPERIMENT)
    one_line(capsys, ["run", str(exp), "--out", str(out)], "res.partial is a directory kvplan did not write")
    assert (partial / "thesis.tex").read_text() == "mine" and not out.exists()


def test_the_loser_of_two_publishes_says_what_happened(tmp_path, monkeypatch):
    """Another process keeps replacing OUT while this one publishes: the retry gives up with a clear line
    naming where this run's complete set is, instead of a bare path."""
    import os

    from kvplan import output

    out, staging = tmp_path / "out", tmp_path / ".staging"
    staging.mkdir()
    (staging / "x").write_text("new")
    real_replace = os.replace

    def racing_replace(src, dst):
        if Path(dst) == out:  # the other process's set lands first, every time
            out.mkdir(exist_ok=True)
            (out / "theirs").write_text("theirs")
            output.write_manifest(out)  # a complete set of the other process's
        return real_replace(src, dst)

    monkeypatch.setattr(output.os, "replace", racing_replace)
    with pytest.raises(ValueError, match=r"another kvplan process kept replacing this result set .* complete set "
                                         r"is left at .*\.staging"):
        output.publish(staging, out)
    assert (staging / "x").read_text() == "new" and (out / "theirs").exists()


# -- names from user files never leave --out --------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../../escape", "a/b", "/abs", "..", ".hidden", "-flag", "report.md", "x" * 101])
def test_a_config_name_cannot_leave_out(tmp_path, capsys, name):
    configs = tmp_path / "c.yaml"
    configs.write_text(json.dumps([{"name": name, "block_size": 16}]))
    one_line(capsys, ["validate", "--model", "tiny-llama", "--trace", SAMPLE, "--mode", "policy", "--configs",
                      str(configs), "--out", str(tmp_path / "v" / "out")], "c.yaml: [0].name: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]


def test_an_experiment_name_cannot_leave_results(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exp = tmp_path / "e.yaml"
    exp.write_text(EXPERIMENT.replace("name: t", "name: ../../escape"))
    one_line(capsys, ["run", str(exp)], "e.yaml: name: '../../escape' cannot name a folder under --out")


# -- what a flag refuses, a file refuses too ---------------------------------------------------------------------
CONFIG_CASES = [  # --configs key: value -> the flag's own rule
    ("block_size: 0", "[0].block_size: must be an integer >= 1 and <= 256, got 0"),  # was ZeroDivisionError
    ("num_blocks: 0", "[0].num_blocks: must be an integer >= 1 and <= 50000000"),  # was the default, silently
    ("num_blocks: 1000000000000", "[0].num_blocks: must be an integer >= 1 and <= 50000000 (one object per KV "
                                  "block: more would exhaust memory), got 1000000000000"),
    ("max_num_seqs: 0", "[0].max_num_seqs: must be an integer >= 1 and <= 1000000, got 0"),
    ("block_size: 16.5", "[0].block_size: must be an integer >= 1 and <= 256, got 16.5"),
    ("max_model_len: true", "[0].max_model_len: must be an integer >= 1 and <= 10000000, got True"),
    ("dtype: float7", "[0].dtype: unknown value 'float7'; did you mean 'float16' or 'float32'? allowed: bfloat16, "
     "float16, float32"),
    ("kv_cache_dtype: fp4", "[0].kv_cache_dtype: unknown value 'fp4'; did you mean 'fp8'? allowed: auto, float16"),
    ("position_mode: sideways", "[0].position_mode: unknown value 'sideways'; allowed: original, shifted"),
]


@pytest.mark.parametrize(("line", "fragment"), CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_configs_values_follow_their_flags(tmp_path, capsys, line, fragment):
    configs = tmp_path / "c.yaml"
    configs.write_text(f"- name: a\n  {line}\n")
    one_line(capsys, ["validate", "--model", "tiny-llama", "--trace", SAMPLE, "--mode", "policy", "--configs",
                      str(configs), "--out", str(tmp_path / "v")], fragment)


@pytest.mark.parametrize("argv", [
    ["calibrate", "--model", "tiny-llama", "--out", "p.yaml"], ["replay", "--model", "tiny-llama", "--trace", SAMPLE,
                                                                "--out", "o"],
    ["serve", "--model", "tiny-llama"], ["generate", "--model", "tiny-llama", "--prompt", "hi"],
    ["validate", "--model", "tiny-llama", "--trace", SAMPLE, "--out", "o"],
    ["eval-ppl", "--model", "tiny-llama", "--text", SAMPLE], ["bench", "engine"],
], ids=lambda argv: argv[0] + (f"-{argv[1]}" if argv[0] == "bench" else ""))
def test_every_dtype_flag_refuses_an_unknown_dtype(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    one_line(capsys, [*argv, "--dtype", "float7"], "argument --dtype: ")


@pytest.mark.engine
def test_the_engine_refuses_an_unknown_dtype_and_a_cache_beyond_memory():
    from kvplan.engine.llm import LLM

    with pytest.raises(ValueError, match=r"dtype: unknown value 'float7'; did you mean 'float16' or 'float32'\? "
                                         r"allowed: bfloat16, float16, float32"):
        LLM("tiny-llama", dtype="float7")
    # 50M blocks of 8 KiB: 400 GB of host memory, refused before allocating any (the earlier name of num_blocks)
    with pytest.raises(ValueError, match=r"KV cache of 50000000 blocks x \d+ bytes = \d+ bytes; allowed: at most "
                                         r"this machine's memory"):
        LLM("tiny-llama", dtype="float32", num_gpu_blocks_override=50_000_000)


EXPERIMENT_CASES = [
    ("seed-10^42", "seeds: [" + "1" + "0" * 42 + "]", "seeds[0]: must be an integer >= 0 and <= 9223372036854775807"),
    ("rate-scale-tiny", "workload: {trace: \"sample:chat\", rate_scale: 1.0e-300}",
     "workload.rate_scale: must be a finite number >= 1e-06"),
    ("jitter-huge", "workload: {trace: \"sample:chat\", transforms: {jitter: 1.0e+300}}",
     "workload.transforms.jitter: jitter quantum 1e+300 s puts arrivals at "),
    ("duplicate-key", "model: llama-2-7b", "e.yaml:5: not valid YAML: key model repeats the key of line 2"),
    ("duplicate-nested-key", "engine: {block_size: 16, block_size: 32}", "key block_size repeats the key of line 5"),
    ("sweep-empty", "sweep: {grid: {}}", "sweep: varies no key; allowed: sweep.grid or sweep.zip"),
    ("sweep-10^6-points", "sweep:\n  grid:\n    engine.num_blocks: [" + ", ".join(str(1000 + i) for i in range(1000))
     + "]\n    cluster.replicas: [" + ", ".join(str(1 + i) for i in range(1000)) + "]",
     "sweep: 1000 x 1000 = 1000000 points; allowed: at most 10000"),
]


@pytest.mark.parametrize(("extra", "fragment"), [c[1:] for c in EXPERIMENT_CASES], ids=[c[0] for c in EXPERIMENT_CASES])
def test_experiment_values_that_used_to_crash_hang_or_mislead(tmp_path, capsys, extra, fragment):
    exp = tmp_path / "e.yaml"
    text = EXPERIMENT + extra + "\n"
    if extra.startswith("workload:"):
        text = text.replace('workload: {trace: "sample:chat"}\n', "")
    exp.write_text(text)
    start = time.monotonic()
    one_line(capsys, ["run", str(exp), "--explain"], fragment)
    assert time.monotonic() - start < 30


@pytest.mark.parametrize(("argv", "fragment"), [
    (["trace", "convert", SAMPLE, "x.jsonl", "--rate-scale", "1e-300"], "--rate-scale: rate factor 1e-300 puts "
                                                                         "arrivals at 3.03e+302 s"),
    (["trace", "convert", SAMPLE, "x.jsonl", "--jitter", "1e300"], "--jitter: jitter quantum 1e+300 s puts"),
    (["replay", "--endpoint", "http://127.0.0.1:9", "--trace", SAMPLE, "--vocab-size", "100", "--rate-scale",
      "1e-300", "--out", "r"], "--rate-scale: rate factor 1e-300"),
    (["simulate", "--trace", SAMPLE, "--retime", "{process: poisson, rate: 1, rate: 2}"],
     "--retime: not YAML (key rate repeats the key of line 1"),
], ids=["convert-rate-scale", "convert-jitter", "replay-rate-scale", "retime-duplicate-key"])
def test_transforms_keep_arrivals_on_the_clock(tmp_path, capsys, monkeypatch, argv, fragment):
    monkeypatch.chdir(tmp_path)
    one_line(capsys, argv, fragment)


@pytest.mark.parametrize("kind", ["spec", "profile", "configs"])
def test_a_repeated_yaml_key_is_refused_in_every_yaml_input(tmp_path, capsys, kind):
    path = tmp_path / "f.yaml"
    if kind == "spec":
        path.write_text("seed: 1\nseed: 2\nrequests: 4\n")
        argv = ["trace", "synth", str(path)]
    elif kind == "profile":
        path.write_text((ROOT / "sim" / "profiles" / "cpu-local" / "llama-100m.yaml").read_text()
                        + "block_size: 32\n")
        argv = ["simulate", "--trace", SAMPLE, "--cost", "calibrated", "--profile", str(path)]
    else:
        path.write_text("- name: a\n  block_size: 16\n  block_size: 32\n")
        argv = ["validate", "--model", "tiny-llama", "--trace", SAMPLE, "--mode", "policy", "--configs", str(path),
                "--out", str(tmp_path / "v")]
    assert "repeats the key of line" in one_line(capsys, argv, "f.yaml:")


# -- archives, headers, huge fields -----------------------------------------------------------------------------
def _corrupt_gzip(tmp_path: Path) -> Path:
    data = gzip.compress(Path(SAMPLE).read_bytes())
    path = tmp_path / "bad.jsonl.gz"
    path.write_bytes(data[:10] + bytes(b ^ 0x55 for b in data[10:40]) + data[40:])  # the first deflate block
    return path


@pytest.mark.parametrize("verb", ["trace", "simulate", "run"])
def test_a_gzip_corrupt_inside_is_one_line(tmp_path, capsys, verb):
    path = _corrupt_gzip(tmp_path)
    if verb == "run":
        exp = tmp_path / "e.yaml"
        exp.write_text(EXPERIMENT.replace('"sample:chat"', str(path)))
        argv = ["run", str(exp), "--explain"]
    else:
        argv = ["trace", "stats", str(path)] if verb == "trace" else ["simulate", "--trace", str(path)]
    one_line(capsys, argv, "bad.jsonl.gz: corrupt or truncated gzip data")


@pytest.mark.parametrize("damage", ["magic-only", "truncated"])
def test_an_unreadable_parquet_names_the_file(tmp_path, capsys, damage):
    whole = tmp_path / "ok.parquet"
    pd.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 1.0], "prompt_tokens": [10, 20],
                  "output_tokens": [2, 3]}).to_parquet(whole)
    data = whole.read_bytes()
    bad = tmp_path / "t.parquet"
    bad.write_bytes(b"PAR1" + b"x" * 100 if damage == "magic-only" else data[:len(data) // 2] + data[-8:])
    one_line(capsys, ["simulate", "--trace", str(bad)], f"{bad}: not a readable Parquet file (")


@pytest.mark.parametrize(("content", "fragment"), [
    ("5,ChatGPT,472,18,490,Conversation log\n6,GPT-4,10,5,15,Conversation log\n",
     "c.csv:1: the first line '5,ChatGPT,472,18,490,Conversation log' is data, not a header"),
    ("1,2,3\n4,5,6\n", "c.csv:1: the first line '1,2,3' is data, not a header"),
], ids=["mixed-values", "all-numbers"])
def test_a_headerless_csv_is_called_data(tmp_path, capsys, content, fragment):
    (tmp_path / "c.csv").write_text(content)
    one_line(capsys, ["trace", "stats", str(tmp_path / "c.csv")], fragment)


@pytest.mark.parametrize(("name", "content"), [
    ("k.jsonl", json.dumps({"x" * 16000: 1}) + "\n"),
    ("v.jsonl", json.dumps({"timestamp": 0, "input_length": "q" * 16000, "output_length": 5, "hash_ids": [1]}) + "\n"),
    ("h.csv", "y" * 16000 + ",b\n1,2\n"),
], ids=["json-key", "json-value", "csv-header"])
def test_a_huge_field_is_quoted_short(tmp_path, capsys, name, content):
    (tmp_path / name).write_text(content)
    err = one_line(capsys, ["trace", "stats", str(tmp_path / name)], name)
    assert len(err) < 1200


def test_only_kvplans_own_leftovers_beside_out_are_cleaned(tmp_path, capsys):
    """A killed run's staging folder beside OUT (it carries kvplan's marker) is removed on the next run; a user's
    folder with a similar name (dot, OUT's name, a number, even `.tmp`/`.old`) has no marker and is not."""
    from kvplan.ownership import MARKER

    out = tmp_path / "r"
    dead = 2**22 + 12345  # above the default pid_max: no process has it
    leftover = tmp_path / f".r.{dead}.abc123.tmp"
    leftover.mkdir()
    (leftover / MARKER).write_text(json.dumps({"kvplan": "staging", "purpose": "tmp", "pid": dead, "out": "r"}))
    mine = [tmp_path / f".r.{dead}.{tail}" for tail in ("backup", "abc123.tmp2", "old", "x.tmp")]
    for folder in mine:
        folder.mkdir()
        (folder / "keep.txt").write_text("mine")
    assert main(["simulate", "--trace", SAMPLE, "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    assert not leftover.exists() and all((folder / "keep.txt").read_text() == "mine" for folder in mine)


def test_resume_into_another_experiments_set_is_refused(tmp_path, capsys):
    from kvplan.output import write_atomic, write_manifest

    out = tmp_path / "res"
    write_atomic(out / "result.json", json.dumps({"name": "other"}))
    write_manifest(out)  # a finished set of experiment "other"
    exp = tmp_path / "e.yaml"
    exp.write_text(EXPERIMENT)
    one_line(capsys, ["run", str(exp), "--out", str(out), "--resume"],
             f"--resume: {out} holds the result set of experiment 'other', not 't'; allowed: the --out of experiment "
             "'t', or no --resume to replace it")
    assert verify_result_set(out)
