"""The block copies that prefix tiers below the GPU ask for, as the core made them, in order.

A prefix-tier move is one `TierTransfer`: a demotion (a GPU block the pool evicts -> a slot of the CPU tier, or a
CPU slot the tier evicts -> a disk slot) or a promotion (a tier slot -> the GPU block a prefix hit is copied
into). The KV manager appends them to one log while it schedules; a step's `SchedulerOutput.tier_transfers` is
that log, and the live runner performs it before the step's swap-ins, copy-on-write copies and forward pass.

Why order matters, and what the runner may batch (`copy_batches`):

* a GPU block demoted in this step is handed to someone else in the same step and overwritten by this step's
  swap-ins, copy-on-write copies or forward pass, or by a later promotion into it: its copy-out runs first;
* a tier slot may be reused within one step (its key evicted and the slot stored again), and a block promoted
  in this step may be evicted again and demoted: every read sees the writes the log made before it;
* so consecutive transfers of one direction are one batch (source and destination are different pools, so
  nothing in a batch reads what the batch writes), and within a batch a destination written twice keeps only
  its last write (nothing in between could read the first one).

Pure data, no torch: the simulator's cost model counts the promotions (`promotions_of`) and copies nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

GPU: Final = "gpu"  # the device pool's name in a transfer (on the CPU engine too: the pool the forward pass reads)


@dataclass(slots=True)
class TierTransfer:
    """One block copy between the GPU pool and a tier, or between two tiers: `src` and `dst` are block ids in
    the GPU pool or slot ids in a tier's own pool."""

    src_tier: str
    src: int
    dst_tier: str
    dst: int


def promotions_of(transfers: list[TierTransfer]) -> list[tuple[str, int]]:
    """(tier, GPU block) of each promotion, in order: what the cost model prices per tier."""
    return [(t.src_tier, t.dst) for t in transfers if t.dst_tier == GPU]


def num_demotions(transfers: list[TierTransfer]) -> int:
    """GPU blocks copied out into the tier below (deeper moves, CPU to disk, are not counted)."""
    return sum(1 for t in transfers if t.src_tier == GPU)


def copy_batches(transfers: list[TierTransfer]) -> list[tuple[str, str, list[tuple[int, int]]]]:
    """(source pool, destination pool, (src, dst) pairs) to copy in this order, equivalent to performing the
    transfers one by one: consecutive transfers between the same two pools are merged, and a destination
    written twice within one batch keeps only its last write."""
    batches: list[tuple[str, str, list[tuple[int, int]]]] = []
    for t in transfers:
        if not batches or batches[-1][:2] != (t.src_tier, t.dst_tier):
            batches.append((t.src_tier, t.dst_tier, []))
        batches[-1][2].append((t.src, t.dst))
    out = []
    for src_tier, dst_tier, pairs in batches:
        last = {dst: src for src, dst in pairs}  # a dict keeps the first insertion's place, the last value
        out.append((src_tier, dst_tier, [(src, dst) for dst, src in last.items()]))
    return out
