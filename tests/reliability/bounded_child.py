"""One child process for a fuzz suite, under resource limits: every example of the suite runs inside it, so the
address-space limit (RLIMIT_AS) and the wall-clock timeout bound each example's memory and time, and a child
start (~1-2 s) is paid once per suite, not once per example.

The child calls `kvplan.cli.main` in-process, as the command line would, and records each example whose outcome is
neither success (exit 0) nor a rejection (exit 2 with exactly one line on stderr): a traceback, an exit 1, an
exception escaping `main`, or an example slower than PER_EXAMPLE_S. It prints the failures as JSON on its last
stdout line; the test asserts there are none.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Measured: importing kvplan.cli and running `trace stats`, `simulate` and `run --explain` in one process peaks at
# 1.5 GB of address space (VmPeak; pandas, pyarrow and numpy map much more than they touch). 3 GiB leaves 1.5 GB
# for what one example may take: a bomb that is not refused while streaming exceeds it and fails the test.
ADDRESS_SPACE = 3 * 2**30
PER_EXAMPLE_S = 10.0  # one in-process command on a few-KB input takes ~0.01-0.2 s here
MARK = "FUZZ-REPORT "
CHECKED = [0]  # examples run in this process


def run_suite(script: Path, timeout_s: float, tmp: Path) -> tuple[int, list[dict]]:
    """Run `script --child` in one child under the limits: (examples it ran, the failures it reports). A crash of
    the child itself, or running past `timeout_s`, is a failure with the child's stderr."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    # One thread per math library and two malloc arenas: address space then grows with what the examples take, not
    # with the CI machine's core count (each thread reserves a stack, each arena 64 MiB of address space).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "MALLOC_ARENA_MAX": "2"}
    try:
        proc = subprocess.run([sys.executable, str(script), "--child"], cwd=tmp, env=env, capture_output=True,
                              text=True, timeout=timeout_s, preexec_fn=limit)
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else str(exc.stderr or "")
        return 0, [{"case": "the whole suite", "problem": f"ran past {timeout_s} s (the last example started hung)",
                    "stderr": stderr[-3000:]}]
    reports = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode != 0 or not reports:
        return 0, [{"case": "the child", "problem": f"exit {proc.returncode} without a report",
                    "stderr": proc.stderr[-3000:]}]
    result = json.loads(reports[-1][len(MARK):])
    return result["checked"], result["failures"]


def check_suite(script: Path, timeout_s: float, tmp: Path, minimum: int) -> None:
    """The test of a fuzz suite: `script`'s child ran at least `minimum` examples (every strategy ran) and reported
    no failure; the first five failures are the assertion's message."""
    checked, failures = run_suite(script, timeout_s, tmp)
    assert not failures, "\n\n".join(f"{f['case']!r}\n{f.get('argv', '')}\n{f['problem']}\n{f['stderr']}"
                                     for f in failures[:5])
    assert checked >= minimum, f"{checked} examples ran; expected at least {minimum}"


def report(failures: list[dict]) -> None:
    """The child's last stdout line."""
    print(MARK + json.dumps({"checked": CHECKED[0], "failures": failures}), flush=True)


def run_cli(argv: list[str]) -> tuple[int | None, str, float]:
    """(exit status or None when an exception escaped, stderr, seconds) of `kvplan ARGV` in this process."""
    from kvplan import cli

    out, err = io.StringIO(), io.StringIO()
    start = time.monotonic()
    status: int | None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = cli.main(argv)
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 2
    except BaseException:
        status = None
        err.write(traceback.format_exc())
    return status, err.getvalue(), time.monotonic() - start


def problem(status: int | None, stderr: str, seconds: float) -> str | None:
    """None when the outcome is one the contract allows: success, or one line and exit 2."""
    if seconds > PER_EXAMPLE_S:
        return f"took {seconds:.1f} s (allowed: {PER_EXAMPLE_S} s)"
    if status == 0:
        return None
    lines = stderr.strip().splitlines()
    if status == 2 and len(lines) == 1 and ": error: " in lines[0]:
        return None
    return f"exit {status} with {len(lines)} stderr lines"


def check(case: str, argv: list[str], failures: list[dict]) -> None:
    """Run one example; record it in `failures` when its outcome breaks the contract."""
    CHECKED[0] += 1
    # The child's own stderr: the parent shows its tail when the suite runs past its timeout (the case that hung).
    print(f"example {CHECKED[0]}: {argv} {case[:300]!r}", file=sys.__stderr__, flush=True)
    status, stderr, seconds = run_cli(argv)
    found = problem(status, stderr, seconds)
    if found is not None:
        failures.append({"case": case[:2000], "argv": argv, "problem": found, "stderr": stderr[-2500:]})
