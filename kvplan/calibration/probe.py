"""A speed probe: how fast this machine runs the engine now, relative to a calibrated profile.

A shared or thermally throttled machine does not keep one speed: on the 2-core VM the profiles were fitted on,
the same one-request decode step took 40-45 ms at calibration and 52-54 ms half an hour later. A timing
comparison made across such drift measures the machine, not the simulator. The probe runs a short fixed
workload (the calibration design's mixed phase: eight prompts prefilled, decoded together, joined by one more)
on a fresh engine, records every step, and prices the same steps with the profile:

    speed_factor = Σ measured step time / Σ profile-predicted step time

1.0 means the machine runs at the profile's speed; 1.2 means 20% slower. `kvplan validate` probes before and
after every live run (a fresh engine, so the replay's own engine, cache and step ids are untouched) and reports
its timing error both as calibrated and with the profile scaled by the factor measured around the live runs.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvplan.sim.cost.calibrated import COEFFICIENTS, CalibratedCost

PROBE_PHASES = ("mixed",)
PROBE_REPEATS = 2


@dataclass(slots=True)
class SpeedProbe:
    measured_s: float  # the probe's steps on the live engine, summed
    predicted_s: float  # the same steps priced by the profile
    steps: int

    @property
    def factor(self) -> float:
        return self.measured_s / self.predicted_s


def predicted_seconds(cost: CalibratedCost, steps: list) -> np.ndarray:
    """Each recorded step priced by the profile (its coefficients and transfer costs, as the simulator would)."""
    from kvplan.calibration.fitting import design_matrix

    x = design_matrix(steps)
    coefficients = np.array([cost.coefficients.get(k, 0.0) for k in COEFFICIENTS])
    # design_matrix counts transfers in tokens; the profile states seconds per block of the block size it was
    # measured at (the simulator's reading: the step's own block size when the profile names none).
    measured_at = np.array([cost.meta.get("block_size") or s.block_size for s in steps], dtype=np.float64)
    transfers = x[:, len(COEFFICIENTS):] @ np.array([cost.swap_seconds_per_block, cost.copy_seconds_per_block])
    return x[:, :len(COEFFICIENTS)] @ coefficients + transfers / measured_at


def speed_probe(model: str, cost: CalibratedCost, *, block_size: int, dtype: str, seed: int = 0,
                temperature: float = 1.0) -> SpeedProbe:
    """Run the probe workload on a fresh engine and compare its step times with the profile's prices."""
    from kvplan.engine.llm import LLM
    from kvplan.engine.profiler import StepProfiler
    from kvplan.calibration.design import run_phases
    from kvplan.sim.cost.recorded import read_step_profile

    llm = LLM(model, block_size=block_size, dtype=dtype, max_num_batched_tokens=512, max_model_len=1024,
              seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.jsonl"
        profiler = StepProfiler(path, llm.profile_meta)
        run_phases(llm, PROBE_PHASES, profiler, PROBE_REPEATS, seed, temperature)
        profiler.close()
        steps = read_step_profile(path)[1]
    measured = float(sum(s.duration_s for s in steps))
    return SpeedProbe(measured, float(predicted_seconds(cost, steps).sum()), len(steps))
