"""The tier transfers a step reports are enough to keep real KV memory right: a model of the memory (each block slot
holds the token whose KV it stores) replays every step's swaps, tier transfers and copies in the runner's order,
writes the step's tokens, and every scheduled request must then read exactly its own tokens - prefix hits on
promoted blocks, demoted blocks reused in the same step and tier slots reused within a step included."""

from __future__ import annotations

import random

import pytest

from kvplan.engine.core.request import make_request
from kvplan.engine.core.tier_transfers import GPU, TierTransfer, copy_batches, num_demotions, promotions_of
from tests.core.helpers import make_scheduler

BS = 4


class Memory:
    """Token ids per block slot of the GPU pool, the swap pool and each tier (None: never written)."""

    def __init__(self, pools: dict[str, int]) -> None:
        self.pools = {name: [[None] * BS for _ in range(n)] for name, n in pools.items()}

    def copy(self, src: str, dst: str, pairs: list[tuple[int, int]]) -> None:
        read = [list(self.pools[src][s]) for s, _ in pairs]  # a batch reads before it writes, as one copy kernel
        for (_, d), contents in zip(pairs, read, strict=True):
            self.pools[dst][d] = contents


def run_step(sched, memory: Memory, rng: random.Random, counts: dict[str, int], order: str = "core") -> None:
    out = sched.schedule()
    memory.copy(GPU, "swap", out.swap_out)
    batches = copy_batches(out.tier_transfers)
    if order == "no_promotions":  # a runner that never copies a hit back up
        batches = [b for b in batches if b[1] != GPU]
    if order != "after_forward":
        for src, dst, pairs in batches:
            memory.copy(src, dst, pairs)
    memory.copy("swap", GPU, out.swap_in)
    memory.copy(GPU, GPU, out.copies)
    gpu = memory.pools[GPU]
    for item in out.scheduled:  # the forward pass writes every new token's KV before any attention reads
        tokens = item.request.token_ids
        for pos in range(item.start_pos, item.start_pos + item.num_new_tokens):
            gpu[item.block_ids[pos // BS]][pos % BS] = tokens[pos]
    if order == "after_forward":  # demoted blocks are copied out only once the step overwrote them
        for src, dst, pairs in batches:
            memory.copy(src, dst, pairs)
    for item in out.scheduled:
        tokens = item.request.token_ids
        for pos in range(item.start_pos + item.num_new_tokens):
            block = item.block_ids[pos // BS]
            assert gpu[block][pos % BS] == tokens[pos], (item.request_id, pos, out.step_id)
    counts["promotions"] += len(out.promotions)
    counts["demotions"] += num_demotions(out.tier_transfers)
    sampled = [rng.randrange(1000, 2000) for _ in out.scheduled]  # generated tokens differ from every prompt's
    sched.update(out, sampled)


def drive(sched, memory: Memory, rng: random.Random, order: str = "core") -> dict[str, int]:
    """Waves of requests, each wave sharing one of three system prompts in turn: by the time a prompt comes back
    the waves between have pushed its blocks out of the GPU (into the tier, if it is large enough)."""
    prefixes = [[rng.randrange(1, 1000) for _ in range(rng.choice((8, 12, 16)))] for _ in range(3)]
    counts = {"promotions": 0, "demotions": 0}
    for wave in range(6):
        for i in range(5):
            prompt = prefixes[wave % 3] + [rng.randrange(1, 1000) for _ in range(rng.randrange(1, 7))]
            sched.add_request(make_request(f"w{wave}r{i}", prompt_token_ids=prompt, max_tokens=rng.randrange(1, 9)))
        while sched.has_unfinished():
            run_step(sched, memory, rng, counts, order)
    return counts


@pytest.mark.parametrize("disk", [0, 8])
@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
@pytest.mark.parametrize("seed", range(6))
def test_replaying_the_transfers_in_the_runners_order_keeps_every_read_right(seed, preemption_mode, disk):
    rng = random.Random(seed)
    num_blocks, tier = 12, rng.choice((12, 24))
    sched = make_scheduler(BS, num_blocks, budget=24, max_seqs=4, kv_offloading_blocks=tier, kv_disk_blocks=disk,
                           preemption_mode=preemption_mode, num_cpu_blocks=16)
    counts = drive(sched, Memory({GPU: num_blocks, "swap": 16, "cpu": tier, "disk": disk}), rng)
    assert counts["promotions"] > 0 and counts["demotions"] > tier, counts  # hits came back, slots were reused


@pytest.mark.parametrize("order", ["after_forward", "no_promotions"])
def test_a_runner_that_skips_or_delays_the_copies_reads_wrong_tokens(order):
    """The copies and their order are what makes it right: a runner that copies demoted blocks out only after the
    step overwrote them, or never copies promoted blocks in, fails the same workload."""
    failures = 0
    for seed in range(6):
        rng = random.Random(seed)
        sched = make_scheduler(BS, 12, budget=24, max_seqs=4, kv_offloading_blocks=12)
        try:
            drive(sched, Memory({GPU: 12, "swap": 1, "cpu": 12}), rng, order)
        except AssertionError:
            failures += 1
    assert failures == 6


def test_batches_keep_order_across_directions_and_the_last_write_of_a_slot():
    log = [TierTransfer(GPU, 3, "cpu", 0), TierTransfer(GPU, 4, "cpu", 0), TierTransfer("cpu", 0, GPU, 5),
           TierTransfer(GPU, 5, "cpu", 1), TierTransfer("cpu", 1, "disk", 2), TierTransfer(GPU, 6, "cpu", 1)]
    assert copy_batches(log) == [(GPU, "cpu", [(4, 0)]), ("cpu", GPU, [(0, 5)]), (GPU, "cpu", [(5, 1)]),
                                 ("cpu", "disk", [(1, 2)]), (GPU, "cpu", [(6, 1)])]
    assert promotions_of(log) == [("cpu", 5)]
