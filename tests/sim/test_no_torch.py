"""The simulator imports and runs where torch is absent."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.core.test_no_torch import BLOCK_TORCH  # the same import blocker as the core's test

RUN_SIM = """
import pkgutil, importlib, kvplan.sim
for m in pkgutil.walk_packages(kvplan.sim.__path__, "kvplan.sim."):
    importlib.import_module(m.name)
import kvplan.commands.simulate
from kvplan.sim.run import simulate
from kvplan.sim.spec import SimSpec
from kvplan.traces import Trace
trace = Trace.build([0.0, 0.1, 0.2], [30, 50, 70], [5, 6, 7])
result = simulate(trace, SimSpec(num_blocks=64))
assert sys.modules["torch"] is None  # still the blocking entry: nothing imported torch
print(result.summary["completed"])
"""


def test_sim_imports_and_runs_without_torch():
    result = subprocess.run([sys.executable, "-c", BLOCK_TORCH + RUN_SIM], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "3"


CLI_WITHOUT_ENGINE = """
import contextlib, io, json
from kvplan.cli import main
err = io.StringIO()
with contextlib.redirect_stderr(err):
    code = main(["generate", "--model", "llama-100m", "--prompt", "hi"])
out = io.StringIO()
with contextlib.redirect_stdout(out):
    assert main(["trace", "samples", "--json"]) == 0
samples = json.loads(out.getvalue())
with contextlib.redirect_stdout(io.StringIO()):
    assert main(["trace", "stats", samples[0]["path"]]) == 0
assert sys.modules["torch"] is None  # still the blocking entry: nothing imported torch
print(json.dumps({"code": code, "err": err.getvalue(), "samples": [s["name"] for s in samples]}))
"""


def test_engine_commands_name_the_missing_extra_in_one_line():
    result = subprocess.run([sys.executable, "-c", BLOCK_TORCH + CLI_WITHOUT_ENGINE], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["code"] == 2
    assert doc["err"].count("\n") == 1 and "pip install 'kvplan[engine]'" in doc["err"]
    assert doc["err"].startswith("kvplan generate: error: needs the live engine")
    assert {"mooncake_style", "chat", "azure_style"} <= set(doc["samples"])


def test_version_and_module_entry_point():
    from kvplan import __version__

    result = subprocess.run([sys.executable, "-m", "kvplan", "--version"], capture_output=True, text=True)
    # `python -m kvplan` runs the pure modules (the compiled core is the `kvplan` script's: tests/test_launch.py)
    assert result.returncode == 0 and result.stdout.strip() == f"kvplan {__version__} (serving core: pure Python)"
