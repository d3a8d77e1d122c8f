"""Did-you-mean for a mistyped name: hardware, a model, a setting's value, a YAML key. One mechanism for every
place that names what is allowed (`settings.Field`, the experiment schema, `--hardware`, `--model`).

Plain closeness of spelling is not enough for these names: `h100` is one edit from `h200` and four from the
only H100 there is, `h100-sxm`. So the candidates are tried in this order, and the first rule that finds any
decides:

1. names that the value begins, ignoring case (`h100` -> `h100-sxm`; `a100` -> `a100-40gb`, `a100-80gb`;
   `qwen3` -> every Qwen3); else names whose parts (split at `-`, `_`, `.`) begin with the value's parts, in
   order (`4090` -> `rtx-4090`; `llama-405b` -> `llama-3.1-405b`);
2. the closest names by edit distance (Damerau: a swapped pair of letters is one edit), scored so that the
   same family wins a near tie: one point more for another first part (`llama-3-8b` -> `llama`), one more for
   another letter stem (the first part's leading letters: `h100` -> `h`, `float16` -> `float`). A candidate
   qualifies when it shares the value's first part or is within a typo's reach (a third of the value's length,
   at least one edit); every candidate with the best score is proposed, so a true tie is shown as one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

PARTS: Final = re.compile(r"[-_.\s]+")
SHOWN: Final = 4  # names proposed at most; the rest are counted


def first_part(name: str) -> str:
    """The family of a name: its part before the first separator (`llama-3.1-8b` -> `llama`)."""
    return PARTS.split(name.lower(), maxsplit=1)[0]


def letter_stem(name: str) -> str:
    """The leading letters of the first part (`h100-sxm` -> `h`, `qwen2.5-7b` -> `qwen`): a looser family."""
    match = re.match(r"[a-z]*", first_part(name))
    return match.group(0) if match else ""


def edits(a: str, b: str) -> int:
    """Optimal-string-alignment distance: insertions, deletions, substitutions and adjacent swaps, one each."""
    rows = [list(range(len(b) + 1))]
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            row[j] = min(rows[-1][j] + 1, row[j - 1] + 1, rows[-1][j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], rows[-2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]


def parts_begin(typed: str, name: str) -> bool:
    """Each part of `typed` begins a part of `name`, in order (`llama-70b` in `llama-3.1-70b`)."""
    remaining = iter(PARTS.split(name))
    return all(any(part.startswith(want) for part in remaining) for want in PARTS.split(typed) if want)


def suggestions(value: object, allowed: Iterable[object]) -> list[str]:
    """The allowed names to propose for `value`, best first (empty when nothing is close). The order among
    equals is `allowed`'s own."""
    names = list(dict.fromkeys(str(a) for a in allowed))
    typed = str(value).strip().lower()
    if not typed or len(typed) > 200:  # a 5,000-character value is not a typo of a name
        return []
    same = [n for n in names if n.lower() == typed]
    if same:  # the right name in the wrong case
        return same
    starts = [n for n in names if n.lower().startswith(typed)]
    if starts:
        return starts
    inside = [n for n in names if len(typed) >= 2 and parts_begin(typed, n.lower())]
    if inside:
        return inside
    reach = max(1, len(typed) // 3)
    family, stem = first_part(typed), letter_stem(typed)
    scored = []
    for n in names:
        distance = edits(typed, n.lower())
        if first_part(n) == family or distance <= reach:
            scored.append((distance + (first_part(n) != family) + (letter_stem(n) != stem), n))
    best = min((score for score, _ in scored), default=None)
    return [n for score, n in scored if score == best]


def did_you_mean(value: object, allowed: Iterable[object]) -> str:
    """`did you mean 'x'? ` (or `'x' or 'y'`, or the first few and how many more), ready to go before
    `allowed: ...`; empty when nothing is close."""
    found = suggestions(value, allowed)
    if not found:
        return ""
    quoted = [repr(n) for n in found[:SHOWN]]
    more = len(found) - SHOWN
    if more > 0:
        return f"did you mean {', '.join(quoted)} or one of {more} more? "
    if len(quoted) == 1:
        return f"did you mean {quoted[0]}? "
    return f"did you mean {', '.join(quoted[:-1])} or {quoted[-1]}? "
