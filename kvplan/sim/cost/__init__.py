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
from kvplan.sim.cost.step_price import step_parts, step_time


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
