"""`kvplan serve` started as a subprocess on a free loopback port, for load tests and the serving tests.

Start-up has a deadline: the server must answer GET /health with 200 within `startup_s` of its start, each poll
bounded like every other call (kvplan.endpoint.http_limits). A server that exits first, or is not healthy by
then, is a `ServerStartError` (a UserError: one line, exit 2) quoting the last lines of its log: the child writes
to a temporary file rather than a pipe, so its log can be read while it runs (and a chatty child never blocks on
a full pipe).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvplan.endpoint.http_limits import ServerFault, fetch
from kvplan.errors import UserError

POLL_S = 0.2  # between two /health polls
POLL_TIMEOUT_S = 2.0  # one /health poll (a starting server answers at once or not at all)
LOG_LINES = 5  # quoted from the log of a server that did not come up
LOG_TAIL_BYTES = 8192  # read from the end of the log for them


class ServerStartError(UserError):
    """A local server that exited during start-up or was not healthy by its deadline."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last_lines(log: Path | None, count: int = LOG_LINES) -> str:
    """The last `count` non-empty lines of `log`, joined by " | " (one line for a message); read from its last
    LOG_TAIL_BYTES only, however large it grew."""
    if log is None:
        return "(no log)"
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            tail = f.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"(its log is unreadable: {exc.strerror})"
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return " | ".join(lines[-count:]) if lines else "(it wrote nothing)"


def wait_healthy(url: str, process: subprocess.Popen | None = None, timeout_s: float = 120.0,
                 log: Path | None = None) -> None:
    """Poll GET /health until 200, at most `timeout_s` in all; a process that exits first, or a server not
    healthy by then, is a ServerStartError with the last lines of `log`."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process is not None and process.poll() is not None:
            raise ServerStartError(f"kvplan serve exited with status {process.returncode} during start-up; its "
                                   f"last log lines: {last_lines(log)}")
        left = deadline - time.monotonic()
        if left <= 0:
            raise ServerStartError(f"kvplan serve did not answer GET {url}/health within {timeout_s:g} s of its "
                                   f"start; its last log lines: {last_lines(log)}")
        with contextlib.suppress(ServerFault):
            if fetch("GET", f"{url}/health", min(POLL_TIMEOUT_S, left)).status == 200:
                return
        time.sleep(max(0.0, min(POLL_S, deadline - time.monotonic())))


@contextlib.contextmanager
def server_process(model: str, engine_args: list[str], startup_s: float = 300.0):
    """`kvplan serve --model MODEL ENGINE_ARGS` on a free loopback port; yields its URL, stops it afterwards."""
    port = free_port()
    command = [sys.executable, "-m", "kvplan", "serve", "--model", model, "--port", str(port), "--log-level",
               "warning", *engine_args]
    with tempfile.TemporaryDirectory(prefix="kvplan-serve-") as folder:
        log = Path(folder) / "serve.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT,
                                       env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, process, startup_s, log)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
