"""The `served` fixture: `kvplan serve` on tiny-llama in a subprocess (the real command), shared by a module's
tests."""

from __future__ import annotations

import pytest

from kvplan.endpoint.local_server import server_process
from tests.engine.serving.servers import TINY


@pytest.fixture(scope="module")
def served(tiny_models):
    """(url, served model name, model path)."""
    model = tiny_models["tiny-llama"]
    with server_process(model, ["--served-model-name", "tiny", *TINY], startup_s=120) as url:
        yield url, "tiny", model
