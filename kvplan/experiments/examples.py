"""The example experiments: `experiments/*.yaml` in a source checkout, `<prefix>/share/kvplan/experiments` in an
installed wheel (`kvplan.shipped`). `kvplan run example:NAME` runs one from wherever it is."""

from __future__ import annotations

from pathlib import Path

from kvplan.errors import UserError
from kvplan.shipped import shipped_dir
from kvplan.traces.schema import listed, short_repr

EXAMPLE_PREFIX = "example:"


def bundled_experiments() -> dict[str, Path]:
    return {p.stem: p for p in sorted(shipped_dir("experiments").glob("*.yaml"))}


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
