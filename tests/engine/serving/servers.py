"""Servers for the serving tests: `kvplan serve` itself in a subprocess (the real command, the `served` fixture in
conftest.py), and an in-process server on a thread for cases that need a special configuration. Loopback only,
on free ports."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time

import httpx

TINY = ["--dtype", "float32", "--block-size", "8", "--num-blocks", "64", "--max-num-batched-tokens", "64",
        "--max-model-len", "320"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, process: subprocess.Popen | None = None, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"kvplan serve exited with {process.returncode}: {process.stdout.read()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not become healthy in {timeout_s} s")


@contextlib.contextmanager
def thread_server(llm, name: str = "tiny", max_queue_len: int = 1024):
    """An in-process server (uvicorn on a thread, the engine on its own): yields (url, AsyncEngine)."""
    import uvicorn

    from engine.serving.app import build_app
    from engine.serving.server import make_engine

    engine = make_engine(llm, name, max_queue_len)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(engine, name), host="127.0.0.1", port=port,
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    engine.start()
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout_s=30)
        yield url, engine
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        engine.stop()
