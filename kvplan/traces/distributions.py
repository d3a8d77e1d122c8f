"""Token-length distributions for synthetic workloads: fixed, uniform, lognormal, or empirical from a trace.

A spec is a mapping such as `{dist: lognormal, median: 400, sigma: 0.9, max: 8000}`; every draw is an
integer >= 1 clipped to the optional `min`/`max`. Every parameter is at most the caller's `maximum`
(`MAX_TOKENS` for token lengths, more than any model's context: the generator holds every token's hash block,
so a typo such as `value: 1e12` must stop here) and `max` defaults to it; `sigma` is at most `MAX_SIGMA`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from kvplan.traces.specs import check_keys, integer, number, shown, spec_error

Sampler = Callable[[np.random.Generator, int], np.ndarray]
DISTS = ("fixed", "uniform", "lognormal", "empirical")
EMPIRICAL_COLUMNS = {"prompt": "prompt_tokens", "output": "output_tokens"}
MAX_TOKENS = 2**24  # 16,777,216: above the longest context of any published model
MAX_SIGMA = 5.0  # a lognormal with sigma 5 already spans ten orders of magnitude within +-2 sigma
TOKENS_WHY = "tokens; more than any model's context"


def length_sampler(spec: object, path: str, base_dir: Path, column: str = "prompt", maximum: int = MAX_TOKENS,
                   why: str = TOKENS_WHY) -> Sampler:
    """A function (rng, size) -> int64 lengths in [1, maximum] for the spec at YAML key `path`."""
    dist = spec.get("dist") if isinstance(spec, dict) else None
    if dist not in DISTS:
        raise spec_error(f"{path}.dist", f"unknown distribution {shown(dist)}; allowed: {', '.join(DISTS)}")
    bounds = ("min", "max")
    limit = {"maximum": maximum, "why": why}
    if dist == "fixed":
        check_keys(spec, ("dist", "value"), path)
        value = integer(spec, "value", path, **limit)
        return lambda rng, size: np.full(size, value, dtype=np.int64)
    if dist == "uniform":
        check_keys(spec, ("dist", *bounds), path)
        low, high = integer(spec, "min", path, **limit), integer(spec, "max", path, **limit)
        if high < low:
            raise spec_error(f"{path}.max", f"must be >= min ({low}), got {high}")
        return lambda rng, size: rng.integers(low, high + 1, size=size)
    if dist == "lognormal":
        check_keys(spec, ("dist", "median", "sigma", *bounds), path)
        median = number(spec, "median", path, minimum=1, **limit)
        sigma = number(spec, "sigma", path, maximum=MAX_SIGMA, why="the spread of log length")
        mu = np.log(median)
        return _clipped(lambda rng, size: np.rint(rng.lognormal(mu, sigma, size)), spec, path, maximum, why)
    check_keys(spec, ("dist", "trace", "format", "column", *bounds), path)
    values = _empirical_values(spec, path, base_dir, column)
    return _clipped(lambda rng, size: rng.choice(values, size=size), spec, path, maximum, why)


def _clipped(draw: Sampler, spec: dict, path: str, maximum: int, why: str) -> Sampler:
    low = integer(spec, "min", path, default=1, maximum=maximum, why=why)
    high = integer(spec, "max", path, default=maximum, maximum=maximum, why=why)
    if high < low:
        raise spec_error(f"{path}.max", f"must be >= min ({low}), got {high}")
    return lambda rng, size: np.clip(draw(rng, size), low, high).astype(np.int64)


def _empirical_values(spec: dict, path: str, base_dir: Path, column: str) -> np.ndarray:
    from kvplan.traces import load  # the loaders are only needed for empirical lengths

    source = spec.get("trace")
    if not isinstance(source, str):
        raise spec_error(f"{path}.trace", "required: a trace file (relative to the spec's folder)")
    name = spec.get("column", column)
    if not isinstance(name, str) or name not in EMPIRICAL_COLUMNS:
        allowed = ", ".join(EMPIRICAL_COLUMNS)
        raise spec_error(f"{path}.column", f"unknown column {shown(name)}; allowed: {allowed}")
    fmt = spec.get("format")
    if fmt is not None and not isinstance(fmt, str):
        raise spec_error(f"{path}.format", f"must be a format name, got {shown(fmt)}; allowed: see `kvplan trace`")
    trace_path = base_dir / source
    try:
        found = trace_path.is_file()
    except OSError:  # e.g. a name longer than the file system allows
        found = False
    if not found:
        raise spec_error(f"{path}.trace", f"no such file {shown(str(trace_path))}")
    try:
        values = getattr(load(trace_path, format=fmt), EMPIRICAL_COLUMNS[name])
    except ValueError as exc:  # the loader's own line (FILE:LINE: ...), under the key that named the file
        raise spec_error(f"{path}.trace", str(exc)) from None
    if len(values) == 0:
        raise spec_error(f"{path}.trace", f"{trace_path} holds no requests")
    return values
