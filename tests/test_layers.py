"""The layers import downward only: leaves (`kvplan.errors`, `kvplan.limits`, `kvplan.output`) <- traces <- the
core (`kvplan.engine.core`) <- the simulator and the engine <- the application (`kvplan.live`, experiments,
calibration, endpoint replay, commands, the CLI). Checked on the source, late imports included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
APP = ("kvplan.cli", "kvplan.commands", "kvplan.experiments", "kvplan.live", "kvplan.calibration",
       "kvplan.endpoint", "kvplan.bench", "kvplan.engine_args", "kvplan.settings_cli", "kvplan.trace_options",
       "kvplan.validation", "kvplan.arg_types")
# a package -> what it must not import
RULES = {
    "traces": ("kvplan.engine", "kvplan.sim", "kvplan.kernels", "kvplan.serving_result", *APP),
    "engine/core": ("kvplan.engine.llm", "kvplan.engine.models", "kvplan.engine.serving", "kvplan.sim",
                    "kvplan.kernels", "kvplan.traces", "kvplan.serving_result", "torch", *APP),
    "kernels": ("kvplan.engine", "kvplan.sim", "kvplan.traces", *APP),
    "sim": ("kvplan.engine.llm", "kvplan.engine.models", "kvplan.engine.serving", "torch", *APP),
    "engine": ("kvplan.sim", *APP),
}


def imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


@pytest.mark.parametrize("package", list(RULES))
def test_a_layer_imports_nothing_above_it(package):
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in imports(path):
            if any(name == banned or name.startswith(banned + ".") for banned in RULES[package]):
                bad.append(f"{path.relative_to(ROOT)}: {name}")
    assert not bad, bad


def test_nothing_imports_the_subsystems_by_their_folder_names():
    """Installed, there is no top-level `engine`/`sim`/`traces`/`kernels`: only `kvplan.<name>`."""
    bad = []
    for folder in ("engine", "sim", "traces", "kernels", "kvplan", "tests", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            bad += [f"{path.relative_to(ROOT)}: {name}" for name in imports(path)
                    if name.split(".")[0] in ("engine", "sim", "traces", "kernels")]
    assert not bad, bad
