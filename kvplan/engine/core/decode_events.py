"""The memory events of plain decode steps (`decode_steps`), and the order that makes replaying them stepping.

A plain decode's step has three effects:

* when the step is scheduled, in running order, per request: a new block when its position starts one
  (`ALLOCATE`: an empty block, or the eviction policy's victim, as `kv.allocate` takes it), then the keys of the
  block the step fills (`REGISTER`: a step's full blocks are keyed when it is scheduled, vLLM's timing, as
  `Scheduler.emit` does);
* when it is updated, in running order: one more computed and output token, and the request finishes at its
  output budget (`FINISH`).

Invariant: events sort by (step, schedule before update, running order, allocation before registration) - the
tuple's own order - which is the order the general loop makes them in, so a replay in sorted order
(`DecodeSteps.replay`) leaves the same block ids, eviction order, registrations and completion order as stepping.
"""

from __future__ import annotations

from typing import Final

SCHEDULE: Final = 0  # within a step, schedule() allocates and registers before update() finishes
UPDATE: Final = 1
ALLOCATE: Final = 0  # schedule() handles one request at a time: its allocation, then its keys
REGISTER: Final = 1
FINISH: Final = 2
Event = tuple[int, int, int, int, int]  # (step, phase, running index, kind, logical block)


def block_events(events: list[Event], idx: int, pos: int, n: int, held: int, hashed: int, bs: int,
                  registering: bool) -> None:
    """Append (step, SCHEDULE, idx, kind, logical block) for every allocation and registration of running request
    `idx` over n decode steps: it had `pos` tokens computed, block slots for `held` tokens (held >= pos, or
    == pos when its next write opens a block) and `hashed` blocks keyed."""
    # (while loops, not range(a, b, bs): the compiled build runs a range with a variable step as a Python iterator)
    # Step t writes position pos + t; a new block is allocated whenever that position is the first not held.
    start = held
    while start < pos + n:
        events.append((start - pos, SCHEDULE, idx, ALLOCATE, start // bs))
        start += bs
    if registering:
        # Step t computes up to pos + t + 1 tokens; block e // bs - 1 (and any full one before it not yet keyed)
        # is keyed when the step is scheduled, for the first e = pos + t + 1 past the keyed blocks and at every
        # block end after it.
        end = max((hashed + 1) * bs, pos + 1)
        while end <= pos + n:
            events.append((end - pos - 1, SCHEDULE, idx, REGISTER, end // bs - 1))
            end += bs


def allocations_before_finish(events: list[Event], order: list[int] | None, first: int) -> int:
    """How many ALLOCATE events there are from the `first`-th in sorted order up to the next FINISH (or the end)."""
    count = 0
    for e in range(first, len(events)):
        kind = events[e if order is None else order[e]][3]
        if kind == FINISH:
            break
        if kind == ALLOCATE:
            count += 1
    return count
