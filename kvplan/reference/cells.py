"""The few markdown shapes the reference pages are made of: code spans, table cells, tables, values and prose.

A cell is one line of a pipe table as Python-Markdown reads it (mkdocs-material uses it): a `|` outside a code
span would end the cell and is escaped; inside a code span it is left alone (the table parser skips code spans,
and an escape there would be shown); outside code a `<` that would open an HTML tag (`<path>`, not `<=`) and a
`*` that would open an emphasis are escaped; line breaks become spaces. Text that is already markdown (help lines
with `code`) keeps its code spans.
(The module is not called `markdown`: mkdocs puts the hook's folder first on sys.path while it loads the hook, and
a `markdown.py` there would stand in for the Markdown package.)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from kvplan.engine.core.settings import Field, physical_memory

CODE_SPAN = re.compile(r"(`+)(.+?)\1")
GIB = 1 << 30
MIB = 1 << 20


def code(value: object) -> str:
    """`value` as a code span (a value holding a backtick gets a longer fence, as CommonMark allows)."""
    text = str(value)
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


TAG_START = re.compile(r"<(?=[A-Za-z/!?])")  # what could open an HTML tag or comment (`<path>`); `<=` cannot


def _escape_text(text: str) -> str:
    return TAG_START.sub("&lt;", text.replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*"))


def _outside_code(text: str, escape: Callable[[str], str]) -> str:
    """`text` with `escape` applied to everything outside its code spans (which stay as written)."""
    out, at = [], 0
    for match in CODE_SPAN.finditer(text):
        out += [escape(text[at:match.start()]), match.group(0)]
        at = match.end()
    out.append(escape(text[at:]))
    return "".join(out)


def cell(text: object) -> str:
    """`text` safe inside one table cell: one line, pipes, tag openings and `*` escaped outside code spans."""
    return _outside_code(" ".join(str(text).split()), _escape_text)


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A pipe table's lines; every cell goes through `cell`, so callers pass plain text or code spans."""
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"a row of {len(row)} cells in a table of {len(headers)} columns: {row!r}")
        lines.append("| " + " | ".join(cell(c) for c in row) + " |")
    return lines


def value(x: object) -> str:
    """A default as a YAML file or a command line would spell it: true/false, null, lists with commas."""
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float) and x.is_integer():
        return str(int(x)) if abs(x) < 1e15 else f"{x:g}"
    if isinstance(x, list | tuple):
        return ", ".join(value(v) for v in x)
    return str(x)


def size(n: float) -> str:
    """Bytes as they were declared: whole GiB / MiB in binary units, anything else in decimal GB."""
    if n >= GIB and n % GIB == 0:
        return f"{int(n // GIB)} GiB"
    if n >= MIB and n % MIB == 0:
        return f"{int(n // MIB)} MiB"
    return f"{n / 1e9:g} GB"


def allowed(field: Field) -> str:
    """What `field` accepts, in full (messages shorten long lists; a reference page lists every choice) and
    without this machine's figures (a size's upper bound is the memory of the machine that runs kvplan, not of
    the one that built the docs)."""
    if field.kind == "choice":
        names = [code(c) for c in field.choices]
        aliases = [f"{code(a)} for {code(c)}" for a, c in field.values]
        text = ", ".join(names) + (f" (also {', '.join(aliases)})" if aliases else "")
        text = f"{text} ({field.why})" if field.why else text
        return f"{text} or {code('null')}" if field.nullable and not field.derived else text
    return field.allowed().replace(f" ({physical_memory()})", "")


def prose(text: str) -> str:
    """A docstring-like paragraph as markdown: line breaks kept (paragraphs, indented examples), a blank line
    around a `- ` list that a docstring runs into its paragraph (markdown would read it as the paragraph's text),
    tag openings (`<path>`) and `*` outside code spans escaped."""
    lines: list[str] = []
    for line in text.split("\n"):
        previous = lines[-1] if lines else ""
        in_list = previous.startswith(("- ", "  "))  # an item or its indented continuation
        item = line.startswith("- ")
        starts = item and previous != "" and not in_list
        ends = not item and line != "" and not line.startswith(" ") and in_list
        lines += ["", line] if starts or ends else [line]
    return _outside_code("\n".join(lines), lambda part: TAG_START.sub("&lt;", part).replace("*", "\\*")).strip("\n")
