"""Cost models: how long one scheduler step takes on the modelled hardware.

Every model implements `CostModel`: `step_times(features)` maps a batch of steps' features (one array entry per
step) to seconds, so the replica's decode fast path prices k steps in one vectorised call and a single step is
the same arithmetic on plain ints (bit-identical times either way); `transfer_time` prices swap and copy-on-write
traffic. A model may also offer `decode_law()` (`decode_law_of`): its pure-decode step on plain numbers, which
prices a stretch in one typed loop, again bit for bit (`sim.cost.decode_law`).
"""

from __future__ import annotations

from typing import Protocol, overload

import numpy as np

from kvplan.sim.cost.decode_law import DecodeLaw
from kvplan.sim.cost.features import StepFeatures, step_features


class CostModel(Protocol):
    @overload
    def step_times(self, f: StepFeatures[int]) -> float: ...
    @overload
    def step_times(self, f: StepFeatures[np.ndarray]) -> np.ndarray: ...

    def transfer_time(self, swapped_blocks: int, copied_blocks: int, disk_blocks: int = 0) -> float: ...


def reads_spread(model: CostModel) -> bool:
    """Whether the model's step times read `decode_context_max` and `batched` (the calibrated model's spread and
    BLAS terms); one that declares `reads_spread = False` gets decode stretches without them."""
    return getattr(model, "reads_spread", True)


def decode_law_of(model: CostModel) -> DecodeLaw | None:
    """The model's pure-decode step on plain numbers (`sim.cost.decode_law`), or None: a model without one prices
    its decode stretches with `step_times` on arrays."""
    law = getattr(model, "decode_law", None)
    return law() if law is not None else None


def sliding_window(model: CostModel) -> int:
    """The window the model's sliding-window layers attend over (0: none, or a cost model that does not price
    layer kinds separately, as a profile measured on one model does)."""
    return getattr(model, "sliding_window", 0)


def step_time(model: CostModel, step, block_size: int, attended_limit: int = 0, window: int = 0) -> float:
    """Seconds for one `SchedulerOutput`: compute plus its swap, copy-on-write and local-tier promotion
    transfers. A step that only preempts (a sequence group that cannot grow in place) runs no forward pass: it
    costs its transfers alone. A recorded cost (a live run's measured steps) prices the step by its id. (A
    shared-tier promotion crosses the network: `sim.links.TierPricing` prices it.)"""
    compute, transfers, promotions = step_parts(model, step, block_size, attended_limit, window)
    return compute + transfers + promotions


def step_parts(model: CostModel, step, block_size: int, attended_limit: int = 0,
               window: int = 0) -> tuple[float, float, float]:
    """(compute, swap and copy-on-write transfers, promotions from the cpu and disk tiers) seconds of one step:
    a CPU-tier promotion crosses the host link as a swap-in does; a disk one also reads the drive."""
    recorded = getattr(model, "recorded_step_time", None)
    if recorded is not None:
        return recorded(step), 0.0, 0.0
    compute = transfers = promoted = 0.0
    if step.scheduled or step.decodes:
        features = step_features(step.scheduled, block_size, attended_limit, step.decodes, window)
        compute = float(model.step_times(features))
    if step.swap_out or step.swap_in or step.copies:
        transfers = model.transfer_time(len(step.swap_out) + len(step.swap_in), len(step.copies))
    if step.promotions:
        disk = sum(1 for tier, _ in step.promotions if tier == "disk")
        cpu = sum(1 for tier, _ in step.promotions if tier == "cpu")
        promoted = model.transfer_time(cpu, 0, disk)
    return compute, transfers, promoted


__all__ = ["CostModel", "DecodeLaw", "StepFeatures", "decode_law_of", "reads_spread", "sliding_window",
           "step_parts", "step_time"]
