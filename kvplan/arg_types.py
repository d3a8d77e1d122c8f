"""Typed command-line values: each option says what it allows, and a bad value is refused by argparse before any
work starts (`--block-size 0`, `--order-tolerance nan`, `--gpu-memory-utilization 1.5`, `--jitter inf`).

Limits on sizes are there because the simulator builds one object per KV block and per replica: past them a run
would exhaust this kind of machine's memory after minutes instead of failing now.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from pathlib import Path

from kvplan.engine.core.settings import describe_range
from kvplan.limits import MAX_BLOCKS, MAX_REPLICAS, MAX_TOKENS, REPLICAS_WHY
from kvplan.traces.schema import short_repr


def integer(low: int | None = None, high: int | None = None, why: str = "") -> Callable[[str], int]:
    """An integer in [low, high] (a float spelling of an integer, '1e3', is refused: say what you mean)."""
    allowed = describe_range("an integer", low, high) + (f" ({why})" if why else "")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:  # also 5,000 digits (int() refuses them): quoted short, however long
            raise argparse.ArgumentTypeError(f"{short_repr(text)}; allowed: {allowed}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{short_repr(text)[1:-1]}; allowed: {allowed}")
        return value

    return parse


def number(low: float | None = None, high: float | None = None, above: float | None = None) -> Callable[[str], float]:
    """A finite number in range (NaN and infinity are never a setting)."""
    allowed = describe_range("a finite number", low, high, above)

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{short_repr(text)}; allowed: {allowed}") from None
        if (not math.isfinite(value) or (low is not None and value < low) or (high is not None and value > high)
                or (above is not None and value <= above)):
            raise argparse.ArgumentTypeError(f"{short_repr(text)[1:-1]}; allowed: {allowed}")
        return value

    return parse


def out_path(text: str) -> Path:
    """A path to write to: never empty (an empty --out would write into the current directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty path; allowed: a file or directory path")
    return Path(text)


SHOWN = 40  # characters of a refused value a message quotes (the allowed values must fit beside it)
MAX_LINE = 300  # an error line, whatever it quotes
BLOCK_SIZE = integer(1, 256)
COUNT = integer(1)
NON_NEGATIVE = integer(0)
SEED = integer(0, 2**63 - 1)
TOKENS = integer(0, MAX_TOKENS)
POSITIVE_TOKENS = integer(1, MAX_TOKENS)
BLOCKS = integer(1, MAX_BLOCKS, "one object per KV block: more would exhaust memory")
CPU_BLOCKS = integer(0, MAX_BLOCKS, "one object per KV block: more would exhaust memory")
REPLICAS = integer(1, MAX_REPLICAS, REPLICAS_WHY)
FRACTION = number(high=1, above=0)
POSITIVE = number(above=0)
SECONDS = number(low=0)


class OneLineParser(argparse.ArgumentParser):
    """A usage error is one line naming the command and the option, and exit code 2 (argparse's own code); the
    usage text stays behind --help."""

    def error(self, message: str) -> None:  # type: ignore[override]
        prefix = f"{self.prog}: error: "
        self.exit(2, f"{prefix}{bounded(message, MAX_LINE - len(prefix))}\n")


LONG_QUOTED = re.compile(rf"'([^'\n]{{{SHOWN + 1},}})'")


def bounded(message: str, limit: int = MAX_LINE) -> str:
    """argparse quotes a refused value whole (`invalid choice: '<5,000 characters>'`, `unrecognized arguments: ...`):
    each quoted value shortened to about SHOWN characters, the message to `limit` (what the line's prefix leaves of
    MAX_LINE), on one line."""
    message = LONG_QUOTED.sub(lambda m: short_repr(m.group(1), SHOWN), " ".join(message.split()))
    return message if len(message) <= limit else message[:limit - 3] + "..."
