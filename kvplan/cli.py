"""The `kvplan` command line. Each verb lives in `kvplan.commands.<verb>` and registers itself here."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from kvplan import __version__
from kvplan.arg_types import OneLineParser
from kvplan.errors import UserError
from kvplan.traces.schema import short_repr

# Verbs in the order `kvplan --help` lists them; later features add their module here.
COMMANDS = ("run", "trace", "simulate", "generate", "serve", "replay", "calibrate", "validate", "verify", "eval_ppl",
            "bench")
# What the `engine` extra installs: a command that imports one of these needs it.
ENGINE_PACKAGES = ("torch", "triton", "transformers", "accelerate", "gguf")
# What the `serve` extra installs (`kvplan serve`).
SERVE_PACKAGES = ("fastapi", "starlette", "uvicorn", "prometheus_client")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="kvplan", description="KV-cache capacity planner for LLM serving.")
    parser.add_argument("--version", action=VersionAction, nargs=0, help="show the version, and the serving core "
                        "this process runs (compiled or pure Python: kvplan/launch.py), and exit")
    verbs = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"kvplan.commands.{name}").register(verbs)
    _refuse_empty_values(parser)
    return parser


class VersionAction(argparse.Action):
    """`--version`: the version, and which serving core runs (looked up only when asked: it imports the core)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        from kvplan.launch import core_description

        print(f"kvplan {__version__} (serving core: {core_description()})")
        parser.exit()


def _refuse_empty_values(parser: argparse.ArgumentParser) -> None:
    """No option takes an empty value: `--profile ""` would be Path("") (the current directory), `--configs ""`
    no configs at all, `--model ""` a model directory '.'. Every string and path option of every command, new
    ones included, is wrapped here instead of at each."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _refuse_empty_values(sub)
        elif (action.nargs != 0 and not action.choices and action.type in (None, str, Path)
              and action.default != ""):  # argparse parses a string default too: `--engine-args ''` is "none"
            action.type = non_empty(action.type or str)


def non_empty(kind: Callable[[str], object]) -> Callable[[str], object]:
    def parse(text: str) -> object:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{text!r} is empty; allowed: a non-empty value")
        return kind(text)

    return parse


def main(argv: list[str] | None = None) -> int:
    try:
        args, unknown = build_parser().parse_known_args(argv)
    except SystemExit as exc:  # --help, --version (0) or a usage error (2, one line already printed)
        return exc.code if isinstance(exc.code, int) else 2
    if unknown:  # argparse would name the top-level parser ("kvplan: error:"), not the command
        shown = " ".join(short_repr(arg, 40) for arg in unknown[:3]) + (" ..." if len(unknown) > 3 else "")
        print(f"kvplan {args.command}: error: unrecognized arguments: {shown}; allowed: the options "
              f"`kvplan {args.command} --help` lists", file=sys.stderr)
        return 2
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        print(f"kvplan {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `kvplan ... | head`: the reader left; say nothing more, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except UserError as exc:  # bad input, raised where it was checked: a clear message, no traceback
        print(f"kvplan {args.command}: error: {one_line(with_flag(str(exc), args.command))}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # the light install: the command needs the live engine (or the server)
        package = (exc.name or "").split(".")[0]
        if package not in ENGINE_PACKAGES + SERVE_PACKAGES:
            return _bug(args.command)
        extra, what = ("engine", "the live engine") if package in ENGINE_PACKAGES else ("serve", "the HTTP server")
        print(f"kvplan {args.command}: error: needs {what} (module {exc.name!r} is not installed); "
              f"install it with: pip install 'kvplan[{extra}]'", file=sys.stderr)
        return 2
    except OSError as exc:  # a path that cannot be read or written (permissions, a directory, a full disk)
        if exc.errno == errno.ENAMETOOLONG:  # Path.exists() raises it instead of answering False
            name = str(exc.filename or "")
            print(f"kvplan {args.command}: error: the path {short_repr(name, 40)} ({len(name)} characters) has a "
                  "name past the system's limit; allowed: names of at most 255 bytes", file=sys.stderr)
            return 2
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"kvplan {args.command}: error: {one_line(f'{where}{exc.strerror or exc}')}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"kvplan {args.command}: error: out of memory; allowed: a smaller run (fewer requests, blocks or "
              "replicas)", file=sys.stderr)
        return 1
    except Exception:
        return _bug(args.command)


# The serving core names its settings by config path (`cache.eviction_policy`); on the command line the user typed
# a flag. A core error that reaches the CLI unwrapped gets the flag in front (experiments and --configs wrap theirs
# with their own key paths, which do not start like this).
CONFIG_FLAGS = {"cache.block_size": "--block-size", "cache.num_blocks": "--num-blocks",
                "cache.eviction_policy": "--eviction", "cache.allocator": "--allocator",
                "cache.max_model_len": "--max-model-len", "cache.sink_tokens": "--sink-tokens",
                "cache.window_tokens": "--window-tokens", "cache.num_cpu_blocks": "--swap-space",
                "scheduler.max_num_batched_tokens": "--max-num-batched-tokens",
                "scheduler.max_num_seqs": "--max-num-seqs", "scheduler.policy": "--policy",
                "scheduler.preemption_mode": "--preemption", "scheduler.victim_policy": "--victim",
                "scheduler.schedule": "--schedule",
                "scheduler.scheduler_reserve_full_isl": "--scheduler-reserve-full-isl"}
CONFIG_PATH = re.compile(r"^((?:cache|scheduler)\.\w+)(?=[:\s])")


def with_flag(message: str, command: str) -> str:
    """`cache.eviction_policy: ...` as `--eviction: cache.eviction_policy: ...`."""
    def named(match: re.Match) -> str:
        flag = CONFIG_FLAGS.get(match.group(1))
        if flag == "--swap-space" and command == "simulate":
            flag = "--cpu-blocks"
        return f"{flag}: {match.group(1)}" if flag else match.group(1)

    return CONFIG_PATH.sub(named, message, count=1)


QUOTED_GARBAGE = re.compile(r"'([^'\n]{121,})'")  # a quoted value this long is not a path anyone typed
UNQUOTED_GARBAGE = re.compile(r"\S{201,}")


def one_line(message: str) -> str:
    """The last guard on what reaches the terminal: one line, and no value echoed whole. The ~100 places that check
    input quote values in about 60 characters; a message that quotes a 5,000-character router name, prompt id or
    URL anyway (`{value!r}` is easy to write) is cut here, paths a user typed left alone."""
    message = " ".join(message.split())
    message = QUOTED_GARBAGE.sub(lambda m: short_repr(m.group(1)), message)
    return UNQUOTED_GARBAGE.sub(lambda m: m.group(0)[:57] + "...", message)


def _bug(command: str) -> int:
    """Anything not caught above is a bug in kvplan: its traceback, and a line that says so."""
    traceback.print_exc()
    print(f"kvplan {command}: internal error (a bug in kvplan {__version__}, not in your input): please report it "
          "with the traceback above", file=sys.stderr)
    return 1

if __name__ == "__main__":
    sys.exit(main())
