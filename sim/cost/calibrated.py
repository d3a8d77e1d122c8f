"""Calibrated cost: a linear model over the step features with coefficients fitted on live engine runs.

A profile YAML (written by hand until `kvplan calibrate` exists) looks like::

    model: llama-3-8b
    device: h100-sxm
    block_size: 16                 # the block size the profile was measured at (informational)
    kv_capacity_blocks: 30000      # optional: measured KV capacity, overrides the analytic estimate
    coefficients:                  # seconds per unit of each feature; missing ones are 0
      step: 2.1e-3                 # fixed per-step overhead
      request: 1.5e-5              # per scheduled request
      prefill_tokens: 6.0e-5
      prefill_attention: 1.0e-9    # per unit of Σ chunk × (cached prefix + chunk/2)
      decode_requests: 2.0e-5
      decode_context: 1.0e-8       # per token of Σ decode context
      decode_context_max: 5.0e-7   # per token of the longest decode context (the spread)
      blocks_touched: 3.0e-7
    swap_seconds_per_block: 2.0e-5
    copy_seconds_per_block: 1.0e-6
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from sim.cost.features import StepFeatures

COEFFICIENTS = ("step", "request", "prefill_tokens", "prefill_attention", "decode_requests", "decode_context",
                "decode_context_max", "blocks_touched")
PROFILE_KEYS = ("model", "device", "block_size", "kv_capacity_blocks", "coefficients", "swap_seconds_per_block",
                "copy_seconds_per_block", "fit", "provenance")


@dataclass(slots=True)
class CalibratedCost:
    coefficients: dict[str, float]
    swap_seconds_per_block: float = 0.0
    copy_seconds_per_block: float = 0.0
    kv_capacity_blocks: int | None = None
    meta: dict = field(default_factory=dict)

    def step_times(self, f: StepFeatures) -> np.ndarray | float:
        c = self.coefficients.get
        return (c("step", 0.0) + c("request", 0.0) * f.num_requests + c("prefill_tokens", 0.0) * f.prefill_tokens
                + c("prefill_attention", 0.0) * (f.prefill_attention2 / 2.0)
                + c("decode_requests", 0.0) * f.decode_requests + c("decode_context", 0.0) * f.decode_context
                + c("decode_context_max", 0.0) * f.decode_context_max
                + c("blocks_touched", 0.0) * f.blocks_touched)

    def transfer_time(self, swapped_blocks: int, copied_blocks: int) -> float:
        return swapped_blocks * self.swap_seconds_per_block + copied_blocks * self.copy_seconds_per_block


def load_profile(path: str | Path) -> CalibratedCost:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--profile: {path}: no such profile file")
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a profile is a YAML mapping with keys {', '.join(PROFILE_KEYS)}")
    unknown = sorted(set(doc) - set(PROFILE_KEYS))
    if unknown:
        raise ValueError(f"{path}: unknown key {unknown[0]!r}; allowed: {', '.join(PROFILE_KEYS)}")
    coeffs = doc.get("coefficients")
    if not isinstance(coeffs, dict) or not coeffs:
        raise ValueError(f"{path}: coefficients: a mapping of feature -> seconds; allowed: {', '.join(COEFFICIENTS)}")
    for key, value in coeffs.items():
        if key not in COEFFICIENTS:
            raise ValueError(f"{path}: coefficients.{key}: unknown feature; allowed: {', '.join(COEFFICIENTS)}")
        if not isinstance(value, int | float):
            raise ValueError(f"{path}: coefficients.{key}: must be a number, got {value!r}")
    capacity = doc.get("kv_capacity_blocks")
    if capacity is not None and (not isinstance(capacity, int) or capacity < 1):
        raise ValueError(f"{path}: kv_capacity_blocks: must be an integer >= 1, got {capacity!r}")
    return CalibratedCost({k: float(v) for k, v in coeffs.items()},
                          float(doc.get("swap_seconds_per_block", 0.0)), float(doc.get("copy_seconds_per_block", 0.0)),
                          capacity, {k: doc[k] for k in ("model", "device", "block_size") if k in doc})
