"""The cluster-shared prefix store as the simulator's replicas see it: a core `TierView` per replica whose stores
made inside a decode fast-path stretch take effect at the time their step starts.

Why: a stretch applies k decode steps of one replica at once, at its start, and the blocks its steps evict (or,
write-through, register) are stored in the shared store - which other replicas read at their own steps, in the
middle of that stretch. Applied at once, a store would be visible to them too early (and its evictions too early),
and the fast path would no longer give exactly the step-by-step results. So a view records the stretch's stores with
their step (the length of the stretch's usage list when each is made: `Scheduler.advance_decodes` extends it to step
t before step t's allocations and registrations), the replica stamps them with the steps' start times, and every
access to the store from any replica first applies the stamped stores due by then, in time order::

    replica A  |==== stretch: steps t0 t1 t2 t3 ====|    stores stamped t1, t3 -> queue
    replica B            lookup at s (t1 <= s < t3): applies the t1 store, then looks up

Nothing in a stretch reads the shared store (a stretch admits nothing), so deferring its stores changes nothing
for the replica that made them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvplan.engine.core.block_pool import BlockPool, KVBlock
from kvplan.engine.core.prefix_tiers import PrefixTier, TierView
from kvplan.engine.core.tier_transfers import GPU

if TYPE_CHECKING:
    from kvplan.sim.links import Link


class StoreQueue:
    """Stores waiting for their time, oldest first (ties in the order they were made). Invariant: an access at
    time `now` sees every store stamped at or before `now` applied, and none stamped later."""

    __slots__ = ("items", "made")

    def __init__(self) -> None:
        self.items: list[tuple[float, int, SharedView, int]] = []
        self.made = 0

    def push(self, when: float, view: SharedView, key: int) -> None:
        heapq.heappush(self.items, (when, self.made, view, key))
        self.made += 1

    def flush(self, now: float) -> None:
        items = self.items
        while items and items[0][0] <= now:
            when, _, view, key = heapq.heappop(items)
            view.apply([(key, -1)], when)


class SharedView(TierView):
    """A replica's view of the shared store that defers the stores of a fast-path stretch (see the module)."""

    __slots__ = ("clock", "link", "queue", "stretch", "usage")

    def __init__(self, tier: PrefixTier, queue: StoreQueue, clock: Callable[[], float],
                 link: Link | None = None) -> None:
        TierView.__init__(self, tier)
        self.queue, self.clock = queue, clock
        self.link = link  # the node's network: a store that copies a block holds it (`sim.links`)
        self.stretch: list[tuple[int, int]] | None = None  # (step in the stretch, key) while one is applied
        self.usage: list[float] = []

    def begin_stretch(self, usage: list[float]) -> None:
        self.stretch, self.usage = [], usage

    def end_stretch(self, starts: list[float]) -> None:
        """Stamp the stretch's stores with the start time of their step (`starts[t]`) and queue them."""
        assert self.stretch is not None  # after `begin_stretch`
        for step, key in self.stretch:
            self.queue.push(starts[step], self, key)
        self.stretch = None

    def store_many(self, keys: list[tuple[int, int]], src_tier: str = GPU) -> None:
        """(The blocks' ids are unused: the simulator's shared store logs no copies, it only counts them.)"""
        if self.stretch is not None:
            step = len(self.usage)
            self.stretch.extend([(step, key) for key, _ in keys])
            return
        now = self.clock()
        self.queue.flush(now)
        self.apply(keys, now)

    def apply(self, keys: list[tuple[int, int]], when: float) -> None:
        """Store `keys` now, in order, as made at `when` (their step's start): each store that copies a block (not
        a refresh of a key the store has, nor one dropped with every slot pinned) holds the node's link for it from
        `when`, one block after another."""
        stored = self.stats.demotions
        TierView.store_many(self, keys, GPU)
        if self.link is not None:
            for _ in range(self.stats.demotions - stored):
                self.link.reserve(when, 1)

    def __contains__(self, key: int) -> bool:
        self.queue.flush(self.clock())
        return key in self.tier.pool.cached

    def __len__(self) -> int:
        self.queue.flush(self.clock())
        return len(self.tier)

    def pin(self, key: int) -> KVBlock | None:
        self.queue.flush(self.clock())
        return self.tier.pin(key)

    @property
    def pool(self) -> BlockPool:
        self.queue.flush(self.clock())
        return self.tier.pool
