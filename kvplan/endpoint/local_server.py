"""`kvplan serve` started as a subprocess on a free loopback port, for load tests and the serving tests."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, process: subprocess.Popen | None = None, timeout_s: float = 120.0) -> None:
    """Poll GET /health until 200; a server process that exits first is an error with its output."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"kvplan serve exited with {process.returncode}: {process.stdout.read()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not become healthy in {timeout_s} s")
        time.sleep(0.2)


@contextlib.contextmanager
def server_process(model: str, engine_args: list[str], startup_s: float = 300.0):
    """`kvplan serve --model MODEL ENGINE_ARGS` on a free loopback port; yields its URL, stops it afterwards."""
    port = free_port()
    command = [sys.executable, "-m", "kvplan", "serve", "--model", model, "--port", str(port), "--log-level",
               "warning", *engine_args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process, startup_s)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
