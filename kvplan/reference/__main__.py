"""`python -m kvplan.reference OUTDIR`: write the reference pages to OUTDIR (settings.md, cli.md, ...) to read
them without building the site; the links between them work there as on the site."""

from __future__ import annotations

import sys
from pathlib import Path

from kvplan.reference import pages


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].strip():
        print("usage: python -m kvplan.reference OUTDIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for path, text in pages().items():
        target = out / Path(path).name
        target.write_text(text)
        print(f"{target}: {text.count(chr(10))} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
