"""Cost models: how long one scheduler step takes on the modelled hardware.

Every model implements `CostModel`: `step_times(features)` maps a batch of steps' features (one array entry per
step) to seconds, so the replica's decode fast path prices k steps in one vectorised call and a single step is
the same arithmetic on plain ints (bit-identical times either way); `transfer_time` prices swap and copy-on-write
traffic. A model may also offer `step_law()` (`step_law_of`): its step on plain numbers, which prices one step,
or a decode stretch in one typed loop, again bit for bit (`sim.cost.step_law`).
"""

from __future__ import annotations

from typing import Protocol, overload

import numpy as np

from kvplan.sim.cost.features import StepFeatures
from kvplan.sim.cost.step_law import StepLaw
from kvplan.sim.cost.step_sums import scheduled_sums


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


def step_law_of(model: CostModel) -> StepLaw | None:
    """The model's step on plain numbers (`sim.cost.step_law`), or None: a model without one prices its steps with
    `step_times` (a decode stretch's on arrays)."""
    law = getattr(model, "step_law", None)
    return law() if law is not None else None


def sliding_window(model: CostModel) -> int:
    """The window the model's sliding-window layers attend over (0: none, or a cost model that does not price
    layer kinds separately, as a profile measured on one model does)."""
    return getattr(model, "sliding_window", 0)


def step_time(model: CostModel, step, block_size: int, attended_limit: int = 0, window: int = 0,
              law: StepLaw | None = None) -> float:
    """Seconds for one `SchedulerOutput`: compute plus its swap, copy-on-write and local-tier promotion
    transfers. A step that only preempts (a sequence group that cannot grow in place) runs no forward pass: it
    costs its transfers alone. A recorded cost (a live run's measured steps) prices the step by its id. (A
    shared-tier promotion crosses the network: `sim.links.TierPricing` prices it.) `law`: the model's
    `step_law_of`, when the caller keeps it."""
    compute, transfers, promotions = step_parts(model, step, block_size, attended_limit, window, law)
    return compute + transfers + promotions


def step_parts(model: CostModel, step, block_size: int, attended_limit: int = 0, window: int = 0,
               law: StepLaw | None = None) -> tuple[float, float, float]:
    """(compute, swap and copy-on-write transfers, promotions from the cpu and disk tiers) seconds of one step:
    a CPU-tier promotion crosses the host link as a swap-in does; a disk one also reads the drive."""
    recorded = getattr(model, "recorded_step_time", None)
    if recorded is not None:
        return recorded(step), 0.0, 0.0
    compute = transfers = promoted = 0.0
    if step.scheduled or step.decodes:
        sums = scheduled_sums(step.scheduled, block_size, attended_limit, step.decodes, window, step.decode_sums)
        seconds = law.step(sums) if law is not None else None  # (None: a step it does not cover)
        compute = seconds if seconds is not None else float(model.step_times(StepFeatures(*sums)))
    if step.swap_out or step.swap_in or step.copies:
        transfers = model.transfer_time(len(step.swap_out) + len(step.swap_in), len(step.copies))
    if step.promotions:
        disk = sum(1 for tier, _ in step.promotions if tier == "disk")
        cpu = sum(1 for tier, _ in step.promotions if tier == "cpu")
        promoted = model.transfer_time(cpu, 0, disk)
    return compute, transfers, promoted


__all__ = [
    "CostModel",
    "StepFeatures",
    "StepLaw",
    "reads_spread",
    "sliding_window",
    "step_law_of",
    "step_parts",
    "step_time",
]
