"""The main job stays light: scripts/demo.sh installs the package without extras (no torch, nothing compiled),
and the quickstart it runs - resolving the experiment, simulating a probe, writing the answer - never imports
torch, Triton or transformers (they are blocked here: an import would fail the run)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.core.test_no_torch import BLOCK_TORCH

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


def test_demo_installs_light_and_builds_nothing():
    demo = (SCRIPTS / "demo.sh").read_text()
    assert re.search(r"^bash scripts/install\.sh --light$", demo, re.M), demo
    assert "kernel_build" not in demo and not re.search(r"install\.sh\s*$", demo, re.M)
    install = (SCRIPTS / "install.sh").read_text()
    light = re.search(r'^if \[ "\$light" = 1 \]; then\n(.*?)^  exit 0\n', install, re.M | re.S)
    assert light, "install.sh has no light branch that ends in `exit 0`"
    pips = [line for line in light.group(1).splitlines() if "pip_install" in line]
    assert len(pips) == 1 and re.search(r"pip_install (--no-compile )?-e \.(\s|$)", pips[0]), pips  # no extra
    assert not re.search(r"torch|triton|kernel_build|\[", light.group(1))
    assert install.index("kernel_build") > light.end()  # the full install's step only


RUN = BLOCK_TORCH + """
from pathlib import Path
from kvplan.cli import main
from kvplan.commands.run import load
from kvplan.experiments.execute import execute_run
from kvplan.experiments.points import run_config
import kvplan.experiments.report, kvplan.experiments.runner  # what runs the searches and writes the answer

quickstart, out = sys.argv[1:]
assert main(["run", quickstart, "--explain"]) == 0
exp, points = load(Path(quickstart))
config = run_config(points[0].config, exp.seeds[0], {"workload.rate": exp.search["low"]})
doc = execute_run(config, out, tables=False)
print("completed", doc["summary"]["completed"], "verdict", doc["probe"]["verdict"])
"""


def test_the_quickstart_runs_without_torch(tmp_path):
    done = subprocess.run([sys.executable, "-c", RUN, str(ROOT / "experiments" / "quickstart.yaml"),
                           str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert re.search(r"completed [1-9]\d* verdict stable", done.stdout), done.stdout
