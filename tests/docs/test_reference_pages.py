"""The docs site's reference pages (kvplan.reference) follow the code: a setting or a flag added in code is on the
next page, every declared name is on its page, the result tables' columns all have a meaning, the tables stay
tables in Python-Markdown, and mkdocs builds the six pages through the hook with --strict."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from kvplan.cli import build_parser, main
from kvplan.engine.core.settings import SETTINGS, Setting
from kvplan.experiments import schema
from kvplan.reference import PAGES, pages
from kvplan.reference.cells import table
from kvplan.reference.cli_page import cli_page, commands, visible
from kvplan.reference.columns import MIN_COST_SEARCH, POINT_COLUMNS, RATE_SEARCH, RUN_COLUMNS, undocumented
from kvplan.reference.settings_page import settings_page
from kvplan.results.summary import SUMMARY_HELP, SUMMARY_KEYS
from kvplan.sim.specs.hardware import HARDWARE
from kvplan.sim.specs.models import MODELS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built() -> dict[str, str]:
    return pages()


def test_a_setting_added_to_the_registry_is_on_the_settings_and_cli_pages(monkeypatch):
    fake = Setting("int", 7, name="fake_knob", help="a knob only this test has", flag="--fake-knob",
                   sides=frozenset({"sim"}), minimum=1, maximum=9, unit="blocks")
    assert "fake_knob" not in settings_page()
    monkeypatch.setitem(SETTINGS, "fake_knob", fake)
    page = settings_page()
    assert "### fake_knob" in page and "A knob only this test has." in page
    row = next(line for line in page.splitlines() if line.startswith("| [`fake_knob`]"))
    assert row == "| [`fake_knob`](#fake_knob) | kvplan only | int | `7` | blocks | sim |"
    assert "an integer >= 1 and <= 9" in page and "experiment key `engine.fake_knob`" in page
    # the simulator's parser takes every sim setting as a flag: the new one is a `kvplan simulate` option
    assert "| `--fake-knob` | `FAKE_KNOB` | a knob only this test has (default: 7) |" in cli_page()
    assert "- **Commands:** `kvplan simulate`" in page.split("### fake_knob")[1]


def test_a_flag_added_to_a_parser_is_on_the_cli_page():
    parser = build_parser()
    run = next(sub for prog, sub, _, _ in commands(parser) if prog == "kvplan run")
    assert "--fake-flag" not in cli_page(parser)
    run.add_argument("--fake-flag", choices=("a|b", "c"), default="c", help="a flag only this test has")
    section = cli_page(parser).split("## kvplan run")[1].split("## kvplan trace")[0]
    assert "| `--fake-flag` | `a|b`, `c` | a flag only this test has (default: `c`) |" in section


def test_every_declared_name_is_on_its_page(built):
    settings, cli, schema_md, metrics, models, hardware = (built[path] for path in PAGES)
    assert all(f"### {name}\n" in settings for name in SETTINGS)
    parser = build_parser()
    found = list(commands(parser))
    assert len(found) >= 20  # 11 commands and the subcommands of trace and bench
    for prog, sub, _, depth in found:
        assert f"\n{'#' * (depth + 2)} {prog}\n" in cli, prog
        section = cli.split(f" {prog}\n", 1)[1]
        options = [o for a in sub._actions if visible(a) and not isinstance(a, argparse._HelpAction)
                   for o in a.option_strings]
        assert all(f"`{o}`" in section for o in options), prog
    keys = [*schema.TOP_KEYS, *(f"{section}.{k}" for section, fields in (
        ("cluster", schema.CLUSTER), ("workload", schema.TRACE_LOAD), ("workload", schema.LOAD),
        ("probe", schema.PROBE), ("search", schema.SEARCH), ("slo.attainment", schema.ATTAINMENT),
        ("objective", schema.OBJECTIVE), ("outputs", schema.OUTPUTS), ("engine", schema.ENGINE),
        ("slo", schema.SLO_KEYS)) for k in fields), *schema.SEARCH_TARGETS, *schema.SWEEPABLE]
    assert [k for k in keys if f"`{k}`" not in schema_md and not k.startswith("engine.")] == []
    assert all(f"`engine.{k}`" in schema_md for k in schema.ENGINE)
    assert all(f"| `{key}` |" in metrics for key in SUMMARY_KEYS)
    assert all(f"| `{name}` |" in models for name in MODELS)
    assert all(f"| `{name}` |" in hardware for name in HARDWARE)


def test_every_summary_metric_and_every_schema_key_has_a_meaning():
    assert set(SUMMARY_HELP) == set(SUMMARY_KEYS), "a summary key needs (unit, meaning) in SUMMARY_HELP"
    assert all(unit and meaning for unit, meaning in SUMMARY_HELP.values())
    fields = [schema.TOP, schema.CLUSTER, schema.TRACE_LOAD, schema.LOAD, schema.PROBE, schema.SEARCH,
              schema.ATTAINMENT, schema.OBJECTIVE, schema.OUTPUTS]
    assert [k for section in fields for k, f in section.items() if not f.help] == []


def test_every_number_setting_states_its_unit_and_vllm_names_are_names():
    assert [s.name for s in SETTINGS.values() if s.kind in ("int", "float", "bytes") and not s.unit] == []
    assert [s.name for s in SETTINGS.values() if s.kind in ("bool", "choice", "str") and s.unit] == []
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", s.vllm) for s in SETTINGS.values() if s.vllm)
    assert SETTINGS["block_size"].vllm == "block_size" and SETTINGS["eviction_policy"].vllm == ""
    assert SETTINGS["num_blocks"].vllm == "num_gpu_blocks_override"


def test_every_column_of_the_result_tables_has_a_meaning(tmp_path, capsys):
    """A replica search (every search column, the min_replicas ones too) over a one-value sweep (a swept-key
    column): runs.parquet and points.parquet hold exactly the columns `reference.columns` describes."""
    (tmp_path / "t.yaml").write_text(yaml.safe_dump({
        "name": "t", "model": "llama-3-8b", "hardware": "a100-40gb", "engine": {"entry_point": "engine"},
        "workload": {"mode": "burst", "synthetic": {
            "seed": 4, "requests": 40, "arrivals": {"process": "poisson", "rate": 4},
            "lengths": {"prompt": {"dist": "lognormal", "median": 300, "sigma": 0.6, "max": 2000},
                        "output": {"dist": "lognormal", "median": 30, "sigma": 0.5, "max": 200}}}},
        "sweep": {"grid": {"engine.block_size": [16]}},
        "search": {"target": "min_replicas", "low": 1, "high": 4}, "slo": {"p90_ttft_ms": 500}, "seeds": [0],
        "outputs": {"plots": False, "report": False}}))
    assert main(["run", str(tmp_path / "t.yaml"), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    capsys.readouterr()
    for name, declared in (("runs", RUN_COLUMNS), ("points", POINT_COLUMNS)):
        columns = pd.read_parquet(tmp_path / "out" / f"{name}.parquet").columns
        # (tests/experiments/test_min_cost.py and test_pd_experiments.py check those)
        absent = (MIN_COST_SEARCH, RATE_SEARCH) if name == "points" else ()
        assert undocumented(columns, declared, absent) == ([], []), f"{name}.parquet: (undescribed, no longer there)"


def test_a_cell_with_pipes_and_tags_stays_one_cell():
    markdown = pytest.importorskip("markdown")
    lines = table(["a", "b"], [["x | y <b> *z*", "`p|q`"], ["two\nlines", ""]])
    html = markdown.markdown("\n".join(lines), extensions=["tables"])
    assert html.count("<td>") == 4 and "<b>" not in html and "<em>" not in html
    assert "<td>x | y &lt;b&gt; *z*</td>" in html and "<td><code>p|q</code></td>" in html
    assert "<td>two lines</td>" in html
    with pytest.raises(ValueError, match="a row of 1 cells in a table of 2 columns"):
        table(["a", "b"], [["one"]])


def test_only_the_hook_imports_mkdocs():
    """The light install has no mkdocs: no module of kvplan but the hook may import it."""
    hook = ROOT / "kvplan" / "reference" / "mkdocs_hook.py"
    bad = []
    for path in sorted((ROOT / "kvplan").rglob("*.py")):
        text = path.read_text()
        if "mkdocs" not in text:  # parse only the files that could import it
            continue
        for node in ast.walk(ast.parse(text)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "mkdocs" and path != hook]
    assert bad == []


def test_mkdocs_builds_the_six_pages_with_strict(tmp_path, built):
    """A minimal site (an index, the six generated pages in its nav, broken anchors as warnings) builds with
    --strict, in process, and has each page's HTML with its tables."""
    pytest.importorskip("mkdocs")
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# kvplan\n\n[Settings](reference/settings.md#block_size)\n")
    theme = "material" if _importable("material") else "mkdocs"
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump({
        "site_name": "kvplan", "theme": {"name": theme},
        "hooks": [str(ROOT / "kvplan" / "reference" / "mkdocs_hook.py")],
        "validation": {"anchors": "warn", "omitted_files": "warn", "unrecognized_links": "warn"},
        "nav": ["index.md", {"Reference": list(PAGES)}]}))
    config = load_config(str(tmp_path / "mkdocs.yml"), strict=True, site_dir=str(tmp_path / "site"))
    build(config)  # strict: any warning (a broken link or anchor) raises Abort
    for path, text in built.items():
        html = (tmp_path / "site" / path.removesuffix(".md") / "index.html").read_text()
        assert html.count("<table>") == text.count("\n|---"), path
    # a reference page written into docs/ would hide the generated one: the hook refuses it
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File, Files

    from kvplan.reference import mkdocs_hook

    with pytest.raises(PluginError, match=r"docs/reference/cli\.md: the reference pages are generated"):
        mkdocs_hook.on_files(Files([File.generated(config, "reference/cli.md", content="# stale")]), config)


def test_the_pages_are_written_to_a_folder(tmp_path, capsys, built):
    from kvplan.reference.__main__ import main as write

    assert write([str(tmp_path / "out")]) == 0
    assert {p.name: p.read_text() for p in (tmp_path / "out").iterdir()} == \
        {Path(path).name: text for path, text in built.items()}
    assert write([]) == 2 and "usage: python -m kvplan.reference OUTDIR" in capsys.readouterr().err


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
