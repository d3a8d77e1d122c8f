"""Command-line options for reading a trace, shared by every command that loads one (`kvplan trace ...`,
`simulate`): the format, bad-row handling, BurstGPT failures, the prefix-hash granularity, and giving a
length-only trace arrival times."""

from __future__ import annotations

import argparse

import yaml

from kvplan.arg_types import POSITIVE, SECONDS, integer
from kvplan.errors import UserError
from kvplan.traces.specs import YamlLimit, safe_load


def add_load_options(parser: argparse.ArgumentParser, format_flag: str = "--format") -> None:
    from kvplan.traces import FORMATS

    parser.add_argument(format_flag, dest="trace_format", choices=tuple(FORMATS),
                        help="input format (default: detected from the content)")
    parser.add_argument("--skip-bad", action="store_true",
                        help="drop malformed rows (reported with their line numbers) instead of stopping")
    parser.add_argument("--order-tolerance", type=SECONDS, default=1.0, metavar="S",
                        help="seconds a timestamp may go backwards and still be sorted (default 1)")
    parser.add_argument("--keep-failed", action="store_true",
                        help="BurstGPT: keep failed requests (0 response tokens); the simulator rejects them, counted")
    parser.add_argument("--hash-granularity", type=integer(1, 1 << 20), default=None, metavar="TOKENS",
                        help="tokens per prefix hash, overriding the format's (Mooncake: 512, Qwen-Bailian: 16)")


def load_trace(path: str, args: argparse.Namespace):  # -> traces.Trace
    from kvplan import traces
    return traces.load(path, args.trace_format, args.skip_bad, order_tolerance_s=args.order_tolerance,
                       keep_failed=args.keep_failed, hash_granularity=args.hash_granularity)


def add_arrival_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate", type=POSITIVE, default=None, metavar="R",
                        help="new Poisson arrivals at R requests/s (lengths kept): for length-only traces")
    parser.add_argument("--retime", metavar="YAML", default=None,
                        help="new arrivals keeping lengths, e.g. '{process: gamma, rate: 4, cv: 2}'")


def retime_spec(args: argparse.Namespace) -> dict | None:
    """The arrival process that --rate or --retime asks for (at most one of them), or None."""
    rate = getattr(args, "rate", None)  # `trace convert` has --retime only
    if rate is not None and args.retime is not None:
        raise UserError("--rate and --retime both give arrival times; allowed: one of them")
    if rate is not None:
        return {"process": "poisson", "rate": rate}
    if args.retime is None:
        return None
    try:
        spec = safe_load(args.retime)
    except YamlLimit as exc:  # an alias bomb, or nesting past the limit: bounded before anything reads it
        raise UserError(f"--retime: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"--retime: not YAML ({str(exc).splitlines()[0]}); allowed: a mapping such as "
                         "'{process: poisson, rate: 4}'") from None
    if not isinstance(spec, dict):
        raise UserError(f"--retime: {args.retime!r} is not a mapping; allowed: e.g. '{{process: poisson, rate: 4}}'")
    return spec


UNTIMED_NOTE = ("has no arrival times (a length-only trace): all {n} requests arrive at t = 0, one burst; "
                "give it arrivals with --rate R (Poisson) or --retime '{{process: gamma, rate: R, cv: 2}}'")
