"""Regenerate what docs/reading-an-answer.md quotes: the quickstart's terminal answer - run the quickstart
experiment (about 2.5 minutes on 2 workers) or read a result set it wrote, and render its answer as piped (plain
text, 100 columns) - and the table of stability gates with their default bounds (`sim.stability.GATES` and the
probe's defaults), each between the page's markers.

    python scripts/reading_an_answer.py                  # run experiments/quickstart.yaml, then write the page
    python scripts/reading_an_answer.py --from DIR       # an existing quickstart result set (kvplan run --out DIR)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reading-an-answer.md"
EXPERIMENT = ROOT / "experiments" / "quickstart.yaml"
MARK = "<!-- {}:{} (scripts/reading_an_answer.py) -->"


def replace_block(page: str, name: str, text: str) -> str:
    begin, end = MARK.format(name, "begin"), MARK.format(name, "end")
    head, rest = page.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{text}{end}{tail}"


def gates_table() -> str:
    """Every stability gate at the probe's defaults, and the completion check."""
    from dataclasses import asdict

    from kvplan.sim import stability
    from kvplan.sim.probe import Probe

    defaults = asdict(Probe())
    rows = [(g.name, g.rule.format(**defaults), g.verdict, f"`{g.key}`" if g.key else "fixed")
            for g in stability.GATES]
    rows.append(("no request completed", "no request of the run completed", "fails", "fixed"))
    lines = ["| gate | a probe fails it when | verdict | key |", "|---|---|---|---|"]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)]) + "\n"


def main() -> int:
    from kvplan.experiments.answer import read_result_set, render
    from kvplan.experiments.schema import load_experiment

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="source", type=Path, default=None, help="a quickstart result set")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = args.source
        if out is None:
            out = Path(tmp) / "quickstart"
            subprocess.run([sys.executable, "-m", "kvplan", "run", str(EXPERIMENT), "--out", str(out), "--quiet",
                            "--json", "--workers", str(args.workers)], check=True, stdout=subprocess.DEVNULL)
        text = render(load_experiment(EXPERIMENT), *read_result_set(out))
    page = replace_block(DOC.read_text(), "answer", f"```\n{text}```\n")
    DOC.write_text(replace_block(page, "gates", gates_table()))
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
