"""Arrival processes, shared by the synthetic generator and the re-timing transform.

Two mechanisms cover the four processes:

* renewal: i.i.d. Gamma gaps with mean 1/rate and a chosen CV (CV 1 is Poisson, above 1 is bursty);
* time-varying Poisson with a piecewise-constant rate repeated with a period (on/off bursts, a diurnal
  curve): unit-rate Poisson points are mapped through the inverse of the cumulative rate.

Specs are plain dicts (from YAML); errors name the key path, e.g. `arrivals.cv: must be > 0`.

Every setting is range-checked: a rate between one request a million seconds and a million a second (beyond
either the gaps underflow or overflow the float clock), a CV from 0.01 to 10 (above 10 the gamma shape 1/cv²
is so small that most gaps round to 0 and the sample stops showing the CV asked for), periods and on
stretches from 1 ms (shorter ones divide by almost nothing) to ten years.
"""

from __future__ import annotations

import numpy as np

from kvplan.traces.specs import check_keys, is_number, number, shown, spec_error

PROCESSES = ("poisson", "gamma", "onoff", "diurnal")
MIN_RATE, MAX_RATE = 1e-6, 1e6  # requests (sessions) per second
MIN_CV, MAX_CV = 0.01, 10.0
MIN_SECONDS, MAX_SECONDS = 1e-3, 10 * 365 * 86400.0  # on stretches and diurnal periods (off may be 0)
MAX_CURVE = 100_000  # pieces of a diurnal curve (one a second over a day is 86,400)
RATE_WHY = "requests per second"
CV_WHY = "1 is Poisson, above 1 bursty; beyond 10 most gamma gaps round to 0"


def arrival_times(spec: dict, count: int, rng: np.random.Generator, path: str = "arrivals") -> np.ndarray:
    """`count` arrival times in seconds, starting near 0, non-decreasing."""
    process = spec.get("process", "poisson") if isinstance(spec, dict) else None
    if process not in PROCESSES:
        raise spec_error(f"{path}.process", f"unknown process {shown(process)}; allowed: {', '.join(PROCESSES)}")
    if process in ("poisson", "gamma"):
        check_keys(spec, ("process", "rate", "cv"), path)
        cv = number(spec, "cv", path, minimum=MIN_CV, maximum=MAX_CV, why=CV_WHY) if process == "gamma" else 1.0
        return renewal(_rate(spec, path), cv, count, rng)
    if process == "onoff":
        check_keys(spec, ("process", "rate", "on_s", "off_s"), path)
        rates = [_rate(spec, path), 0.0]
        durations = [number(spec, "on_s", path, minimum=MIN_SECONDS, maximum=MAX_SECONDS, why="seconds"),
                     number(spec, "off_s", path, minimum=0, positive=False, maximum=MAX_SECONDS, why="seconds")]
        return piecewise_poisson(np.array(rates), np.array(durations), count, rng)
    check_keys(spec, ("process", "rate", "curve", "period_s"), path)
    weights = _curve(spec.get("curve"), f"{path}.curve")
    # Scale the curve so that its time average is `rate`.
    rates = weights / weights.mean() * _rate(spec, path)
    period = number(spec, "period_s", path, default=86400.0, minimum=MIN_SECONDS, maximum=MAX_SECONDS,
                    why="seconds")
    return piecewise_poisson(rates, np.full(len(rates), period / len(rates)), count, rng)


def _rate(spec: dict, path: str) -> float:
    return number(spec, "rate", path, minimum=MIN_RATE, maximum=MAX_RATE, why=RATE_WHY)


def _curve(curve: object, path: str) -> np.ndarray:
    """The diurnal curve's relative rates: finite, >= 0, not all 0 (every stretch would be empty)."""
    allowed = f"allowed: a non-empty list of at most {MAX_CURVE} relative rates >= 0 with sum > 0"
    if not isinstance(curve, list) or not curve or len(curve) > MAX_CURVE:
        raise spec_error(path, f"got {shown(curve)}; {allowed}")
    for i, c in enumerate(curve):
        if not is_number(c) or c < 0:
            raise spec_error(f"{path}[{i}]", f"got {shown(c)}; {allowed}")
    weights = np.asarray(curve, dtype=np.float64)
    if weights.sum() <= 0 or not np.isfinite(weights.sum()):
        raise spec_error(path, f"sums to {weights.sum():g}; {allowed}")
    return weights


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
