"""The `kvplan` script's entry point: run the compiled serving core when this environment holds a current build.

`scripts/install.sh` compiles the shared core (`kvplan/engine/core`) and the simulator's step loop with mypyc
(`scripts/build_compiled_core.sh`) into `<venv>/kvplan-compiled/`: a tree that mirrors the package, in which the
compiled modules are C extensions (an extension wins over a `.py` of the same name on import) and every other
file is a link to the checkout's. The script re-executes itself with that tree first on PYTHONPATH when the build
is *current* - its stamp's digest equals the digest of what the checkout holds now: the compiled modules' sources,
the package's file names, the build script and the interpreter - and otherwise runs the pure-Python modules, which
stay the executable specification (tests/core/test_compiled_core.py and tests/sim/test_compiled_sim.py compare
the two). An edit to a compiled module therefore never runs stale: the script falls back to the pure core until
the next install rebuilds; an edit to any other module is live in both (the tree links to it).

Nothing edits the import machinery: each process imports by path, from one tree or the other (tests/test_layers.py).
`import kvplan` and `python -m kvplan` run the pure modules, as tests and tools resolve them; `KVPLAN_PURE_CORE=1`
makes the script do the same. `kvplan --version` names the core a process runs.

    python -m kvplan.launch status [BUILD]                 exit 0 when BUILD (default: this venv's) is current
    python -m kvplan.launch stamp BUILD DIGEST COMPILER MODULE...  mark a finished build (the build script)
    python -m kvplan.launch digest MODULE...               the digest of the checkout's sources now
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout (or site-packages, where no build ever applies)
BUILD_DIR = "kvplan-compiled"  # in the venv: sys.prefix / BUILD_DIR
STAMP = "kvplan-compiled.json"  # in the build, written last: a build without one never ran to its end
BUILD_SCRIPT = Path("scripts") / "build_compiled_core.sh"
INITS_WRITER = Path("kvplan") / "compiled_inits.py"  # rewrites the build's copies: a change to it is a new build
PURE_ENV = "KVPLAN_PURE_CORE"  # set (non-empty): the script runs the pure modules
ACTIVE_ENV = "KVPLAN_CORE_BUILD"  # set by the re-execution: this process already runs the build it names


def default_build() -> Path:
    return Path(sys.prefix) / BUILD_DIR


def source_digest(compiled: list[str], root: Path = ROOT) -> str:
    """sha256 over what a build depends on: the interpreter, the build script and the `__init__` writer it runs
    (`compiled_inits`), the names of every file of the package (the build mirrors them: a file added or removed
    is missing or dangling there), and the bytes of each module it compiles (`compiled`: paths relative to
    `root`)."""
    digest = hashlib.sha256(f"{sys.implementation.cache_tag} {sys.version}\0".encode())
    for part in (root / BUILD_SCRIPT, root / INITS_WRITER):
        digest.update(part.read_bytes() if part.is_file() else b"")
    names = []
    for folder, dirs, files in os.walk(root / "kvplan"):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        base = Path(folder).relative_to(root)
        names.extend(str(base / name) for name in files)
    digest.update("\0".join(sorted(names)).encode())
    for module in sorted(compiled):
        digest.update(f"\0{module}\0".encode())
        digest.update((root / module).read_bytes())
    return digest.hexdigest()


def build_status(build: Path, root: Path = ROOT) -> str:
    """"" when `build` is a finished build of `root`'s current sources; otherwise why not, in a few words."""
    try:
        stamp = json.loads((build / STAMP).read_text())
    except FileNotFoundError:
        return f"no finished build in {build}"
    except (OSError, ValueError) as exc:
        return f"unreadable stamp {build / STAMP}: {exc}"
    if not isinstance(stamp, dict) or stamp.get("root") != str(root):
        return f"{build} was built from another checkout ({stamp.get('root') if isinstance(stamp, dict) else '?'})"
    try:
        current = source_digest(list(stamp["compiled"]), root)
    except (KeyError, TypeError, OSError) as exc:
        return f"{build} is out of date ({exc})"
    return "" if current == stamp.get("digest") else f"{build} is out of date: the sources changed since it was built"


def chosen_build(env: Mapping[str, str], build: Path | None = None) -> Path | None:
    """The build the script should re-execute into, or None (run the pure modules here)."""
    if env.get(PURE_ENV) or env.get(ACTIVE_ENV):
        return None
    build = default_build() if build is None else build
    return build if not build_status(build) else None


def core_module() -> str:
    """The file this process imported `kvplan.engine.core.scheduler` from: its .py, or a build's extension."""
    from kvplan.engine.core import scheduler

    return str(scheduler.__file__)


def core_description() -> str:
    """Which serving core this process runs: the compiled build (named by its folder), or the pure-Python modules."""
    where = core_module()
    return "pure Python" if where.endswith(".py") else f"compiled, {Path(where).parents[3]}"


def main() -> int:
    build = chosen_build(os.environ)
    if build is not None:
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(build), *([path] if path else [])]),
               ACTIVE_ENV: str(build)}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)  # this script again, on the build
    from kvplan.cli import main as cli_main

    return cli_main()


def _tool(argv: list[str]) -> int:
    """The build script's helpers (the module docstring)."""
    if argv[:1] == ["status"] and len(argv) <= 2:
        why = build_status(Path(argv[1]).resolve() if len(argv) == 2 else default_build())
        print(why or "current")
        return 1 if why else 0
    if argv[:1] == ["digest"] and len(argv) >= 2:
        print(source_digest(argv[1:]))
        return 0
    if argv[:1] == ["stamp"] and len(argv) >= 5:
        build, digest, compiler, modules = Path(argv[1]).resolve(), argv[2], argv[3], argv[4:]
        stamp = {"digest": digest, "root": str(ROOT), "compiler": compiler, "compiled": sorted(modules)}
        partial = build / (STAMP + ".partial")
        partial.write_text(json.dumps(stamp, indent=1) + "\n")
        partial.replace(build / STAMP)  # whole or absent
        return 0
    print("usage: python -m kvplan.launch status [BUILD] | digest MODULE... | stamp BUILD DIGEST COMPILER MODULE...",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_tool(sys.argv[1:]))
