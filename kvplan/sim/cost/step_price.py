"""The price of one scheduler step (`SchedulerOutput`) under a cost model: its forward pass, and the transfers it
asks for. Its own module so that the install's build compiles it with the step loop that calls it every step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.sim.cost.features import StepFeatures
from kvplan.sim.cost.step_law import StepLaw
from kvplan.sim.cost.step_sums import scheduled_sums

if TYPE_CHECKING:
    from kvplan.engine.core.outputs import SchedulerOutput
    from kvplan.sim.cost import CostModel


def step_time(model: CostModel, step: SchedulerOutput, block_size: int, attended_limit: int = 0, window: int = 0,
              law: StepLaw | None = None) -> float:
    """Seconds for one `SchedulerOutput`: compute plus its swap, copy-on-write and local-tier promotion
    transfers. A step that only preempts (a sequence group that cannot grow in place) runs no forward pass: it
    costs its transfers alone. A recorded cost (a live run's measured steps) prices the step by its id. (A
    shared-tier promotion crosses the network: `sim.links.TierPricing` prices it.) `law`: the model's
    `step_law_of`, when the caller keeps it."""
    compute, transfers, promotions = step_parts(model, step, block_size, attended_limit, window, law)
    return compute + transfers + promotions


def step_parts(model: CostModel, step: SchedulerOutput, block_size: int, attended_limit: int = 0, window: int = 0,
               law: StepLaw | None = None) -> tuple[float, float, float]:
    """(compute, swap and copy-on-write transfers, promotions from the cpu and disk tiers) seconds of one step:
    a CPU-tier promotion crosses the host link as a swap-in does; a disk one also reads the drive."""
    # A model with a step law is never a recorded cost (which replays measured steps and has none): asked only of
    # the others, the lookup no longer raises and catches an AttributeError at every step of a model without it
    # (about 4,000 instructions a step, 1% of a loaded run)
    recorded = getattr(model, "recorded_step_time", None) if law is None else None
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
