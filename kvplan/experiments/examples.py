"""The example experiments: `experiments/*.yaml` in a source checkout, `<prefix>/share/kvplan/experiments` in an
installed wheel. `kvplan run example:NAME` runs one from wherever it is."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

from kvplan.errors import UserError
from kvplan.traces.schema import listed, short_repr

EXAMPLE_PREFIX = "example:"


def example_dirs() -> list[Path]:
    share = Path("share") / "kvplan" / "experiments"
    return [Path(__file__).resolve().parents[2] / "experiments", Path(sys.prefix) / share,
            Path(sysconfig.get_path("data")) / share]


def bundled_experiments() -> dict[str, Path]:
    for directory in example_dirs():
        found = sorted(directory.glob("*.yaml"))
        if found:
            return {p.stem: p for p in found}
    return {}


def experiment_path(value: str) -> Path:
    """The experiment file `value` names: a path, or example:NAME."""
    if not value.strip():  # Path("") would be the current directory
        raise UserError("EXPERIMENT: empty path; allowed: an experiment YAML file or example:NAME")
    if not value.startswith(EXAMPLE_PREFIX):
        return Path(value)
    name, examples = value[len(EXAMPLE_PREFIX):], bundled_experiments()
    if name not in examples:
        raise UserError(f"EXPERIMENT: no example {short_repr(name)}; allowed: "
                         f"{listed(EXAMPLE_PREFIX + n for n in examples) or 'none installed'}")
    return examples[name]
