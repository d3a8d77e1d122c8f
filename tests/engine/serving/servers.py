"""An in-process server on a thread, for serving tests that need a special configuration (the `served` fixture in
conftest.py runs the real `kvplan serve` command). Loopback only, on free ports."""

from __future__ import annotations

import contextlib
import threading

from kvplan.endpoint.local_server import free_port, wait_healthy

TINY = ["--dtype", "float32", "--block-size", "8", "--num-blocks", "64", "--max-num-batched-tokens", "64",
        "--max-model-len", "320"]


@contextlib.contextmanager
def thread_server(llm, name: str = "tiny", max_queue_len: int = 1024):
    """An in-process server (uvicorn on a thread, the engine on its own): yields (url, AsyncEngine)."""
    import uvicorn

    from kvplan.engine.serving.app import build_app
    from kvplan.engine.serving.server import make_engine

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
