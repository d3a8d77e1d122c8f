"""`SequenceTiming`: the clock of one sequence, kept beside the core's `Request` (which has no clock) by whoever
serves it - the simulator's replicas on the simulated clock, the live replay on the wall clock - so that both
build the same per-request table from the same record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from mypy_extensions import i64  # a native 64-bit field in the compiled build; int when interpreted

NAN: Final = float("nan")


@dataclass(slots=True)
class SequenceTiming:
    """Sample `sample` of trace row `row`: when it arrived, was first scheduled, produced its first and last
    token, and its widest gap between tokens. `token_times_s` holds every token's time when the run keeps them
    (the live replay always; the simulator for policy validation), else None. The counts are filled where the
    side records them at the finish (the live replay; the simulator reads them off the finished `Request`)."""

    row: int
    sample: int
    arrival_s: float
    first_scheduled_s: float = NAN
    first_token_s: float = NAN
    last_token_s: float = NAN
    itl_max_s: float = 0.0
    token_times_s: list[float] | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_prompt_tokens: int = 0
    preemptions: int = 0
    # speculative decoding: (drafts verified, drafts accepted) for each of its steps that verified drafts, in
    # order, where the side records them (the live replay); None otherwise
    spec_steps: list[tuple[int, int]] | None = None
    # where a side that stamps a run of sequences at once left this record (the simulator's `sim.token_clock`: it
    # holds everything up to that run's step `stamped_to`); -1: up to date
    stamped_to: i64 = -1
