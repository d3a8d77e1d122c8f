"""The `kvplan` script's choice of serving core (kvplan/launch.py): a build runs only while it is current, and the
script reaches it by re-executing itself with the build first on PYTHONPATH, never by editing the import system."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvplan import launch

ROOT = Path(__file__).resolve().parents[1]


def fake_checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    (root / "kvplan" / "core").mkdir(parents=True)
    (root / "kvplan" / "__pycache__").mkdir()
    (root / "scripts").mkdir()
    (root / "kvplan" / "core" / "fast.py").write_text("x = 1\n")
    (root / "kvplan" / "slow.py").write_text("y = 1\n")
    (root / "scripts" / "build_compiled_core.sh").write_text("# build\n")
    return root


COMPILED = ["kvplan/core/fast.py"]


def stamp(build: Path, root: Path, digest: str | None = None) -> None:
    build.mkdir(exist_ok=True)
    doc = {"digest": digest or launch.source_digest(COMPILED, root), "root": str(root), "compiler": "mypyc",
           "compiled": COMPILED}
    (build / launch.STAMP).write_text(json.dumps(doc))


def test_the_digest_follows_what_a_build_depends_on(tmp_path):
    root = fake_checkout(tmp_path)
    first = launch.source_digest(COMPILED, root)
    assert launch.source_digest(COMPILED, root) == first
    (root / "kvplan" / "slow.py").write_text("y = 2\n")  # interpreted: the build links to it, so it stays current
    (root / "kvplan" / "__pycache__" / "slow.cpython-311.pyc").write_bytes(b"\0")
    assert launch.source_digest(COMPILED, root) == first
    changes = [lambda: (root / "kvplan" / "core" / "fast.py").write_text("x = 2\n"),  # a compiled module
               lambda: (root / "kvplan" / "new.py").write_text(""),  # a file the mirror lacks
               lambda: (root / "kvplan" / "slow.py").unlink(),  # a link left dangling
               lambda: (root / "scripts" / "build_compiled_core.sh").write_text("# build 2\n")]
    seen = {first}
    for change in changes:
        change()
        digest = launch.source_digest(COMPILED, root)
        assert digest not in seen
        seen.add(digest)


def test_a_build_runs_only_while_current(tmp_path):
    root, build = fake_checkout(tmp_path), tmp_path / "build"
    assert launch.build_status(build, root).startswith("no finished build")
    stamp(build, root)
    assert launch.build_status(build, root) == ""
    (root / "kvplan" / "core" / "fast.py").write_text("x = 3\n")
    assert "out of date" in launch.build_status(build, root)
    stamp(build, fake_checkout(tmp_path / "elsewhere"))
    assert "another checkout" in launch.build_status(build, root)
    (build / launch.STAMP).write_text("{not json")
    assert launch.build_status(build, root).startswith("unreadable stamp")
    (build / launch.STAMP).write_text(json.dumps({"root": str(root), "digest": "x"}))  # no module list
    assert "out of date" in launch.build_status(build, root)


def test_the_script_reexecutes_into_a_current_build_once(tmp_path, monkeypatch):
    build = tmp_path / "build"
    build.mkdir()
    compiled = ["kvplan/launch.py"]  # any module of this checkout: the stamp is what is checked
    assert launch._tool(["stamp", str(build), launch.source_digest(compiled), "mypyc", *compiled]) == 0
    assert not (build / (launch.STAMP + ".partial")).exists()
    assert launch._tool(["status", str(build)]) == 0
    assert launch.chosen_build({}, build) == build
    assert launch.chosen_build({launch.PURE_ENV: "1"}, build) is None
    assert launch.chosen_build({launch.ACTIVE_ENV: str(build)}, build) is None  # the re-executed process itself

    calls = []
    monkeypatch.setattr(launch, "default_build", lambda: build)
    monkeypatch.setattr(os, "execve", lambda *args: calls.append(args))
    monkeypatch.setattr(sys, "argv", ["/venv/bin/kvplan", "run", "x.yaml"])
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    monkeypatch.delenv(launch.PURE_ENV, raising=False)
    monkeypatch.delenv(launch.ACTIVE_ENV, raising=False)
    monkeypatch.setattr("kvplan.cli.main", lambda: 7)  # what runs when execve returns (only this fake one does)
    assert launch.main() == 7
    (executable, argv, env), = calls
    assert executable == sys.executable and argv == [sys.executable, "/venv/bin/kvplan", "run", "x.yaml"]
    assert env["PYTHONPATH"] == os.pathsep.join([str(build), "/somewhere"]) and env[launch.ACTIVE_ENV] == str(build)


def test_status_refuses_a_missing_build(tmp_path, capsys):
    assert launch._tool(["status", str(tmp_path / "none")]) == 1
    assert "no finished build" in capsys.readouterr().out
    assert launch._tool(["bogus"]) == 2


def test_the_script_names_the_core_it_runs():
    """End to end, on this venv's own build (scripts/install.sh makes it): the script runs the compiled core while
    the build is current, the pure one when told to."""
    script = Path(sys.prefix) / "bin" / "kvplan"
    why = launch.build_status(launch.default_build())
    if why or not script.is_file():
        pytest.skip(f"no current compiled build to run: {why or f'{script} missing'} (scripts/install.sh builds it)")
    env = {k: v for k, v in os.environ.items() if k not in (launch.PURE_ENV, launch.ACTIVE_ENV, "PYTHONPATH")}
    compiled = subprocess.run([str(script), "--version"], capture_output=True, text=True, env=env, cwd="/")
    assert compiled.returncode == 0
    assert compiled.stdout.strip().endswith(f"(serving core: compiled, {launch.default_build()})")
    pure = subprocess.run([str(script), "--version"], capture_output=True, text=True, cwd="/",
                          env={**env, launch.PURE_ENV: "1"})
    assert pure.returncode == 0 and pure.stdout.strip().endswith("(serving core: pure Python)")
