"""The README's error contract, swept across every command from the parsers and schema tables themselves.

Every case runs `kvplan.cli.main` in-process and checks the contract: exit code 2, exactly one line on stderr,
starting `kvplan CMD: error:`, naming where (the flag, the file or the key path), saying what is allowed, at most
LINE_LIMIT characters beyond the paths the test gave (no echo of a 5,000-character value), no traceback, within
LIMIT_S (an alarm turns a hang into a failure). The cases come from `build_parser()` (every option with a type or
choices, every command) and from the experiment schema's key tables, so a new flag or key is swept without
editing this file. A first-use cache or a model is never needed: each case is refused before either.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kvplan.cli import build_parser, main
from kvplan.engine_args import parse_bytes
from kvplan.experiments import schema

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = str(ROOT / "traces" / "samples" / "chat.jsonl")
LINE_LIMIT = 300
LIMIT_S = 20
# What a line says about what is allowed (or, for a file that is not there, that it is not).
ALLOWED = re.compile(r"allowed|expected|choose from|must be|no such|needs|only")
# transformers' weight-loading progress bar is not kvplan's line (engine commands refuse after loading a model).
PROGRESS = re.compile(r"^(Loading weights|Writing model shards)|it/s\]$")
HUGE = "9" * 5000


def refused(capsys, argv: list[str], *where: str, tmp: Path | None = None) -> str:
    """Run `kvplan ARGV` and check the one-line contract; returns the line."""
    def hang(signum, frame):
        raise TimeoutError(f"kvplan {' '.join(argv)[:200]} ran past {LIMIT_S} s")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(LIMIT_S)
    start = time.monotonic()
    try:
        code = main(argv)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not PROGRESS.search(line)]
    assert code == 2 and "Traceback" not in err, err[-3000:]
    assert len(lines) == 1, err[-3000:]
    line = lines[0]
    # `kvplan trace: error:` from the command, `kvplan trace stats: error:` from its sub-parser
    assert re.match(rf"kvplan {re.escape(argv[0])}( [a-z]+)?: error: ", line), line
    measured = line.replace(str(tmp), "T") if tmp is not None else line
    assert len(measured) <= LINE_LIMIT, f"{len(measured)} characters: {line}"
    assert any(w in line for w in where), f"names none of {where}: {line}"
    assert ALLOWED.search(line), f"does not say what is allowed: {line}"
    assert elapsed < LIMIT_S
    return line


# -- every typed option, from the parser -------------------------------------------------------------------------
def _options() -> Iterator[tuple[list[str], argparse.ArgumentParser, argparse.Action]]:
    def walk(prefix: list[str], parser: argparse.ArgumentParser):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk([*prefix, name], sub)
            elif action.option_strings and action.nargs != 0 and (action.type is not None or action.choices):
                yield prefix, parser, action

    yield from walk([], build_parser())


def _required(parser: argparse.ArgumentParser, skip: argparse.Action | None) -> list[str]:
    """Placeholders for the other required arguments: the refusal comes at parsing, before any of them is read."""
    out: list[str] = []
    for action in parser._actions:
        if action is skip or not action.required or isinstance(action, argparse._SubParsersAction):
            continue
        out += [action.option_strings[0], "x"] if action.option_strings else ["x"]
    for group in parser._mutually_exclusive_groups:  # generate's --prompt | --prompt-ids
        if group.required and skip not in group._group_actions:
            out += [group._group_actions[0].option_strings[0], "x"]
    return out


def _bounds(kind) -> dict[str, object]:
    """The low/high/above an `arg_types.integer` or `number` closes over (none for other types)."""
    try:
        return {k: v for k, v in inspect.getclosurevars(kind).nonlocals.items() if k in ("low", "high", "above")}
    except TypeError:
        return {}


def _bad_values(action: argparse.Action) -> list[str]:
    if action.type is None:  # a choice
        return ["bogus", "", "x" * 5000]
    values = ["nan", "inf", "-inf", "true", "abc", "", " ", "1e400", HUGE, "0x10"]
    bounds = _bounds(action.type)
    if bounds.get("low") is not None:
        values.append(str(bounds["low"] - 1))
    if bounds.get("above") is not None:
        values.append(str(bounds["above"]))
    if bounds.get("high") is not None:
        values.append(str(bounds["high"] * 10 + 1))
    if action.type is parse_bytes:
        values += ["0", "-1", "1.5XB"]
    return values


def _option_cases():
    for prefix, parser, action in _options():
        if action.type is not None and not (action.type is parse_bytes or _bounds(action.type)):
            continue  # paths and free strings: test_path_arguments
        values = _bad_values(action)
        if action.type is not None:  # refused by the type, the rest is the command's (other tests)
            values = [v for v in values if not _accepts(action.type, v)]
        yield pytest.param(prefix, parser, action, values, id=f"{' '.join(prefix)} {action.option_strings[0]}")


def _accepts(kind, value: str) -> bool:
    try:
        kind(value)
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return False
    return True


@pytest.mark.parametrize(("prefix", "parser", "action", "values"), list(_option_cases()))
def test_every_typed_option_refuses_bad_values_in_one_line(capsys, prefix, parser, action, values):
    flag = action.option_strings[0]
    for value in ("nan", "inf", "true", "abc", "", HUGE):  # never a setting, whatever the option
        if action.type is not None:
            assert not _accepts(action.type, value), f"{flag} accepts {value[:20]!r}"
    for value in values:
        refused(capsys, [*prefix, f"{flag}={value}", *_required(parser, action)], flag)


def _leaves() -> Iterator[tuple[list[str], argparse.ArgumentParser]]:
    def walk(prefix: list[str], parser: argparse.ArgumentParser):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            yield prefix, parser
        for action in subs:
            for name, sub in action.choices.items():
                yield from walk([*prefix, name], sub)

    yield from walk([], build_parser())


@pytest.mark.parametrize(("prefix", "parser"), list(_leaves()), ids=lambda v: " ".join(v) if isinstance(v, list)
                         else "")
def test_every_command_refuses_an_unknown_option_naming_it(capsys, prefix, parser):
    line = refused(capsys, [*prefix, *_required(parser, None), "--no-such-option", HUGE], "--no-such-option")
    assert "unrecognized arguments" in line


# -- every path argument -----------------------------------------------------------------------------------------
PATH_ARGS = {  # an argument that names a file, and a command line refused before any model or work
    "run EXPERIMENT": lambda p, o: ["run", p, "--explain"],
    "trace stats PATH": lambda p, o: ["trace", "stats", p],
    "trace convert PATH": lambda p, o: ["trace", "convert", p, f"{o}.jsonl"],
    "trace synth SPEC": lambda p, o: ["trace", "synth", p, "--out", f"{o}.jsonl"],
    "simulate --trace": lambda p, o: ["simulate", "--trace", p],
    "simulate --profile": lambda p, o: ["simulate", "--trace", SAMPLE, "--cost", "calibrated", "--profile", p],
    "simulate --profile recorded": lambda p, o: ["simulate", "--trace", SAMPLE, "--cost", "recorded", "--profile",
                                                 p],
    "simulate --model": lambda p, o: ["simulate", "--trace", SAMPLE, "--model", p],
    "generate --model": lambda p, o: ["generate", "--model", p, "--prompt-ids", "1 2"],
    "serve --model": lambda p, o: ["serve", "--model", p],
    "replay --trace": lambda p, o: ["replay", "--model", "tiny-llama", "--trace", p, "--out", o],
    "replay --endpoint --trace": lambda p, o: ["replay", "--endpoint", "http://127.0.0.1:9", "--trace", p,
                                               "--out", o],
    "calibrate --from-replay": lambda p, o: ["calibrate", "--from-replay", p, "--model", "tiny-llama", "--out",
                                             f"{o}.yaml"],
    "validate --trace": lambda p, o: ["validate", "--model", "tiny-llama", "--mode", "policy", "--trace", p,
                                      "--out", o],
    "validate --configs": lambda p, o: ["validate", "--model", "tiny-llama", "--mode", "policy", "--trace", SAMPLE,
                                        "--configs", p, "--out", o],
    "eval-ppl --text": lambda p, o: ["eval-ppl", "--model", "tiny-llama", "--text", p],
    "bench beam --text": lambda p, o: ["bench", "beam", "--text", p],
    "bench sim --data": lambda p, o: ["bench", "sim", "--data", p, "--requests", "10"],
}
DIRECTORIES = {"bench sim --data"}  # a directory is what it takes (an empty one: every regime skipped)
KINDS = ("missing", "directory", "binary", "empty", "devnull", "fifo", "empty string", "unreadable")
# A file that is empty or binary is a valid text for eval-ppl only in the sense that it has no tokens: refused too.


def _path(kind: str, tmp: Path) -> str:
    import random

    rng = random.Random(34)  # seeded: the same binary file every run
    path = tmp / "input"
    if kind == "missing":
        return str(tmp / "no-such-file")
    if kind == "directory":
        path.mkdir()
    elif kind == "binary":
        path.write_bytes(bytes(rng.randrange(256) for _ in range(4096)))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "devnull":
        return "/dev/null"
    elif kind == "fifo":
        os.mkfifo(path)  # opening it to read would wait for a writer forever
    elif kind == "empty string":
        return ""
    elif kind == "unreadable":
        if os.geteuid() == 0:
            pytest.skip("root reads every file")
        path.write_text("name: t\n")
        path.chmod(0)
    return str(path)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("argument", sorted(PATH_ARGS))
def test_every_path_argument_refuses_what_it_cannot_read(capsys, tmp_path, argument, kind):
    if kind == "directory" and argument in DIRECTORIES:
        pytest.skip("an empty data directory is valid: every regime is skipped, as without one")
    path = _path(kind, tmp_path)
    flag = argument.split()[-1]
    where = [w for w in (path, flag, "empty") if w]
    refused(capsys, PATH_ARGS[argument](path, str(tmp_path / "out")), *where, tmp=tmp_path)


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
