"""The core's, the simulator's and the traces' tests collect where torch is absent, and none of them (nor a
conftest they load) imports torch, Triton or transformers: the everyday lane never pays for torch's import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.core.test_no_torch import BLOCK_TORCH  # a None entry per name: `import torch` raises ImportError

ROOT = Path(__file__).resolve().parents[1]
TORCH_FREE = ("tests/core", "tests/sim", "tests/traces")

COLLECT = """
import pytest
code = pytest.main(["--collect-only", "-p", "no:cacheprovider", *sys.argv[1:]])
loaded = sorted(n for n in ("torch", "triton", "transformers") if sys.modules.get(n) is not None)
print("collected with", int(code), "loaded", loaded)
sys.exit(int(code) or bool(loaded))
"""


@pytest.mark.slow
@pytest.mark.parametrize("blocked", [True, False], ids=["torch-blocked", "torch-installed"])
def test_core_sim_and_traces_tests_collect_without_importing_torch(blocked):
    """Blocked: collection works without torch. Installed: nothing even tries (a guarded import would load it)."""
    code = (BLOCK_TORCH if blocked else "import sys\n") + COLLECT
    result = subprocess.run([sys.executable, "-c", code, *TORCH_FREE], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "collected with 0 loaded []" in result.stdout
    assert all(f"{folder}/" in result.stdout for folder in TORCH_FREE)  # -q lists each file's count
