"""Copies of a sequence group's block tables from one pool to another: swap out to the CPU pool, and back.

Invariants (`tests/core/test_kv_manager.py`'s swap tests):

* every distinct block of the group is copied exactly once, in table order, and a block several of the group's
  tables hold is held by the same copy in each of them (one reference per table), so the group's sharing - a
  fork's, a beam group's - survives the round trip;
* a hole (`None`: a block sink+window released) stays a hole and costs nothing;
* `swap_in_blocks` counts exactly the blocks that copying back and then letting each member compute its next
  tokens takes: the copies, each member's new blocks, and the copy-on-write copy of a partial block the group
  shares (the copy leaves the block one holder fewer).
"""

from __future__ import annotations

from kvplan.engine.core.block_pool import BlockPool, KVBlock


def distinct_blocks(tables: list[list[KVBlock | None]]) -> int:
    """How many blocks copying `tables` takes: each distinct block once."""
    return len({block.block_id for table in tables for block in table if block is not None})


def copy_tables(tables: list[list[KVBlock | None]], target: BlockPool
                ) -> tuple[list[list[KVBlock | None]], list[tuple[int, int]]]:
    """The tables copied into `target` (the caller checked it has `distinct_blocks(tables)` free), and the
    (source, copy) block ids to move, each distinct block once (see the module)."""
    copy_of: dict[int, KVBlock] = {}
    copies: list[tuple[int, int]] = []
    new_tables: list[list[KVBlock | None]] = []
    for table in tables:
        new_table: list[KVBlock | None] = []
        for block in table:
            if block is None:
                new_table.append(None)
                continue
            dst = copy_of.get(block.block_id)
            if dst is None:
                dst = copy_of[block.block_id] = target.allocate()
                copies.append((block.block_id, dst.block_id))
            else:
                target.share(dst)
            new_table.append(dst)
        new_tables.append(new_table)
    return new_tables, copies


def swap_in_blocks(tables: list[list[KVBlock | None]], computed: list[int], num_new_tokens: list[int],
                   block_size: int) -> int:
    """Blocks needed to copy the group's swapped-out `tables` back and let member i, with `computed[i]` tokens
    computed, compute `num_new_tokens[i]` more (see the module)."""
    holders: dict[int, int] = {}  # block id -> tables holding it (its ref count where it lies)
    for table in tables:
        for block in table:
            if block is not None:
                holders[block.block_id] = holders.get(block.block_id, 0) + 1
    cost = len(holders)
    for table, start, n in zip(tables, computed, num_new_tokens, strict=True):
        cost += max(-(-(start + n) // block_size) - len(table), 0)  # ⌈(start + n) / b⌉ blocks, less those held
        tail = table[start // block_size] if start % block_size and start // block_size < len(table) else None
        if n and tail is not None and holders[tail.block_id] > 1:
            cost += 1  # copy-on-write of a shared partial block; the copy drops one holder
            holders[tail.block_id] -= 1
    return cost
