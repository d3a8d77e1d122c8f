"""The `served` fixture: `kvplan serve` on tiny-llama in a subprocess, shared by a module's tests."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.engine.serving.servers import TINY, free_port, wait_healthy


@pytest.fixture(scope="module")
def served(tiny_models):
    """`kvplan serve` on tiny-llama in a subprocess: (url, served model name, model path)."""
    port = free_port()
    model = tiny_models["tiny-llama"]
    command = [sys.executable, "-m", "kvplan", "serve", "--model", model, "--served-model-name", "tiny", "--port",
               str(port), "--log-level", "warning", *TINY]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process)
        yield url, "tiny", model
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
