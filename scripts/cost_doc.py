"""Regenerate what docs/cost.md quotes: the built-in price table (from `kvplan.sim.specs.prices.price_rows`, so the
page quotes the code) and the example commands' outputs, each between its page's markers.

    PYTHONPATH=. python scripts/cost_doc.py            # rewrite docs/cost.md
    PYTHONPATH=. python scripts/cost_doc.py --check    # exit 1 when the page differs from what runs print now
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "cost.md"
BLOCK = re.compile(r"(<!-- cost:(?P<name>[a-z0-9-]+) \(scripts/cost_doc.py\) -->\n)(?P<body>.*?)"
                   r"(<!-- /cost:(?P=name) -->)", re.S)
EXAMPLES = {
    "simulate": "kvplan simulate --trace traces/samples/chat.jsonl --hardware h100-sxm --replicas 2 --rate 20",
    "reserved": "kvplan simulate --trace traces/samples/chat.jsonl --hardware h100-sxm --replicas 2 --rate 20 "
                "--price-kind reserved",
    "prices-file": "kvplan simulate --trace traces/samples/chat.jsonl --hardware h100-sxm --replicas 2 --rate 20 "
                   "--prices docs/examples/prices/lambda_h100.yaml",
    "bad": "kvplan simulate --trace traces/samples/chat.jsonl --prices docs/examples/prices/bad.yaml",
}
REFUSED = {"bad"}  # examples of bad input: they exit 2 and their stderr (one line) is quoted
VOLATILE = re.compile(r"wall [0-9.]+ s")  # differs on every run: --check masks it


def price_table() -> str:
    from kvplan.sim.specs.prices import price_rows

    lines = ["| GPU | on demand $/GPU-h | reserved $/GPU-h | date | source |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in price_rows()]
    return "\n".join(lines) + "\n"


def example(command: str, refused: bool = False) -> str:
    """The command and its stdout, as a ```text block (stderr: notes, not quoted); a refused command's exit status
    must be 2 and its stderr is quoted instead."""
    argv = shlex.split(command)
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.run([sys.executable, "-m", "kvplan", *argv[1:]], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=False)
    if proc.returncode != (2 if refused else 0):
        raise SystemExit(f"cost_doc: `{command}` exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    shown = proc.stderr if refused else proc.stdout
    return "\n".join(["```text", f"$ {command}", shown.rstrip("\n"), "```"]) + "\n"


def render(text: str) -> str:
    def body(match: re.Match[str]) -> str:
        name = match.group("name")
        if name == "table":
            new = price_table()
        elif name in EXAMPLES:
            new = example(EXAMPLES[name], name in REFUSED)
        else:
            raise SystemExit(f"cost_doc: docs/cost.md: unknown block '{name}'; allowed: table, {', '.join(EXAMPLES)}")
        return match.group(1) + new + match.group(4)

    return BLOCK.sub(body, text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when the page would change")
    args = parser.parse_args()
    old = DOC.read_text()
    new = render(old)
    if VOLATILE.sub("wall ...", new) == VOLATILE.sub("wall ...", old):
        return 0
    if args.check:
        print(f"differs: {DOC.relative_to(ROOT)}", file=sys.stderr)
        return 1
    DOC.write_text(new)
    print(f"wrote {DOC.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
