"""The layers import downward only: leaves (`kvplan.errors`, `kvplan.limits`, `kvplan.output`, `kvplan.shipped`,
`kvplan.strict_json`) <- traces <- the core (`kvplan.engine.core`) <- results (`kvplan.results`: what serving a
trace produced, whoever served it) <- the simulator and the engine <- the application (`kvplan.live`,
experiments, calibration, endpoint replay, commands, the CLI). Checked on the source, late imports included.
Modules are found the plain way: every module's name is its path under `kvplan/`."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
APP = ("kvplan.cli", "kvplan.commands", "kvplan.experiments", "kvplan.live", "kvplan.calibration",
       "kvplan.endpoint", "kvplan.bench", "kvplan.engine_args", "kvplan.settings_cli", "kvplan.trace_options",
       "kvplan.validation", "kvplan.arg_types", "kvplan.reference", "kvplan.measured")
LEAVES = ("kvplan.errors", "kvplan.limits", "kvplan.output", "kvplan.ownership", "kvplan.shipped",
          "kvplan.strict_json")
# a package -> what it must not import
RULES = {
    "kvplan/traces": ("kvplan.engine", "kvplan.sim", "kvplan.kernels", "kvplan.results", *APP),
    "kvplan/engine/core": ("kvplan.engine.llm", "kvplan.engine.models", "kvplan.engine.serving", "kvplan.sim",
                    "kvplan.kernels", "kvplan.traces", "kvplan.results", "torch", *APP),
    "kvplan/results": ("kvplan.sim", "kvplan.engine", "kvplan.kernels", "torch", *APP),
    "kvplan/kernels": ("kvplan.engine", "kvplan.sim", "kvplan.traces", *APP),
    "kvplan/sim": ("kvplan.engine.llm", "kvplan.engine.models", "kvplan.engine.serving", "torch", *APP),
    "kvplan/engine": ("kvplan.sim", *APP),
}

# a package -> the prefixes it may import although a rule above bans a shorter one: the core sits below the
# results (their summary names the tier counters as the core fills them), the rest of the engine above them
EXCEPT = {"kvplan/results": ("kvplan.engine.core",)}


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
            if any(name == allowed or name.startswith(allowed + ".") for allowed in EXCEPT.get(package, ())):
                continue
            if any(name == banned or name.startswith(banned + ".") for banned in RULES[package]):
                bad.append(f"{path.relative_to(ROOT)}: {name}")
    assert not bad, bad


@pytest.mark.parametrize("leaf", LEAVES)
def test_a_leaf_imports_only_other_leaves(leaf):
    """...and the package itself, which holds nothing but `__version__`."""
    path = ROOT / (leaf.replace(".", "/") + ".py")
    bad = sorted(name for name in imports(path) if name.split(".")[0] == "kvplan" and name not in (*LEAVES, "kvplan"))
    assert not bad, bad


def test_nothing_imports_the_subsystems_by_their_folder_names():
    """There is no top-level `engine`/`sim`/`traces`/`kernels` module: only `kvplan.<name>`."""
    bad = []
    for folder in ("kvplan", "tests", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            bad += [f"{path.relative_to(ROOT)}: {name}" for name in imports(path)
                    if name.split(".")[0] in ("engine", "sim", "traces", "kernels")]
    assert not bad, bad


def test_code_lives_only_in_the_kvplan_package():
    """The top-level folders beside `kvplan/` hold what is not code (samples, profiles, C++ source, docs): no
    Python module there could shadow an installed package of the same name (PyPI's `traces`, HF's `kernels`)."""
    stray = [str(p.relative_to(ROOT)) for folder in ("engine", "sim", "traces", "kernels", "experiments")
             for p in (ROOT / folder).rglob("*.py")]
    assert not stray, stray


def test_no_import_hooks():
    """Modules resolve by their paths alone: nothing edits the import machinery at run time."""
    hooks = [f"{path.relative_to(ROOT)}" for path in sorted((ROOT / "kvplan").rglob("*.py"))
             if "meta_path" in path.read_text() or "path_hooks" in path.read_text()]
    assert not hooks, hooks


def test_a_module_resolves_from_any_directory_to_its_path():
    """From `/` (the installed package: here the editable install's one path entry) and from the checkout, the
    core's scheduler is the file its name says."""
    code = "import kvplan.engine.core.scheduler as m; print(m.__file__)"
    for cwd in ("/", ROOT):
        found = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, check=True)
        assert Path(found.stdout.strip()) == ROOT / "kvplan" / "engine" / "core" / "scheduler.py"
