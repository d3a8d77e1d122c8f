"""Test-wide setup: the `engine` marker. Nothing here imports torch: the core's, the simulator's and the traces' tests
collect and run without it (tests/test_no_torch_collection.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.triton_env import interpret_without_gpu

# Idle OpenMP threads (torch's and the CPU decode kernel's) sleep instead of spinning. On a loaded machine - CI shares
# its 2 cores - a spinning thread holds a core the thread with the work needs. Measured: HF beam search (SmolLM2,
# width 4, 16 tokens) 96-109 s spinning against 5-6 s sleeping at a load average of 6-8, 4.6-5.1 s against 1.8-2.4 s
# at 1.5-2; tests/engine 1096 s before, 206 s after (loaded, back to back). The same threads compute the same
# partition of the work either way, so every result is unchanged. Set before anything loads libgomp (nothing here
# imports torch, and this conftest loads before tests/engine's), inherited by the `kvplan` processes tests start.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

TESTS = Path(__file__).resolve().parent
ENGINE_FOLDERS = (TESTS / "engine", TESTS / "kernels")  # every test there runs torch; elsewhere a test is marked


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(folder in item.path.parents for folder in ENGINE_FOLDERS):
            item.add_marker(pytest.mark.engine)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("engine") is not None:
        try:  # TRITON_INTERPRET before the test's first import of kvplan.kernels
            interpret_without_gpu()
        except ImportError:
            pytest.skip("needs torch: the engine extra (pip install 'kvplan[engine]')")
