"""The simulator imports and runs where torch is absent."""

from __future__ import annotations

import subprocess
import sys

from tests.core.test_no_torch import BLOCK_TORCH  # the same import blocker as the core's test

RUN_SIM = """
import pkgutil, importlib, sim
for m in pkgutil.walk_packages(sim.__path__, "sim."):
    importlib.import_module(m.name)
import kvplan.commands.simulate
from sim.run import SimSpec, simulate
from traces import Trace
trace = Trace.build([0.0, 0.1, 0.2], [30, 50, 70], [5, 6, 7])
result = simulate(trace, SimSpec(num_blocks=64))
assert "torch" not in sys.modules
print(result.summary["completed"])
"""


def test_sim_imports_and_runs_without_torch():
    result = subprocess.run([sys.executable, "-c", BLOCK_TORCH + RUN_SIM], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "3"
