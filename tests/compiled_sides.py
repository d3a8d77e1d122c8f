"""A compiled build of the core beside the pure modules: a test module run as a subprocess whose PYTHONPATH puts
the build (scripts/build_compiled_core.sh OUT, named by KVPLAN_COMPILED_CORE) first, answering request lines that
the test also answers in its own, pure process (tests/core/test_compiled_core.py: the scheduler step by step;
tests/sim/test_compiled_sim.py: whole simulations). Skips, saying why, when KVPLAN_COMPILED_CORE is unset or its
build does not compile the modules the test names."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
Ask = Callable[[str], str]


def compiled_side(module: str) -> Iterator[Ask]:
    """A fixture's body: an asker of `module`'s `serve` loop on the compiled build, closed afterwards."""
    build = os.environ.get("KVPLAN_COMPILED_CORE")
    if not build:
        pytest.skip("KVPLAN_COMPILED_CORE is unset: build a compiled core with scripts/build_compiled_core.sh OUT "
                    "and set KVPLAN_COMPILED_CORE=OUT to compare it with the pure core")
    out = Path(build).resolve()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(out), str(ROOT)])}  # the build's kvplan; the tests
    proc = subprocess.Popen([sys.executable, "-m", module], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=str(out))
    assert proc.stdin is not None and proc.stdout is not None
    hello = json.loads(proc.stdout.readline() or "null")
    assert hello is not None, f"{module} died on start on the compiled build (see its stderr above)"
    not_compiled = [path for path in hello if not path.endswith(".so")]
    if not_compiled:
        proc.stdin.close()
        proc.wait(timeout=60)
        pytest.skip(f"KVPLAN_COMPILED_CORE={build} does not compile {not_compiled} (scripts/build_compiled_core.sh "
                    "OUT kvplan/sim/replica.py kvplan/sim/shared_store.py builds the core and the step loop)")

    def ask(line: str) -> str:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        answer = proc.stdout.readline()
        assert answer, f"{module} died on the compiled build on {line[:200]}"
        return answer.rstrip("\n")

    yield ask
    proc.stdin.close()
    proc.wait(timeout=60)


def serve(answer: Ask, modules: tuple[str, ...]) -> None:
    """The compiled side's loop: say where `modules` were loaded from, then answer each line of stdin with one."""
    print(json.dumps([importlib.import_module(name).__file__ for name in modules]), flush=True)
    for line in sys.stdin:
        print(answer(line.rstrip("\n")), flush=True)
