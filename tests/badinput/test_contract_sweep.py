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
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvplan.cli import build_parser
from kvplan.engine_args import parse_bytes
from tests.badinput.contract import HUGE, ROOT, SAMPLE, refused


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
KINDS = ("missing", "directory", "binary", "empty", "devnull", "fifo", "empty string", "too long", "unreadable")
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
    elif kind == "too long":  # Path.exists() raises ENAMETOOLONG instead of answering
        return str(tmp / ("n" * 300))
    elif kind == "unreadable":
        if os.geteuid() == 0:
            pytest.skip("root reads every file")
        path.write_text("name: t\n")
        path.chmod(0)
    return str(path)


ENGINE = pytest.mark.engine  # refused by the engine's own checks, after it imports: needs torch
ENGINE_CHECKED = ("generate --model", "serve --model")


@pytest.mark.parametrize(("argument", "kind"), [
    pytest.param(a, k, marks=ENGINE) if a in ENGINE_CHECKED and k != "empty string" else (a, k)
    for k in KINDS for a in sorted(PATH_ARGS)])
def test_every_path_argument_refuses_what_it_cannot_read(capsys, tmp_path, argument, kind):
    if kind == "directory" and argument in DIRECTORIES:
        pytest.skip("an empty data directory is valid: every regime is skipped, as without one")
    path = _path(kind, tmp_path)
    flag = argument.split()[-1]
    where = [w for w in (path, flag, "empty", "past the system's limit") if w]
    refused(capsys, PATH_ARGS[argument](path, str(tmp_path / "out")), *where, tmp=tmp_path)


# -- free-text options: names checked against a list, URLs, hosts, shell words ----------------------------------
def _simulate_names():
    parser = next(p for prefix, p in _leaves() if prefix == ["simulate"])
    for action in parser._actions:
        if action.option_strings and action.nargs is None and action.type is not None and not action.choices \
                and getattr(action.type, "__qualname__", "").startswith("non_empty") \
                and action.dest not in ("trace", "profile", "retime"):
            yield action.option_strings[0]


@pytest.mark.parametrize("flag", list(_simulate_names()))
def test_every_simulate_name_option_refuses_garbage_without_echoing_it(capsys, flag):
    line = refused(capsys, ["simulate", "--trace", SAMPLE, flag, HUGE], flag)
    assert HUGE[:200] not in line


FREE_TEXT = [
    pytest.param(["generate", "--model", "tiny-llama", "--prompt-ids", "1 x"], "--prompt-ids", marks=ENGINE),
    pytest.param(["generate", "--model", "tiny-llama", "--prompt-ids", HUGE], "prompt", marks=ENGINE),
    pytest.param(["eval-ppl", "--model", "tiny-llama", "--text", str(ROOT / "README.md"), "--policy", "window=x"],
                 "window", marks=ENGINE),
    (["bench", "serve", "--engine-args", "--block-size x"], "--engine-args"),
    (["bench", "serve", "--engine-args", "--no-such 1"], "--engine-args"),
    (["bench", "serve", "--engine-args", "'unclosed"], "--engine-args"),
    (["simulate", "--trace", SAMPLE, "--retime", "{process: poisson, rate: .nan}"], "rate"),
    (["simulate", "--trace", SAMPLE, "--retime", "[1, 2"], "--retime"),
    pytest.param(["serve", "--model", "tiny-llama", "--host", "no such host!"], "--host", marks=ENGINE),
    (["replay", "--endpoint", "ftp://x", "--trace", SAMPLE, "--out", "o"], "--endpoint"),
    (["replay", "--endpoint", "http://[::1", "--trace", SAMPLE, "--out", "o"], "--endpoint"),
    (["replay", "--endpoint", HUGE, "--trace", SAMPLE, "--out", "o"], "--endpoint"),
    (["replay", "--endpoint", "http://127.0.0.1:9", "--trace", SAMPLE, "--out", "o"], "--endpoint"),
    (["run", f"example:{HUGE}"], "EXPERIMENT"),
]


@pytest.mark.parametrize(("argv", "where"), FREE_TEXT, ids=lambda v: " ".join(v)[:50] if isinstance(v, list) else v)
def test_free_text_options_are_refused_in_one_bounded_line(capsys, tmp_path, monkeypatch, argv, where):
    monkeypatch.chdir(tmp_path)  # replay's --out o, never written: refused before
    refused(capsys, argv, where)
    assert not (tmp_path / "o").exists()


@ENGINE
def test_serve_refuses_a_port_in_use_before_loading_the_model(capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refused(capsys, ["serve", "--model", "no-such-model-would-fail-later", "--port", str(port)], "--port")
    assert "cannot listen" in line


def test_the_last_guard_keeps_any_message_one_bounded_line():
    from kvplan.cli import one_line
    from kvplan.traces.schema import listed

    text = one_line(f"--router: unknown router '{'r' * 5000}'\nsecond line; allowed: a, b")
    assert "\n" not in text and len(text) < 200 and text.endswith("second line; allowed: a, b")
    path = "/a/typed/path/" + "d" * 100  # a path someone typed is left whole
    assert one_line(f"model directory '{path}' has no config.json") == f"model directory '{path}' has no config.json"
    assert len(one_line("x" * 5000)) == 60
    assert listed(["a", "b"]) == "a, b"
    from kvplan.strict_json import why

    assert why(KeyError("meta")) == "no key 'meta'"  # not KeyError('meta')
    assert why(ValueError("x; allowed: y")) == "x" and len(why(ValueError("v" * 5000))) == 100
    many = listed(f"metric_{i}" for i in range(40))
    assert len(many) <= 150 and many.endswith("more)") and many.startswith("metric_0, metric_1")
