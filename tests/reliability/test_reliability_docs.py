"""docs/reliability.md states kvplan's reliability promises, each pointing to the tests that hold it: every
reference names a test that exists, and every promise has one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reliability.md"
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def _tests_in(path: Path) -> set[str]:
    """Names of the test functions (module level and in classes) defined in `path`."""
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")}


def test_every_reference_names_a_test_that_exists() -> None:
    references = REFERENCE.findall(PAGE.read_text())
    assert len(references) >= 10
    missing = [f"{path}::{name}" for path, name in references
               if not (ROOT / path).is_file() or name not in _tests_in(ROOT / path)]
    assert not missing, f"docs/reliability.md points to tests that do not exist: {missing}"


def test_every_promise_points_to_a_test() -> None:
    promises = [line for line in PAGE.read_text().splitlines() if line.startswith("| ") and "---" not in line
                and not line.startswith("| promise")]
    assert promises
    bare = [line[:80] for line in promises if not REFERENCE.search(line)]
    assert not bare, f"promises without a test: {bare}"
