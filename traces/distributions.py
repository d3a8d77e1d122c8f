"""Token-length distributions for synthetic workloads: fixed, uniform, lognormal, or empirical from a trace.

A spec is a mapping such as `{dist: lognormal, median: 400, sigma: 0.9, max: 8000}`; every draw is an
integer >= 1 clipped to the optional `min`/`max`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from traces.specs import check_keys, integer, number, spec_error

Sampler = Callable[[np.random.Generator, int], np.ndarray]
DISTS = ("fixed", "uniform", "lognormal", "empirical")
EMPIRICAL_COLUMNS = {"prompt": "prompt_tokens", "output": "output_tokens"}


def length_sampler(spec: object, path: str, base_dir: Path, column: str = "prompt") -> Sampler:
    """A function (rng, size) -> int64 lengths for the spec at YAML key `path`."""
    dist = spec.get("dist") if isinstance(spec, dict) else None
    if dist not in DISTS:
        raise spec_error(f"{path}.dist", f"unknown distribution {dist!r}; allowed: {', '.join(DISTS)}")
    bounds = ("min", "max")
    if dist == "fixed":
        check_keys(spec, ("dist", "value"), path)
        value = integer(spec, "value", path)
        return lambda rng, size: np.full(size, value, dtype=np.int64)
    if dist == "uniform":
        check_keys(spec, ("dist", *bounds), path)
        low, high = integer(spec, "min", path), integer(spec, "max", path)
        if high < low:
            raise spec_error(f"{path}.max", f"must be >= min ({low}), got {high}")
        return lambda rng, size: rng.integers(low, high + 1, size=size)
    if dist == "lognormal":
        check_keys(spec, ("dist", "median", "sigma", *bounds), path)
        mu, sigma = np.log(number(spec, "median", path)), number(spec, "sigma", path)
        return _clipped(lambda rng, size: np.rint(rng.lognormal(mu, sigma, size)), spec, path)
    check_keys(spec, ("dist", "trace", "format", "column", *bounds), path)
    values = _empirical_values(spec, path, base_dir, column)
    return _clipped(lambda rng, size: rng.choice(values, size=size), spec, path)


def _clipped(draw: Sampler, spec: dict, path: str) -> Sampler:
    low = integer(spec, "min", path, default=1)
    high = integer(spec, "max", path, default=2**62)
    if high < low:
        raise spec_error(f"{path}.max", f"must be >= min ({low}), got {high}")
    return lambda rng, size: np.clip(draw(rng, size), low, high).astype(np.int64)


def _empirical_values(spec: dict, path: str, base_dir: Path, column: str) -> np.ndarray:
    from traces import load  # the loaders are only needed for empirical lengths

    source = spec.get("trace")
    if not isinstance(source, str):
        raise spec_error(f"{path}.trace", "required: a trace file (relative to the spec's folder)")
    name = spec.get("column", column)
    if name not in EMPIRICAL_COLUMNS:
        allowed = ", ".join(EMPIRICAL_COLUMNS)
        raise spec_error(f"{path}.column", f"unknown column {name!r}; allowed: {allowed}")
    trace_path = base_dir / source
    if not trace_path.is_file():
        raise spec_error(f"{path}.trace", f"no such file {str(trace_path)!r}")
    values = getattr(load(trace_path, format=spec.get("format")), EMPIRICAL_COLUMNS[name])
    if len(values) == 0:
        raise spec_error(f"{path}.trace", f"{trace_path} holds no requests")
    return values
