"""Bulk scheduling of the running decodes that lead a mixed step, for count-only runs (the simulator).

In a step that also prefills or admits - the step after every arrival under load - most of the batch is plain
decodes: requests generating their next token with room, or one new block, for it. The scheduler's general loop
spends an object and several calls on each; here they are handled as one list, `SchedulerOutput.decodes`, with
exactly the effects the general loop has on them. Only a *leading* run of `running` qualifies, so that their
allocations and prefix-cache registrations (in `schedule`, each request's allocation before its registration) and
their completions (in `update`) keep their places in running order before everything else in the step::

    running:  [d d d d d d d | p d d]       d: plain decode, p: anything else (a prefill chunk, a recompute, a
               └── bulk ───┘  └ general loop ┘      copy-on-write, an n > 1 prompt about to fork)

A plain decode here: count-only (no token ids, so no stop token), one token pending past its prompt, n = 1 or
already forked, and its next position either inside its private last block or opening exactly one new block.
The run is taken only when the free blocks cover its new blocks *and* whatever the rest of the step could ask
for, so the general loop never preempts in such a step (a victim could otherwise be one of the bulk decodes).
Sink+window configurations never use it (their update releases blocks per request).
"""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING

from kvplan.engine.core.kv_manager import cdiv
from kvplan.engine.core.outputs import SchedulerOutput, UpdateOutput
from kvplan.engine.core.request import RequestStatus

if TYPE_CHECKING:
    from kvplan.engine.core.scheduler import Scheduler

RUNNING = RequestStatus.RUNNING


def schedule_decode_prefix(sched: Scheduler, out: SchedulerOutput, budget: int) -> int:
    """Schedule the leading plain decodes of `sched.running` (at most `budget`) into `out.decodes`, allocating
    their new blocks in running order; returns how many (0: the general loop schedules everything)."""
    if sched._windowed:
        return 0
    running, kv = sched.running, sched.kv
    pool = getattr(kv, "pool", None)
    bs, tables = sched.block_size, kv.tables
    registering = sched._keys_wanted
    count = new = 0
    todo: list[int] = []  # the few that open a block or fill one in this step, in running order
    for request in running if len(running) <= budget else islice(running, max(budget, 0)):
        pos = request.num_computed_tokens
        output = request.num_output_tokens
        # A decode has one token pending past its prompt: pos == prompt + output - 1 with output >= 1 (output 0
        # would be the prompt's last token)
        if (output == 0 or pos != request.prompt_len + output - 1 or request.token_ids is not None
                or (request.n > 1 and not request.forked)):
            break
        if pool is not None:
            table = tables[request.request_id]
            held = len(table) * bs
            if pos < held:
                if table[pos // bs].ref_cnt != 1:
                    break  # copy-on-write first: the general loop's case
                if registering and pos + 1 >= (request.num_hashed_blocks + 1) * bs:
                    todo.append(count)
            elif pos == held:
                new += 1
                todo.append(count)
            else:
                break
        count += 1
    if count == 0 or (pool is not None and pool.num_free - new < _rest_need(sched, count)):
        return 0
    if todo:
        ids, commit = kv.block_ids, kv.commit
        for index in todo:  # per request: its allocation, then its registration (`_emit`)
            request = running[index]
            pos = request.num_computed_tokens
            table = tables[request.request_id]
            if pos == len(table) * bs:
                block = pool.allocate()  # an empty block, or the policy's victim, as `kv.allocate` takes it
                table.append(block)
                ids[request.request_id].append(block.block_id)
            if registering and pos + 1 >= (request.num_hashed_blocks + 1) * bs:
                commit(request, pos + 1)  # the step fills a block: keyed when scheduled, as vLLM
    out.decodes = running[:count]
    out.num_batched_tokens += count
    return count


def _rest_need(sched: Scheduler, first: int) -> int:
    """Most blocks the running requests after the bulk decodes could allocate in this step (every pending token,
    plus a copy of a shared tail): with that many free, none of them has to preempt."""
    bs, tables, need = sched.block_size, sched.kv.tables, 0
    for request in sched.running[first:]:
        table = tables.get(request.request_id)
        held = 0 if table is None else len(table)
        need += max(cdiv(request.num_tokens, bs) - held, 0) + 1
    return need


def update_decodes(sched: Scheduler, out: SchedulerOutput, result: UpdateOutput) -> None:
    """`update()` for `out.decodes`: one token each, output budgets finished (their full blocks were registered
    when they were scheduled)."""
    finish = sched._finish
    for request in out.decodes:
        if request.status is not RUNNING:
            continue  # aborted after schedule()
        request.num_computed_tokens += 1
        request.num_output_tokens += 1
        if request.num_output_tokens >= request.max_tokens:
            finish(request, "length", result)
