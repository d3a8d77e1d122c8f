"""Calibrated cost: a linear model over the step features with coefficients fitted on live engine runs.

A profile (`profiles/*.yaml`, written by `kvplan calibrate`, read by `--cost calibrated --profile P`)::

    model: llama-100m
    device: cpu-local
    dtype: bfloat16
    block_size: 16                 # the block size kv_capacity_blocks was measured at
    block_sizes: [8, 16, 32]       # the block sizes the steps were measured at
    kv_capacity_blocks: 1365       # measured KV capacity (overrides the analytic estimate)
    coefficients:                  # seconds per unit of each feature; missing ones are 0
      step: 2.1e-3                 # fixed per-step overhead (scheduling, launch, weights read once)
      request: 1.5e-5              # per scheduled request (input preparation)
      prefill_tokens: 6.0e-5
      prefill_attention: 1.0e-9    # per unit of Σ chunk × (cached prefix + chunk/2)
      decode_requests: 2.0e-5
      decode_context: 1.0e-8       # per token of Σ decode context
      decode_context_max: 5.0e-7   # per token of the longest decode context (the spread)
      blocks_touched: 3.0e-7
      sampled: 4.0e-4              # per row through the LM head and the sampler
      batched: 2.0e-2              # a step with >= 2 token rows (matrix-matrix instead of matrix-vector)
    swap_seconds_per_block: 2.0e-5
    copy_seconds_per_block: 1.0e-6
    fit: {...}                     # fit quality: R², held-out error, residual percentiles
    provenance: {...}              # machine, versions, threads, date, git revision, command
    speculative: {...}             # optional: a measured draft acceptance (sim.spec_decode.measured_section)
    lora: {rank: 8, seconds_per_slot: 2e-3, seconds_per_row_rank: 1e-6, fit: {...}}
                                   # optional: the engine's measured LoRA cost (calibration.lora, sim.lora)

Every coefficient and transfer cost must be a finite number of seconds in [0, 3600] (`MAX_SECONDS`): a negative
one could price a step below zero, and a measured step takes milliseconds, so more than an hour per unit is a
typo that would only overflow the simulated clock. `kv_capacity_blocks` is at most 2^24 (`MAX_BLOCKS`: the
simulator keeps over 100 bytes per block, so 2^24 blocks are ~2 GB per replica) and block sizes at most 256, the
engine's limit. Every problem is one line `PROFILE: key: problem; allowed: ...`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import overload

import numpy as np
import yaml

from kvplan.errors import UserError
from kvplan.output import write_atomic
from kvplan.sim.cost.features import StepFeatures
from kvplan.traces.specs import is_number, numeric_hint, read_yaml, shown, shown_key

COEFFICIENTS = ("step", "request", "prefill_tokens", "prefill_attention", "decode_requests", "decode_context",
                "decode_context_max", "blocks_touched", "sampled", "batched")
TRANSFERS = ("swap_seconds_per_block", "copy_seconds_per_block")
PROFILE_KEYS = ("model", "device", "dtype", "block_size", "block_sizes", "kv_capacity_blocks", "coefficients",
                *TRANSFERS, "fit", "provenance", "speculative", "lora")
LORA_KEYS = ("rank", "seconds_per_slot", "seconds_per_row_rank", "fit")
MAX_SECONDS = 3600.0  # per unit of a feature, or per block moved
MAX_BLOCKS = 2**24
MAX_BLOCK_SIZE = 256  # the engine's (and the simulator's) largest block size


def feature_columns(f: StepFeatures) -> tuple:
    """The values each coefficient multiplies, in `COEFFICIENTS` order (the calibrated model's design row)."""
    return (1, f.num_requests, f.prefill_tokens, f.prefill_attention2 / 2.0, f.decode_requests, f.decode_context,
            f.decode_context_max, f.blocks_touched, f.sampled, f.batched)


@dataclass(slots=True)
class CalibratedCost:
    coefficients: dict[str, float]
    swap_seconds_per_block: float = 0.0
    copy_seconds_per_block: float = 0.0
    kv_capacity_blocks: int | None = None
    meta: dict = field(default_factory=dict)  # every other profile key (model, device, block_size, fit, ...)
    _terms: list[tuple[int, float]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # The non-zero terms, found once: step_times runs on every simulated step.
        self._terms = [(i, self.coefficients[name]) for i, name in enumerate(COEFFICIENTS)
                       if self.coefficients.get(name, 0.0)]

    @overload
    def step_times(self, f: StepFeatures[int]) -> float: ...
    @overload
    def step_times(self, f: StepFeatures[np.ndarray]) -> np.ndarray: ...
    def step_times(self, f: StepFeatures) -> np.ndarray | float:
        columns = feature_columns(f)
        # Start from the batch's shape (a stretch of steps is an array): a profile with only the constant `step`
        # term must still give one time per step, not a single float.
        total = 0.0 * np.asarray(columns[1], dtype=np.float64)
        for i, coefficient in self._terms:
            total = total + coefficient * columns[i]
        return total

    def transfer_time(self, swapped_blocks: int, copied_blocks: int, disk_blocks: int = 0) -> float:
        # no drive was measured: a disk-tier block is priced as a swap (a lower bound on its time)
        return ((swapped_blocks + disk_blocks) * self.swap_seconds_per_block
                + copied_blocks * self.copy_seconds_per_block)

    def scaled(self, factor: float) -> CalibratedCost:
        """The same profile on a machine `factor` times slower (every coefficient and transfer cost scaled):
        what `kvplan validate` simulates when a speed probe finds the machine away from its calibrated speed."""
        meta = {**self.meta, "provenance": {**self.meta.get("provenance", {}), "speed_factor": factor}}
        if isinstance(meta.get("lora"), dict):  # the measured LoRA seconds slow down with the machine too
            lora = meta["lora"]
            meta["lora"] = {**lora, **{k: lora[k] * factor for k in ("seconds_per_slot", "seconds_per_row_rank")}}
        return CalibratedCost({k: v * factor for k, v in self.coefficients.items()},
                              self.swap_seconds_per_block * factor, self.copy_seconds_per_block * factor,
                              self.kv_capacity_blocks, meta)

    def to_dict(self) -> dict:
        doc = {k: v for k, v in self.meta.items() if k in PROFILE_KEYS}
        if self.kv_capacity_blocks is not None:
            doc["kv_capacity_blocks"] = self.kv_capacity_blocks
        doc["coefficients"] = {k: float(self.coefficients.get(k, 0.0)) for k in COEFFICIENTS}
        doc["swap_seconds_per_block"] = float(self.swap_seconds_per_block)
        doc["copy_seconds_per_block"] = float(self.copy_seconds_per_block)
        order = {k: i for i, k in enumerate(PROFILE_KEYS)}
        return dict(sorted(doc.items(), key=lambda kv: order[kv[0]]))


def save_profile(cost: CalibratedCost, path: str | Path, header: str = "") -> None:

    text = yaml.safe_dump(cost.to_dict(), sort_keys=False, width=120)
    write_atomic(path, "".join(f"# {line}\n" for line in header.splitlines()) + text)


def _seconds(path: Path, key: str, value: object) -> float:
    allowed = f"allowed: 0 to {MAX_SECONDS:g} (a measured step takes milliseconds)"
    if not is_number(value) or value < 0:
        raise UserError(f"{path}: {key}: must be a finite number of seconds >= 0, got {shown(value)}"
                         f"{numeric_hint(value)}; {allowed}")
    if value > MAX_SECONDS:
        raise UserError(f"{path}: {key}: {shown(value)} seconds is not a measurement; {allowed}")
    return float(value)


def _integer(path: Path, doc: dict, key: str, maximum: int, why: str) -> int | None:
    value = doc.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum):
        raise UserError(f"{path}: {key}: must be an integer >= 1, got {shown(value)}; allowed: 1 to {maximum} "
                         f"({why})")
    return value


SIGNATURE = b"# kvplan calibrate profile"  # the first line `kvplan calibrate` writes (save_profile's header)


def _check_complete(path: Path, doc: dict) -> None:
    """A profile `kvplan calibrate` wrote (its first line says so) holds every coefficient, both transfer times,
    its fit and its provenance: one that lacks any was cut short or edited, and a missing coefficient would price
    its feature at 0 s without a word. (A hand-written profile, without that line, may leave coefficients out.)"""
    with path.open("rb") as f:
        if f.read(len(SIGNATURE)) != SIGNATURE:
            return
    coefficients: dict = doc["coefficients"] if isinstance(doc.get("coefficients"), dict) else {}
    provenance: dict = doc["provenance"] if isinstance(doc.get("provenance"), dict) else {}
    missing = [*(f"coefficients.{k}" for k in COEFFICIENTS if k not in coefficients),
               *(k for k in (*TRANSFERS, "fit", "provenance") if k not in doc),
               *(["provenance.command"] if "provenance" in doc and "command" not in provenance else [])]
    if missing:
        more = f" (+{len(missing) - 2} more)" if len(missing) > 2 else ""
        raise UserError(f"{path}: written by kvplan calibrate, but {', '.join(missing[:2])}{more} missing (cut short "
                        "or edited); allowed: the whole profile (rerun its provenance.command)")


def _check_meta(path: Path, doc: dict) -> None:
    """The descriptive keys: strings and mappings as `kvplan calibrate` writes them (later code relies on it)."""
    for key in ("model", "device", "dtype"):
        if key in doc and not isinstance(doc[key], str):
            raise UserError(f"{path}: {key}: must be a string, got {shown(doc[key])}; allowed: a name")
    for key in ("fit", "provenance"):
        if key in doc and not isinstance(doc[key], dict):
            raise UserError(f"{path}: {key}: must be a mapping, got {shown(doc[key])}; allowed: key: value pairs")
    if "speculative" in doc:  # a measured acceptance (sim.spec_decode)
        from kvplan.sim.spec_decode import measured_problem

        problem = measured_problem(doc["speculative"])
        if problem is not None:
            raise UserError(f"{path}: speculative: {problem}")
    if "lora" in doc:
        _check_lora(path, doc["lora"])
    sizes = doc.get("block_sizes")
    if sizes is not None and (not isinstance(sizes, list) or not sizes or not all(
            isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= MAX_BLOCK_SIZE for b in sizes)):
        raise UserError(f"{path}: block_sizes: got {shown(sizes)}; allowed: a non-empty list of integers "
                         f"1 to {MAX_BLOCK_SIZE}")


def _check_lora(path: Path, section: object) -> None:
    """The `lora` section: the rank it was measured at and two finite non-negative seconds (calibration.lora)."""
    allowed = ("allowed: {rank: integer 1 to 512, seconds_per_slot: s, seconds_per_row_rank: s, fit: {...}} with "
               f"seconds 0 to {MAX_SECONDS:g}")
    if not isinstance(section, dict) or set(section) - set(LORA_KEYS) or not {"rank", "seconds_per_slot",
                                                                             "seconds_per_row_rank"} <= set(section):
        raise UserError(f"{path}: lora: got {shown(section)}; {allowed}")
    rank = section["rank"]
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= 512:
        raise UserError(f"{path}: lora.rank: got {shown(rank)}; {allowed}")
    for key in ("seconds_per_slot", "seconds_per_row_rank"):
        value = section[key]
        if not is_number(value) or not 0 <= value <= MAX_SECONDS:
            raise UserError(f"{path}: lora.{key}: got {shown(value)}; {allowed}")
    if "fit" in section and not isinstance(section["fit"], dict):
        raise UserError(f"{path}: lora.fit: got {shown(section['fit'])}; {allowed}")


def _coefficients(path: Path, coeffs: object) -> dict[str, float]:
    if not isinstance(coeffs, dict) or not coeffs:
        raise UserError(f"{path}: coefficients: a mapping of feature -> seconds; allowed: {', '.join(COEFFICIENTS)}")
    for key in coeffs:
        if key not in COEFFICIENTS:
            raise UserError(f"{path}: coefficients.{shown_key(key)}: unknown feature; "
                             f"allowed: {', '.join(COEFFICIENTS)}")
    coefficients = {k: _seconds(path, f"coefficients.{k}", v) for k, v in coeffs.items()}
    if not any(coefficients.values()):
        raise UserError(f"{path}: coefficients: all zero would price every step at 0 s; allowed: at least one > 0")
    return coefficients


def load_profile(path: str | Path) -> CalibratedCost:
    path = Path(path)
    doc = read_yaml(path, "--profile")
    if not isinstance(doc, dict):
        raise UserError(f"{path}: not a profile; allowed: a YAML mapping with keys {', '.join(PROFILE_KEYS)}")
    unknown = sorted(set(doc) - set(PROFILE_KEYS), key=str)
    if unknown:
        raise UserError(f"{path}: unknown key {shown(unknown[0])}; allowed: {', '.join(PROFILE_KEYS)}")
    _check_complete(path, doc)
    coefficients = _coefficients(path, doc.get("coefficients"))
    capacity = _integer(path, doc, "kv_capacity_blocks", MAX_BLOCKS,
                        "the simulator keeps over 100 bytes per block: 2^24 blocks are ~2 GB per replica")
    _integer(path, doc, "block_size", MAX_BLOCK_SIZE, "the engine's largest block size")
    _check_meta(path, doc)
    swap_s, copy_s = (_seconds(path, k, doc.get(k, 0.0)) for k in TRANSFERS)
    meta = {k: v for k, v in doc.items() if k not in ("coefficients", "kv_capacity_blocks", *TRANSFERS)}
    return CalibratedCost(coefficients, swap_s, copy_s, capacity, meta)
