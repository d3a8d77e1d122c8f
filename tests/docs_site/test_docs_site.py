"""The README and the documentation site: the README stays short, lists every bundled experiment, and shows only
commands that a test or CI runs; its links resolve; every quoted output is a marked block that
scripts/docs_outputs.py regenerates (and has been filled); the site's nav and pages agree. The strict site build
itself (`mkdocs build --strict`, ~5 s) runs in .ci/run, not here."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import yaml

from kvplan.cli import main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# Pages another part of the project adds: the reference pages, generated at build time by the mkdocs hook.
GENERATED = {f"reference/{name}.md" for name in ("settings", "cli", "schema", "metrics", "models", "hardware")}


def docs_outputs() -> ModuleType:
    """scripts/docs_outputs.py as a module (registered first: its dataclass looks its module up by name)."""
    if "docs_outputs" not in sys.modules:
        spec = importlib.util.spec_from_file_location("docs_outputs", ROOT / "scripts" / "docs_outputs.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["docs_outputs"] = module
        spec.loader.exec_module(module)
    return sys.modules["docs_outputs"]


def bash_commands(text: str) -> list[str]:
    """Every command line of the ```bash blocks (comments and blank lines left out)."""
    lines: list[str] = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M):
        lines += [line.strip() for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return lines


def test_the_readme_is_at_most_200_lines():
    assert len(README.read_text().splitlines()) <= 200


def test_the_readme_lists_every_experiment_as_the_script_writes_the_table():
    text = README.read_text()
    table = re.search(r"<!-- experiments-table -->\n(.*?)<!-- /experiments-table -->", text, re.S)
    assert table is not None, "README.md has no experiments table markers"
    for path in (ROOT / "experiments").glob("*.yaml"):
        assert f"`experiments/{path.name}`" in table.group(1), f"README.md's table lacks experiments/{path.name}"
    assert table.group(1) == docs_outputs().experiments_table(), \
        "README.md's experiments table is stale: run python scripts/docs_outputs.py --only help"


def test_every_command_the_readme_shows_runs_in_ci_or_here(capsys):
    """A command is run by .ci/run (checked: it is a line there) or by this test (in-process, cheap)."""
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    quickstart = str(ROOT / "experiments" / "quickstart.yaml")
    run_here = {"kvplan --help": ["--help"],
                "kvplan run experiments/quickstart.yaml --explain": ["run", quickstart, "--explain"]}
    commands = bash_commands(README.read_text())
    assert "bash scripts/demo.sh" in commands and "bash scripts/test.sh" in commands
    for command in commands:
        if command in run_here:
            try:
                code = main(run_here[command])
            except SystemExit as exit_:  # argparse's --help exits
                code = exit_.code
            assert code in (0, None), command
            assert capsys.readouterr().out.strip(), f"`{command}` printed nothing"
        else:
            assert any(line.strip().startswith(command) for line in ci), \
                f"README.md shows `{command}`, which neither .ci/run nor tests/docs_site runs"


def test_the_readmes_links_resolve():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text()):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README.md links to {target}, which does not exist"


def test_every_quoted_output_is_a_known_filled_block():
    module = docs_outputs()
    used = module.used_names()
    assert set(used) <= set(module.OUTPUTS), f"unknown outputs: {set(used) - set(module.OUTPUTS)}"
    assert set(module.OUTPUTS) <= set(used), f"outputs on no page: {set(module.OUTPUTS) - set(used)}"
    for page in module.PAGES:
        text = page.read_text()
        assert text.count("<!-- output: ") == text.count("<!-- /output -->"), f"{page}: unbalanced output markers"
        for match in module.MARK.finditer(text):
            body = match.group("body")
            command = module.OUTPUTS[match.group("name")].command
            assert body.startswith(f"```text\n$ {command}\n"), \
                f"{page}: output {match.group('name')} was never generated"


def test_the_nav_and_the_pages_agree():
    """Every nav entry is a page (or a generated reference page), and every top-level page is in the nav."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def entries(nav) -> list[str]:
        found: list[str] = []
        for item in nav:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            found += entries(value) if isinstance(value, list) else [value]
        return found

    nav = entries(config["nav"])
    assert len(nav) == len(set(nav)), "a page is in the nav twice"
    for page in nav:
        assert page in GENERATED or (DOCS / page).is_file(), f"mkdocs.yml's nav names {page}, which does not exist"
    for path in DOCS.glob("*.md"):
        assert path.name in nav, f"docs/{path.name} is not in mkdocs.yml's nav"
    assert len(nav) >= 10
    assert config["strict"] is True and config["theme"]["name"] == "material"


def test_the_docs_examples_load_and_build_their_points(capsys):
    """The smaller experiments the docs pages run (docs/examples/*.yaml) stay valid as the schema changes."""
    examples = sorted((DOCS / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        assert main(["run", str(path), "--explain"]) == 0, path
        assert f"experiment {yaml.safe_load(path.read_text())['name']}:" in capsys.readouterr().out
