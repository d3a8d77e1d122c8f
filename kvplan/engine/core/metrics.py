"""Counters, gauges and the memory breakdown, with vLLM's names.

The memory breakdown splits the KV token slots at one instant into fractions that sum to 1:

* `token_states`            - slots holding a computed token's K and V;
* `reserved_unused`         - slots allocated to a request for tokens it will still produce (within its
                              prompt + output budget) but has not yet;
* `internal_fragmentation`  - allocated slots beyond what the request will ever need (the tail of the last
                              block; a reservation larger than the real length);
* `external_fragmentation`  - free slots that a contiguous allocator cannot use because they lie outside the
                              largest free extent (always 0 for paged allocation);
* `free`                    - the rest (cached-but-free blocks count as free, as in vLLM).

A block shared by several tables is counted once, with the most tokens any holder has in it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Final, TypeVar, cast

from kvplan.engine.core.kv_manager import HOLE
from kvplan.engine.core.reservation import ReservationAllocator

if TYPE_CHECKING:
    from mypy_extensions import i64  # native 64-bit locals in the compiled build (no tag checks); int when interpreted

    from kvplan.engine.core.block_pool import KVBlock
    from kvplan.engine.core.kv_interface import KVManager
    from kvplan.engine.core.kv_manager import KVCacheManager
    from kvplan.engine.core.request import Request

T = TypeVar("T")


@dataclass(slots=True)
class SchedulerStats:
    num_steps: int = 0
    num_preemptions: int = 0
    num_recomputes: int = 0
    num_swap_outs: int = 0
    num_rejected: int = 0
    num_finished: int = 0
    # speculative decoding, vLLM's SpecDecodingStats: steps of a request that verified drafts, the drafts
    # verified and accepted, and per draft position how many were verified / accepted
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_draft_tokens_per_pos: list[int] = field(default_factory=list)
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Count one request's verification of `num_draft_tokens` drafts, the first `num_accepted_tokens` kept."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        grow = num_draft_tokens - len(self.num_draft_tokens_per_pos)
        if grow > 0:
            self.num_draft_tokens_per_pos.extend([0] * grow)
            self.num_accepted_tokens_per_pos.extend([0] * grow)
        for i in range(num_draft_tokens):
            self.num_draft_tokens_per_pos[i] += 1
        for i in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[i] += 1

    @property
    def acceptance_rate(self) -> float | None:
        """Drafts accepted / drafts verified (None: none verified)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens a verifying step emits per request on average: accepted drafts + 1 (vLLM's mean acceptance
        length)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None


@dataclass(slots=True)
class MemoryBreakdown:
    token_states: float
    reserved_unused: float
    internal_fragmentation: float
    external_fragmentation: float
    free: float

    @property
    def kv_token_utilization(self) -> float:
        """Token states ÷ allocated token slots (1.0 when nothing is allocated)."""
        allocated = self.token_states + self.reserved_unused + self.internal_fragmentation
        return self.token_states / allocated if allocated else 1.0

    def as_dict(self) -> dict[str, float]:
        # (its fields read directly: `dataclasses.asdict` deep-copies each value, at every series sample)
        return {f.name: getattr(self, f.name) for f in fields(self)}


def memory_breakdown(kv: KVManager, requests: Iterable[Request]) -> MemoryBreakdown:
    if isinstance(kv, ReservationAllocator):
        return _reservation_breakdown(kv, requests)
    return _paged_breakdown(kv, requests)


def _paged_breakdown(kv: KVManager, requests: Iterable[Request]) -> MemoryBreakdown:
    """One pass over every live table (`_table_slots`). A hybrid layout's groups hold distinct blocks of the one
    pool: their slots add up."""
    bs = kv.block_size
    requests = list(requests)
    tokens = needed_slots = 0
    # (one group, no holes: the shared blocks lead each table but behind a shadowed copy - see `_table_slots`)
    leading = len(kv.groups) == 1 and not kv.config.windowed and kv.pool is not None
    copies = kv.pool.duplicates if kv.pool is not None else {}
    for group in kv.groups:
        group_tokens, group_needed = _table_slots(group.tables, requests, bs, kv.config.num_blocks, leading, copies)
        tokens += group_tokens
        needed_slots += group_needed
    total = kv.config.num_blocks * bs
    used_slots = kv.pool.num_used * bs if kv.pool is not None else 0
    reserved = needed_slots - tokens
    return MemoryBreakdown(tokens / total, reserved / total, (used_slots - tokens - reserved) / total, 0.0,
                           (total - used_slots) / total)


def _grown(values: list[T], size: int, fill: T) -> list[T]:
    """`values` grown to `size` entries (more than it has) with `fill`: in place, or made at its size when empty -
    extending an empty list builds the padding and copies it into a second list (the pool's size, every sample)."""
    if not values:
        return [fill] * size
    values.extend([fill] * (size - len(values)))
    return values


def _table_slots(tables: dict[str, list[KVBlock | None]], requests: list[Request], bs: int,
                 num_blocks: int, shared_leading: bool = False,
                 duplicates: Mapping[int, list[KVBlock]] | None = None) -> tuple[int, int]:
    """(token states the tables' blocks hold, slots their holders will have written at their end). A block several
    tables hold counts once, with the most slots any holder has written (or will write).

    Each table entry holds one of its block's references, so a block with one reference is in this table alone: a
    table's entries sum in closed form (the first `done` of its len × bs slots are written, the first `final` will
    be), and only its holes and shared blocks are visited again - a hole is taken back out, a shared block's value
    goes to its id's largest so far (`most_done`, `most_final`; -1: not seen yet), for the pool's `num_blocks` ids
    (and any beyond, should a table hold one).

    `shared_leading`: the caller knows that the tables are one group of blocks without holes, so a table's scan
    stops at its first block of one reference - unless that block's key has another copy in the pool
    (`duplicates`, the pool's). A request shares a block only by forking (everything before its copy-on-write of
    the last block) or by a prefix hit on it, which took every block before it too: the table's own blocks,
    except where a lookup found another copy of the same key, which the hitting request then holds - so that
    copy stays the one lookups find and the table's block stays a later copy, in `duplicates`, for as long as the
    hit block is shared. (A held block is never evicted.) So behind a first block of one reference whose key has
    one copy nothing is shared; behind one whose key has several the scan goes on.

    A table's leading shared blocks that it has all written (a prefix hit, the common case) each hold `size` slots
    for it, the most any holder can: each goes to `full` once (`whole` marks it by id: tables that hit the same
    prefix hold the same lead), and counts `size` once at the end, whatever other holders wrote; the scan goes on
    behind them."""
    most_done: list[int] = []  # sized on the first shared block (most tables share none)
    most_final: list[int] = []
    known: i64 = 0  # their length
    full: list[KVBlock] = []  # the distinct blocks of the tables' whole leads
    whole: list[bool] = []  # by block id: in `full` (sized on the first whole lead)
    tokens: i64 = 0
    needed_slots: i64 = 0
    size: i64 = bs
    for request in requests:
        table = tables.get(request.request_id)
        if table is None:
            continue
        done: i64 = request.num_computed_tokens
        final: i64 = max(request.final_len, request.num_tokens)
        span: i64 = len(table) * size
        # Σ over entries i of min(max(x - i × bs, 0), bs) = min(max(x, 0), len × bs): the slots fill in order
        tokens += min(max(done, 0), span)
        needed_slots += min(max(final, 0), span)
        lead: i64 = 0
        for block in table:
            if block is None or block.ref_cnt == 1:
                break
            lead += 1
        if lead and done >= lead * size and final >= lead * size:  # every lead block is and stays whole here
            tokens -= lead * size
            needed_slots -= lead * size
            for j in range(lead):  # (no hole among them)
                lead_block = cast("KVBlock", table[j])
                lead_id: i64 = lead_block.block_id
                if lead_id >= len(whole):
                    whole = _grown(whole, max(lead_id + 1, num_blocks), False)
                if not whole[lead_id]:
                    whole[lead_id] = True
                    full.append(lead_block)
        else:
            lead = 0
        base: i64 = lead * size  # the first token position of the entry
        for i in range(lead, len(table)):
            block = table[i]
            if block is None or block.ref_cnt != 1:  # a hole, or a block other tables may hold too
                # min(max(x - base, 0), size), as branches: a block several tables hold, not in a table's whole
                # lead, is visited in each of them at every sample (the builtins' calls were a fifth of an
                # interpreted probe's time)
                written: i64 = done - base
                written = size if written >= size else (written if written > 0 else 0)
                will: i64 = final - base
                will = size if will >= size else (will if will > 0 else 0)
                tokens -= written  # counted again below, once per distinct block
                needed_slots -= will
                if block is not None:
                    block_id = block.block_id
                    if block_id >= known:
                        known = max(block_id + 1, num_blocks)
                        most_done, most_final = _grown(most_done, known, -1), _grown(most_final, known, -1)
                    seen: i64 = most_done[block_id]
                    if seen < 0:
                        tokens += written
                        needed_slots += will
                        most_done[block_id], most_final[block_id] = written, will
                    else:  # held by an earlier table too: count the larger value once
                        if written > seen:
                            tokens += written - seen
                            most_done[block_id] = written
                        if will > most_final[block_id]:
                            needed_slots += will - most_final[block_id]
                            most_final[block_id] = will
            elif shared_leading and (not duplicates or block.key not in duplicates):
                break  # the rest of the table is its own: the closed form above counts it
            base += size
    for whole_block in full:  # `size` slots each, in place of the largest value other holders gave it
        whole_id = whole_block.block_id
        if whole_id < known and most_done[whole_id] >= 0:
            tokens -= most_done[whole_id]
            needed_slots -= most_final[whole_id]
    return tokens + len(full) * size, needed_slots + len(full) * size


def _reservation_breakdown(kv: ReservationAllocator, requests: Iterable[Request]) -> MemoryBreakdown:
    tokens = reserved = internal = 0
    for request in requests:
        extent = kv.extents.get(request.request_id)
        if extent is None:
            continue
        length = extent[1]
        need = min(request.final_len, length)
        tokens += request.num_computed_tokens
        reserved += need - request.num_computed_tokens
        internal += length - need
    total = kv.total_slots
    free = total - kv.reserved_slots
    largest = kv.largest_free_extent()
    return MemoryBreakdown(tokens / total, reserved / total, internal / total, (free - largest) / total,
                           largest / total)


def kv_snapshot(kv: KVManager, stats: SchedulerStats) -> dict[str, float | int | None]:
    """Instantaneous gauges and cumulative counters under vLLM's metric names."""
    pool = kv.pool
    return {
        "kv_usage": kv.usage(),
        "num_blocks_used": pool.num_used if pool else 0,
        "num_cached_free_blocks": pool.num_cached_free if pool else 0,
        "prefix_cache_queries": kv.prefix_queries,
        "prefix_cache_hits": kv.prefix_hits,
        "prefix_cache_hit_rate": kv.prefix_hits / kv.prefix_queries if kv.prefix_queries else 0.0,
        "num_preemptions": stats.num_preemptions,
        "num_evicted_blocks": pool.num_evictions if pool else 0,
        "num_rejected": stats.num_rejected,
        **tier_counters(kv),
    }


TIER_NAMES: Final = ("cpu", "disk", "shared")
TIER_COUNTERS: Final = ("hits", "promotions", "demotions", "dropped")
# the cumulative ones (summed over replicas and windows); `_blocks` is a gauge
TIER_COUNTER_KEYS: Final = tuple(f"kv_offload_{name}_{counter}" for name in TIER_NAMES for counter in TIER_COUNTERS)
# bytes each tier's link moved (promotions out of it and stores into it, times the KV bytes of a block): the
# simulator's summaries fill them in (the core does not know a block's bytes); null where a tier is absent
TIER_BYTES_KEYS: Final = tuple(f"kv_offload_{name}_bytes" for name in TIER_NAMES)
TIER_SUMMARY_KEYS: Final = TIER_COUNTER_KEYS + TIER_BYTES_KEYS


def tier_counters(kv: KVManager) -> dict[str, int | None]:
    """`kv_offload_<tier>_<counter>` in blocks for every tier the core knows, None where the tier is absent (a
    summary names the same keys whether or not a run had the tier); `_blocks` is what the tier holds now."""
    present = {tier.name: tier for tier in kv.tiers}
    out: dict[str, int | None] = {}
    for name in TIER_NAMES:
        tier = present.get(name)
        for counter in TIER_COUNTERS:
            out[f"kv_offload_{name}_{counter}"] = None if tier is None else getattr(tier.stats, counter)
        out[f"kv_offload_{name}_blocks"] = None if tier is None else len(tier)
    return out


def block_sharing(kv: KVCacheManager, requests: Iterable[Request]) -> tuple[int, int]:
    """(blocks the requests' tables hold, a shared block counted once; blocks they would hold with nothing shared,
    i.e. every table entry): the memory saving of forking is 1 - held / independent (vLLM paper, section 6.3)."""
    held: set[int] = set()
    independent = 0
    for request in requests:
        ids = [block for block in kv.block_ids.get(request.request_id, ()) if block != HOLE]
        held.update(ids)
        independent += len(ids)
    return len(held), independent
