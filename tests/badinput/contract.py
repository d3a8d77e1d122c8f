"""The README's one-line error contract as one check, shared by the sweep modules (test_contract_sweep*.py)."""

from __future__ import annotations

import re
import signal
from pathlib import Path

from kvplan.cli import main

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = str(ROOT / "traces" / "samples" / "chat.jsonl")
LINE_LIMIT = 300
LIMIT_S = 90  # nothing waits forever: a bound, generous for a loaded machine (engine commands load a model)


class Hang(BaseException):
    """Raised by the alarm: not an Exception, so that no handler in kvplan can take it for an error of the input."""
# What a line says about what is allowed (or, for a file that is not there, that it is not).
ALLOWED = re.compile(r"allowed|expected|choose from|must be|no such|needs|only")
# transformers' weight-loading progress bar is not kvplan's line (engine commands refuse after loading a model).
PROGRESS = re.compile(r"^(Loading weights|Writing model shards)|it/s\]$")
HUGE = "9" * 5000
TMP_PATH = re.compile(r"/[^\s'\"]*?/pytest-of-[^/\s]+/pytest-\d+/(?:popen-gw\d+/)?[^/\s'\"]+")


def refused(capsys, argv: list[str], *where: str, tmp: Path | None = None) -> str:
    """Run `kvplan ARGV` and check the one-line contract; returns the line."""
    def hang(signum, frame):
        raise Hang(f"kvplan {' '.join(argv)[:200]} ran past {LIMIT_S} s")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(LIMIT_S)
    try:
        code = main(argv)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not PROGRESS.search(line)]
    assert code == 2 and "Traceback" not in err, err[-3000:]
    assert len(lines) == 1, err[-3000:]
    line = lines[0]
    # `kvplan trace: error:` from the command, `kvplan trace stats: error:` from its sub-parser
    assert re.match(rf"kvplan {re.escape(argv[0])}( [a-z]+)?: error: ", line), line
    # the limit bounds kvplan's words, not the length of a path the user chose: a test's temporary directory counts
    # as one character (pytest-xdist nests it one folder deeper, `popen-gwN/`)
    measured = TMP_PATH.sub("T", line.replace(str(tmp), "T") if tmp is not None else line)
    assert len(measured) <= LINE_LIMIT, f"{len(measured)} characters: {line}"
    assert any(w in line for w in where), f"names none of {where}: {line}"
    assert ALLOWED.search(line), f"does not say what is allowed: {line}"
    return line


