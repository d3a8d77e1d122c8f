"""Checking YAML spec fields: every error names the key path and what is allowed (`arrivals.cv: must be > 0`).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from traces.schema import TraceFormatError


def read_yaml(path: str | Path, flag: str) -> object:
    """The YAML document at `path` (safe_load); a missing file or a syntax error is one line naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{flag}: {path}: no such file")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None


def spec_error(path: str, problem: str) -> TraceFormatError:
    return TraceFormatError(f"{path}: {problem}")


def number(spec: dict, key: str, path: str, *, default: float | None = None, positive: bool = True,
           minimum: float | None = None) -> float:
    """A numeric field of a spec, checked, with its YAML key path in any error."""
    value = spec.get(key, default)
    where = f"{path}.{key}"
    if value is None:
        raise spec_error(where, "required")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise spec_error(where, f"must be a number, got {value!r}")
    if positive and value <= 0:
        raise spec_error(where, f"must be > 0, got {value!r}")
    if minimum is not None and value < minimum:
        raise spec_error(where, f"must be >= {minimum:g}, got {value!r}")
    return float(value)


def check_keys(spec: object, allowed: tuple[str, ...], path: str) -> dict:
    if not isinstance(spec, dict):
        raise spec_error(path, f"must be a mapping, got {spec!r}")
    unknown = sorted(set(spec) - set(allowed))
    if unknown:
        raise spec_error(f"{path}.{unknown[0]}", f"unknown key; allowed: {', '.join(allowed)}")
    return spec


def integer(spec: dict, key: str, path: str, *, default: int | None = None, minimum: int = 1) -> int:
    value = number(spec, key, path, default=default, positive=False, minimum=minimum)
    if value != int(value):
        raise spec_error(f"{path}.{key}", f"must be an integer, got {value!r}")
    return int(value)


def fraction(spec: dict, path: str, default: float) -> float:
    """The `fraction` field: a share in (0, 1]."""
    value = number(spec, "fraction", path, default=default)
    if value > 1:
        raise spec_error(f"{path}.fraction", f"must be in (0, 1], got {value!r}")
    return value
