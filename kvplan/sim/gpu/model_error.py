"""How far the step cost may be off: the `model_error` block that every answer carries.

Which source priced the step follows from the SimSpec, as `sim.run.build_cost` chooses it:

    measured table              a GPU priced by its own per-op profile (SimSpec `gpu_profile`): the file's entry
                                for that hardware (sim/profiles/model_error.json), unknown for one it lacks
    analytic, transferred       every other GPU: the analytic laws fitted on the profiled GPUs ("analytic")
    calibrated engine profile   --cost calibrated, or cpu-local's shipped profile: the profile's held-out steps
    calibrated endpoint         a profile fitted from an endpoint replay (`kvplan calibrate --from-replay`)
    recorded steps              --cost recorded: every step is the live run's measured duration (no model)
    unknown                     nothing states an error (a hand-written profile, no shipped file)

`scripts/gpu_fidelity.py` writes sim/profiles/model_error.json (per op family: rows, median and p90 |error|,
bias; and the step band); `kvplan calibrate` stores a profile's held-out figures under its `fit` key.

Errors are signed as predicted / measured - 1 everywhere (a positive bias, the mean signed error: the model is
too slow). The band `step_band_pct = [lo, hi]` (lo <= 0 <= hi, percent) is the step time's signed error at its
10th and 90th percentile, as gpu_fidelity.py states it (per family, weighted by the family's share of the
measured time): a real step takes the modelled time / (1 + e/100) for e in the band, so its edges simulate the
steps x 1/(1 + hi/100) (the model too slow: faster steps) and x 1/(1 + lo/100). For a calibrated profile the
band is the 10th-90th percentile of its held-out steps' errors, widened to hold 0; a profile written before that
was stored states only its held-out p90 |error| y, and [-y, y] holds its 10th-90th percentile (at most 10% of
the steps are off by more than y, on either side).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kvplan.errors import UserError
from kvplan.shipped import shipped_dir
from kvplan.strict_json import short
from kvplan.traces.specs import is_number

if TYPE_CHECKING:
    from kvplan.sim.spec import SimSpec

# The shipped data file (tests point this at a fixture; `model_error_for(spec, path)` takes another).
MODEL_ERROR_FILE = shipped_dir("sim/profiles") / "model_error.json"
OP_FAMILIES = ("gemm", "elementwise", "attention", "allreduce", "send_recv")
STEP_KINDS = ("prefill", "decode", "mixed", "transfers", "all")  # a calibrated profile's held-out steps
MEASURED, ANALYTIC = "measured table", "analytic, transferred"
ENGINE_PROFILE, ENDPOINT_PROFILE = "calibrated engine profile", "calibrated endpoint"
RECORDED, UNKNOWN = "recorded steps", "unknown"
FAMILY_KEYS = ("family", "rows", "median_abs_err_pct", "p90_abs_err_pct", "bias_pct")
SOURCE_KEYS = ("kind", "basis", "families", "step_band_pct")


@dataclass(slots=True, frozen=True)
class FamilyError:
    """One op family's (or step kind's) validation error, in percent; `bias_pct` None where it was not recorded."""

    family: str
    rows: int
    median_abs_err_pct: float
    p90_abs_err_pct: float
    bias_pct: float | None

    def to_json(self) -> dict:
        return {key: getattr(self, key) for key in FAMILY_KEYS}


@dataclass(slots=True)
class ModelError:
    """Which source priced the steps of `hardware`, its validation error per family and the step-time band
    (None when nothing bounds it)."""

    source: str
    hardware: str
    basis: str
    families: list[FamilyError] = field(default_factory=list)
    band_pct: tuple[float, float] | None = None

    @property
    def scales(self) -> tuple[float, float] | None:
        """The factors on the modelled step time at the band's edges, (fast, slow) = (1 / (1 + hi/100),
        1 / (1 + lo/100)): the real step is the modelled one / (1 + error); None without a band or with a zero
        one."""
        if self.band_pct is None or self.band_pct == (0.0, 0.0):
            return None
        lo, hi = self.band_pct
        return 1.0 / (1.0 + hi / 100.0), 1.0 / (1.0 + lo / 100.0)

    def to_json(self) -> dict:
        return {"source": self.source, "hardware": self.hardware, "basis": self.basis,
                "families": [f.to_json() for f in self.families],
                "step_band_pct": None if self.band_pct is None else list(self.band_pct)}

    def band_text(self) -> str:
        if self.band_pct is None:
            return "step time error unknown"
        lo, hi = self.band_pct
        return f"step time error {lo:+.1f}% to {hi:+.1f}% (p10 to p90)"

    def one_line(self) -> str:
        """The terminal's line, e.g. `model error (analytic, transferred, h100-sxm): step time error -14.6% to
        +15.5% (p10 to p90); |error| median (p90): gemm 5.92% (16.1%), ...`."""
        if self.source == RECORDED:
            return f"model error ({RECORDED}): none in the step times ({self.basis})"
        if self.source == UNKNOWN:
            return f"model error: unknown ({self.basis})"
        per = ", ".join(f"{f.family} {f.median_abs_err_pct:.3g}% ({f.p90_abs_err_pct:.3g}%)" for f in self.families)
        return f"model error ({self.source}, {self.hardware}): {self.band_text()}; |error| median (p90): {per}"

    def markdown(self) -> list[str]:
        """A paragraph and the per-family table (summary.md, and report.html renders the same rows)."""
        lines = [f"**{self.hardware}**: {self.source} — {self.basis}; {self.band_text()}.", ""]
        if self.families:
            lines += ["| " + " | ".join(FAMILY_HEADERS) + " |", "|---" * len(FAMILY_HEADERS) + "|"]
            lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in self.family_rows()]
            lines.append("")
        return lines

    def family_rows(self) -> list[list[object]]:
        return [[f.family, f.rows, f"{f.median_abs_err_pct:.3g}", f"{f.p90_abs_err_pct:.3g}",
                 "n/a" if f.bias_pct is None else f"{f.bias_pct:+.3g}"] for f in self.families]


FAMILY_HEADERS = ("family", "rows", "median abs error %", "p90 abs error %", "bias %")


def family_error(family: str, errors: np.ndarray) -> dict:
    """A family's figures from its signed relative errors (fractions), as the data files store them."""
    pct = np.asarray(errors, dtype=np.float64) * 100
    return {"family": family, "rows": len(pct), "median_abs_err_pct": round(float(np.median(np.abs(pct))), 3),
            "p90_abs_err_pct": round(float(np.percentile(np.abs(pct), 90)), 3),
            "bias_pct": round(float(np.mean(pct)), 3)}


def step_band_pct(errors: np.ndarray) -> list[float]:
    """The band of held-out signed step errors (fractions): their 10th and 90th percentile in percent, widened
    to hold 0 (the module docstring)."""
    lo, hi = np.percentile(np.asarray(errors, dtype=np.float64), [10, 90]) * 100
    return [round(min(float(lo), 0.0), 3), round(max(float(hi), 0.0), 3)]


def band_from_p90(p90_abs_pct: float) -> tuple[float, float] | None:
    """The band of an older profile, from its held-out p90 |error| (the module docstring); None at 100% or more
    (a step predicted 100% fast would take forever)."""
    return None if p90_abs_pct >= 100.0 else (-p90_abs_pct, p90_abs_pct)


# -- reading: the shipped file (a malformed one is a bug) and profiles (a malformed one is the user's) ----------

Fail = Callable[[str], Exception]


def _bug(message: str) -> Exception:
    return ValueError(f"{message} (the shipped data file is malformed: a bug; regenerate it with "
                      "python scripts/gpu_fidelity.py)")


def _number(value: object, where: str, fail: Fail, low: float | None = None) -> float:
    if not is_number(value) or (low is not None and value < low):
        floor = "" if low is None else f" >= {low:g}"
        raise fail(f"{where}: {short(value)}; allowed: a finite number{floor}")
    return float(value)


def _families(doc: object, where: str, allowed: tuple[str, ...], fail: Fail) -> list[FamilyError]:
    if not isinstance(doc, list) or not doc:
        raise fail(f"{where}: {short(doc)}; allowed: a non-empty list of {{{', '.join(FAMILY_KEYS)}}}")
    out: list[FamilyError] = []
    for i, row in enumerate(doc):
        at = f"{where}[{i}]"
        if not isinstance(row, dict) or set(row) != set(FAMILY_KEYS):
            keys = sorted(row) if isinstance(row, dict) else short(row)
            raise fail(f"{at}: keys {keys}; allowed: exactly {', '.join(FAMILY_KEYS)}")
        name, rows = row["family"], row["rows"]
        if name not in allowed or any(f.family == name for f in out):
            raise fail(f"{at}.family: {short(name)}; allowed: one each of {', '.join(allowed)}")
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise fail(f"{at}.rows: {short(rows)}; allowed: an integer >= 1")
        median = _number(row["median_abs_err_pct"], f"{at}.median_abs_err_pct", fail, 0.0)
        p90 = _number(row["p90_abs_err_pct"], f"{at}.p90_abs_err_pct", fail, 0.0)
        bias = None if row["bias_pct"] is None else _number(row["bias_pct"], f"{at}.bias_pct", fail)
        out.append(FamilyError(name, rows, median, p90, bias))
    return out


def _band(doc: object, where: str, fail: Fail) -> tuple[float, float]:
    if not isinstance(doc, list) or len(doc) != 2:
        raise fail(f"{where}: {short(doc)}; allowed: [lo, hi] in percent with -100 < lo <= 0 <= hi")
    lo, hi = (_number(v, f"{where}", fail) for v in doc)
    if not -100.0 < lo <= 0.0 <= hi:
        raise fail(f"{where}: [{lo:g}, {hi:g}]; allowed: [lo, hi] in percent with -100 < lo <= 0 <= hi")
    return lo, hi


def load_model_errors(path: Path, *, user_supplied: bool = False) -> dict[str, ModelError]:
    """Every source of a model_error.json, by name (a hardware name, or "analytic"). Strict: any departure from
    the schema (gpu_fidelity.py's) is a bug in the shipped file, or a `UserError` naming the key in a user's."""
    fail: Fail = UserError if user_supplied else _bug
    try:
        doc = json.loads(path.read_text(), parse_constant=lambda name: _number(name, "a constant", fail))
    except (OSError, ValueError) as exc:
        if isinstance(exc, UserError):
            raise
        raise fail(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(doc, dict) or set(doc) != {"generated_by", "sources"} or not isinstance(doc["sources"], dict):
        raise fail(f"{path}: allowed: an object with exactly generated_by and sources (a mapping)")
    if "analytic" not in doc["sources"]:
        raise fail(f"{path}: sources: no \"analytic\" entry; allowed: sources with an \"analytic\" entry (the "
                   "source of every GPU without a table of its own)")
    out = {}
    for name, source in doc["sources"].items():
        at = f"{path}: sources.{name}"
        if not isinstance(source, dict) or set(source) != set(SOURCE_KEYS):
            raise fail(f"{at}: allowed: an object with exactly {', '.join(SOURCE_KEYS)}")
        kind = ANALYTIC if name == "analytic" else MEASURED
        if source["kind"] != kind:
            raise fail(f"{at}.kind: {short(source['kind'])}; allowed: {kind!r}")
        if not isinstance(source["basis"], str) or not source["basis"].strip():
            raise fail(f"{at}.basis: {short(source['basis'])}; allowed: one line saying what was measured")
        families = _families(source["families"], f"{at}.families", OP_FAMILIES, fail)
        out[name] = ModelError(kind, name, source["basis"].strip(), families,
                               _band(source["step_band_pct"], f"{at}.step_band_pct", fail))
    return out


def profile_error(path: str | Path, hardware: str) -> ModelError:
    """The error a calibrated profile states for itself (its `fit` key); `unknown` when it states none."""
    from kvplan.sim.cost.calibrated import load_profile

    path = Path(path)
    meta = load_profile(path).meta
    fit = meta.get("fit", {})
    kind = ENDPOINT_PROFILE if fit.get("source") == "endpoint replay" else ENGINE_PROFILE
    where = f"{path}: fit"
    steps = fit.get("heldout_steps")
    basis = (f"{meta.get('model', 'a model')} on {meta.get('device', 'its device')}: {steps} held-out steps of "
             f"{fit.get('steps')} ({path.name})")
    if "heldout_families" in fit:
        families = _families(fit["heldout_families"], f"{where}.heldout_families", STEP_KINDS, UserError)
        band = _band(fit.get("step_band_pct"), f"{where}.step_band_pct", UserError)
        return ModelError(kind, hardware, basis, families, band)
    if "heldout_median_abs_error_pct" not in fit:
        return ModelError(UNKNOWN, hardware, f"{path.name} states no held-out error (fit.heldout_* keys)")
    median = _number(fit["heldout_median_abs_error_pct"], f"{where}.heldout_median_abs_error_pct", UserError, 0.0)
    p90 = _number(fit.get("heldout_p90_abs_error_pct"), f"{where}.heldout_p90_abs_error_pct", UserError, 0.0)
    rows = steps if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1 else 1
    return ModelError(kind, hardware, basis + "; bias not recorded (a profile older than the stored band), band "
                      "from the p90 |error|", [FamilyError("all", rows, median, p90, None)], band_from_p90(p90))


def model_error_for(spec: SimSpec, path: Path | None = None) -> ModelError:
    """The model error of the cost model `build_cost(spec)` builds: the same choice of source, read from the
    spec (a profiled device means its shipped profile; `path`: another model_error.json than the shipped one)."""
    from kvplan.sim.specs.profiles import PROFILED_DEVICES, shipped_profile

    if spec.cost == "recorded":
        return ModelError(RECORDED, spec.hardware, "every step priced with the live replay's measured duration; "
                          "its error is the replay's timer, and the simulation stops where its batch differs",
                          [], (0.0, 0.0))
    if spec.cost == "calibrated" or spec.hardware in PROFILED_DEVICES:
        profile = spec.profile or shipped_profile(spec.model, spec.hardware)
        return profile_error(profile, spec.hardware)
    path = MODEL_ERROR_FILE if path is None else path
    if not path.is_file():
        return ModelError(UNKNOWN, spec.hardware, f"no {path} in this install (a packaging bug): nothing states "
                          "the analytic model's error")
    sources = load_model_errors(path)
    table = spec.gpu_profile  # a measured per-op profile directory (sim.gpu.table), if given
    if table is not None:
        if spec.hardware != "analytic" and spec.hardware in sources:
            return sources[spec.hardware]
        return ModelError(MEASURED, spec.hardware, f"the per-op profile {table}: model_error.json states no error "
                          f"for {spec.hardware}'s table (`kvplan bench fidelity` measures one)")
    analytic = sources["analytic"]  # said of the GPU it prices
    return ModelError(analytic.source, spec.hardware, analytic.basis, list(analytic.families), analytic.band_pct)

