"""Files kvplan ships that are not code: the example experiments, the sample traces, the calibrated profiles and
the CPU decode kernel's C++ source.

They live in the repository's top-level folders (`experiments/`, `traces/samples/`, `sim/profiles/`,
`engine/csrc/`), beside the `kvplan/` package that holds all the code. A wheel installs them as data files under
`<prefix>/share/kvplan/<the same path>` (pyproject.toml's `data-files`). `shipped_dir` finds a folder in the
checkout this package was imported from, else in the installed data.
"""

from __future__ import annotations

import site
import sys
import sysconfig
from pathlib import Path

# The repository root when this package is imported from a checkout (or an editable install of one)
CHECKOUT = Path(__file__).resolve().parents[1]
SHARE = Path("share") / "kvplan"


def data_roots() -> list[Path]:
    """Where shipped folders are looked for, in order: the checkout, then every installed data prefix."""
    roots = [CHECKOUT] if (CHECKOUT / "pyproject.toml").is_file() else []
    prefixes = [Path(sys.prefix), Path(sysconfig.get_path("data")), Path(site.getuserbase())]
    return roots + [prefix / SHARE for prefix in dict.fromkeys(prefixes)]


def shipped_dir(relative: str) -> Path:
    """The shipped folder `relative` (e.g. "traces/samples"); the checkout's path when found nowhere (so a
    message naming it names where it belongs)."""
    for root in data_roots():
        if (root / relative).is_dir():
            return root / relative
    return CHECKOUT / relative
