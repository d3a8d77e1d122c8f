"""Regenerate the table of stability gates quoted in docs/reading-an-answer.md, from `sim.stability.GATES` and the
probe's defaults (`sim.probe.Probe`), between the page's `gates` markers. (The page's quickstart answer is a
command output: scripts/docs_outputs.py regenerates it.)

    PYTHONPATH=. python scripts/reading_an_answer.py
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reading-an-answer.md"
BEGIN, END = "<!-- gates:begin (scripts/reading_an_answer.py) -->", "<!-- gates:end (scripts/reading_an_answer.py) -->"


def gates_table() -> str:
    """Every stability gate at the probe's defaults, and the completion check, as a markdown table."""
    from kvplan.sim import stability
    from kvplan.sim.probe import Probe

    defaults = asdict(Probe())
    rows = [(g.name, g.text(defaults)[1], g.verdict, ", ".join(f"`{k}`" for k in g.key.split(", ")))
            for g in stability.GATES]
    rows.append(("no request completed", "no request of the run completed", "fails", "none: no bound"))
    lines = ["| gate | a probe fails it when | verdict | key |", "|---|---|---|---|"]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)]) + "\n"


def main() -> int:
    head, rest = DOC.read_text().split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{gates_table()}{END}{tail}")
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
