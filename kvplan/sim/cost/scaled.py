"""A cost model whose step times are another's times a factor: the model-error band's edges.

`ScaledCost(cost, 1.1)` prices every step's compute 10% slower than `cost` does; swaps, copies and tier
promotions (`transfer_time`, priced by link bandwidth, not by the step model whose error the band states) are
left as they are. The product is taken after the inner model's arithmetic, so a stretch of steps priced as an
array and the same steps priced one by one on ints stay bit-identical, as `CostModel` requires. Every other
attribute (the hardware, shape, KV bytes per block, sliding window, a profile's meta) is the inner model's, so
the simulator's other readers of the cost model see what they saw.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, overload

import numpy as np

from kvplan.sim.cost import CostModel, step_law_of
from kvplan.sim.cost.features import StepFeatures
from kvplan.sim.cost.step_law import StepLaw


class ScaledCost:
    """`inner`'s step times x `factor` (finite, > 0). A recorded cost replays measurements: it has no model to
    scale and is refused."""

    __slots__ = ("factor", "inner")
    # Never a recorded cost (refused below). Answered here, not by `__getattr__`: `step_parts` asks every step,
    # and a miss that reaches `__getattr__` raises and catches an AttributeError each time (~5 us a step).
    recorded_step_time: ClassVar[None] = None

    def __init__(self, inner: CostModel, factor: float) -> None:
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"ScaledCost: factor {factor!r}; allowed: a finite number > 0")
        if getattr(inner, "recorded_step_time", None) is not None:
            raise ValueError("ScaledCost: a recorded cost prices steps with their measured durations; nothing to "
                             "scale")
        self.inner, self.factor = inner, factor

    @overload
    def step_times(self, f: StepFeatures[int]) -> float: ...
    @overload
    def step_times(self, f: StepFeatures[np.ndarray]) -> np.ndarray: ...
    def step_times(self, f: StepFeatures) -> np.ndarray | float:
        return self.inner.step_times(f) * self.factor

    def step_law(self) -> StepLaw | None:
        """The inner model's step law with this factor (`sim.cost.step_law`), if it has one."""
        law = step_law_of(self.inner)
        return law.scaled(self.factor) if law is not None else None

    def transfer_time(self, swapped_blocks: int, copied_blocks: int, disk_blocks: int = 0) -> float:
        return self.inner.transfer_time(swapped_blocks, copied_blocks, disk_blocks)

    def __getattr__(self, name: str) -> Any:
        # Only reached for what this class lacks: the inner model's attributes (hardware, shape, meta, ...).
        return getattr(object.__getattribute__(self, "inner"), name)


def scaled(cost: CostModel, factor: float) -> CostModel:
    """`cost` itself at factor 1 (the model as fitted: no wrapper), else its `ScaledCost`."""
    return cost if factor == 1.0 else ScaledCost(cost, factor)
