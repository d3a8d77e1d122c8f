"""engine.core must import, and run, where torch is absent."""

from __future__ import annotations

import subprocess
import sys

BLOCK_TORCH = """
import sys
for name in ("torch", "triton", "transformers"):  # a None entry makes `import name` (and its submodules) fail
    sys.modules[name] = None
"""

IMPORT_ALL = """
import pkgutil, importlib, kvplan.engine.core
names = [m.name for m in pkgutil.walk_packages(kvplan.engine.core.__path__, "kvplan.engine.core.")]
for name in names:
    importlib.import_module(name)
from kvplan.engine.core import Scheduler, make_request
s = Scheduler()
s.add_request(make_request("r", prompt_len=20, max_tokens=3))
while s.has_unfinished():
    s.update(s.schedule())
assert sys.modules["torch"] is None  # still the blocking entry: nothing imported torch
print(len(names))
"""


def test_engine_core_imports_and_runs_without_torch():
    result = subprocess.run([sys.executable, "-c", BLOCK_TORCH + IMPORT_ALL], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) >= 10


def test_the_blocker_really_blocks_torch():
    result = subprocess.run([sys.executable, "-c", BLOCK_TORCH + "import torch"], capture_output=True, text=True)
    assert result.returncode != 0 and "import of torch halted" in result.stderr
