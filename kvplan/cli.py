"""The `kvplan` command line. Each verb lives in `kvplan.commands.<verb>` and registers itself here."""

from __future__ import annotations

import argparse
import importlib
import sys

# Verbs in the order `kvplan --help` lists them; later features add their module here.
COMMANDS = ("trace", "simulate", "generate", "replay", "calibrate", "validate", "bench")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvplan", description="KV-cache capacity planner for LLM serving.")
    verbs = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"kvplan.commands.{name}").register(verbs)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (ValueError, FileNotFoundError) as exc:  # bad input: a clear message, no traceback
        print(f"kvplan {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
