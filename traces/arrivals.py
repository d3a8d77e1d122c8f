"""Arrival processes, shared by the synthetic generator and the re-timing transform.

Two mechanisms cover the four processes:

* renewal: i.i.d. Gamma gaps with mean 1/rate and a chosen CV (CV 1 is Poisson, above 1 is bursty);
* time-varying Poisson with a piecewise-constant rate repeated with a period (on/off bursts, a diurnal
  curve): unit-rate Poisson points are mapped through the inverse of the cumulative rate.

Specs are plain dicts (from YAML); errors name the key path, e.g. `arrivals.cv: must be > 0`.
"""

from __future__ import annotations

import numpy as np

from traces.specs import check_keys, number, spec_error

PROCESSES = ("poisson", "gamma", "onoff", "diurnal")


def arrival_times(spec: dict, count: int, rng: np.random.Generator, path: str = "arrivals") -> np.ndarray:
    """`count` arrival times in seconds, starting near 0, non-decreasing."""
    process = spec.get("process", "poisson") if isinstance(spec, dict) else None
    if process not in PROCESSES:
        raise spec_error(f"{path}.process", f"unknown process {process!r}; allowed: {', '.join(PROCESSES)}")
    if process in ("poisson", "gamma"):
        check_keys(spec, ("process", "rate", "cv"), path)
        cv = number(spec, "cv", path) if process == "gamma" else 1.0
        return renewal(number(spec, "rate", path), cv, count, rng)
    if process == "onoff":
        check_keys(spec, ("process", "rate", "on_s", "off_s"), path)
        rates = [number(spec, "rate", path), 0.0]
        durations = [number(spec, "on_s", path), number(spec, "off_s", path, minimum=0, positive=False)]
        return piecewise_poisson(np.array(rates), np.array(durations), count, rng)
    check_keys(spec, ("process", "rate", "curve", "period_s"), path)
    curve = spec.get("curve")
    if (not isinstance(curve, list) or not curve
            or not all(isinstance(c, int | float) and not isinstance(c, bool) and c >= 0 for c in curve)
            or sum(curve) <= 0):
        raise spec_error(f"{path}.curve", "must be a non-empty list of relative rates >= 0, sum > 0")
    weights = np.asarray(curve, dtype=np.float64)
    # Scale the curve so that its time average is `rate`.
    rates = weights / weights.mean() * number(spec, "rate", path)
    period = number(spec, "period_s", path, default=86400.0)
    return piecewise_poisson(rates, np.full(len(rates), period / len(rates)), count, rng)


def renewal(rate: float, cv: float, count: int, rng: np.random.Generator) -> np.ndarray:
    shape = 1.0 / (cv * cv)
    gaps = rng.gamma(shape, 1.0 / (rate * shape), size=count)
    return np.cumsum(gaps) - gaps[0] if count else gaps


def piecewise_poisson(rates: np.ndarray, durations: np.ndarray, count: int,
                      rng: np.random.Generator) -> np.ndarray:
    """Poisson arrivals whose rate is rates[i] for durations[i] seconds, the pattern repeating forever."""
    edges = np.concatenate(([0.0], np.cumsum(durations)))
    mass = np.concatenate(([0.0], np.cumsum(rates * durations)))  # expected arrivals by each edge
    per_period = mass[-1]
    points = np.cumsum(rng.exponential(1.0, size=count))
    periods, within = np.divmod(points, per_period)
    # Invert the cumulative rate inside one period. side="right" lands on the last of a run of equal masses,
    # which starts a stretch with a positive rate, so stretches with rate 0 never receive an arrival.
    segment = np.searchsorted(mass, within, side="right") - 1
    return periods * edges[-1] + edges[segment] + (within - mass[segment]) / rates[segment]
