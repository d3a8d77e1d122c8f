"""The integer sums a step is priced on (`features.StepFeatures`): one step's scheduled items, and a stretch of k
pure-decode steps over n requests, the latter in O(n + k + n·k/b) operations instead of the n × k table of every
request's every step.

Request i attends a = contexts[i] + j tokens in step j (0-based) while j < remaining[i], and nothing after. Its
terms of each per-step sum change only at a few steps: it joins at step 0 and leaves after its last step; its
attended tokens grow by one per step (up to the window W in the sliding-window sums); its blocks ⌈a / b⌉ grow at
the steps where a − 1 is a multiple of b, one step in b. So every feature is a running sum over the steps of those
changes (difference lists), plus the one token per step each live request adds. The sums are exact integers:
the same values, bit for bit, as summing the table (tests/sim/test_step_sums.py checks them against it).

Plain ints and lists of ints in and out, and loops only, so that the compiled build (`scripts/build_compiled_core.sh
--sim`) runs them as C integer arithmetic: a stretch's n and k are tens, where an array library spends most of its
time entering and leaving each operation; `features` wraps the sums in the dataclass the cost models read. A list
item is updated as `a[i] = a[i] + x`, not `a[i] += x`: the compiled build does an augmented item assignment as a
generic Python operation, and the plain form as integer arithmetic.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from kvplan.engine.core.outputs import ScheduledRequest
from kvplan.engine.core.request import Request

if TYPE_CHECKING:
    from mypy_extensions import i64  # native 64-bit locals in the compiled build (no tag checks); int when interpreted


def windowed_attention2(start: int, end: int, window: int) -> int:
    """2 × ∫ min(x, window) dx over [start, end]: the doubled prefill attention work of the chunk's queries when
    each reads at most `window` keys (with an unbounded window, end² − start² = chunk × (2 start + chunk))."""
    below = min(end, window)
    work = below * below - start * start if start < below else 0
    return work + 2 * window * (end - max(start, window)) if end > window else work


def scheduled_sums(items: Iterable[Any], block_size: int, attended_limit: int, bulk: list[Request],
                   sliding_window: int, bulk_sums: tuple[int, int, int] | None = None) -> tuple[int, ...]:
    """`StepFeatures` of one step, in its field order: its scheduled items (anything with `num_new_tokens`,
    `start_pos`, `is_decode`, `samples` and `spec_token_ids`), plus the core's bulk-scheduled plain decodes `bulk`
    (requests about to compute one token each, never sink+window). `attended_limit` > 0 caps the tokens attention
    reads (sink+window); `sliding_window` > 0 adds the window features of sliding layers. `bulk_sums`, when the
    caller has them (`SchedulerOutput.decode_sums`): the bulk's (Σ, Σ of // block_size, max) computed tokens."""
    count = prefill = attn2 = decodes = ctx = ctx_max = blocks = sampled = 0
    w_attn2 = w_ctx = w_blocks = 0
    if bulk:  # each attends its computed tokens c plus the new one: Σ (c + 1), and ⌈(c + 1) / b⌉ = c // b + 1
        if bulk_sums is None:
            bulk_sums = decode_sums(bulk, block_size)
        ctx, blocks, longest = bulk_sums
        count = decodes = sampled = len(bulk)
        ctx, ctx_max, blocks = ctx + count, longest + 1, blocks + count
        if sliding_window:
            w_ctx, w_blocks = window_decode_sums([r.num_computed_tokens + 1 for r in bulk], block_size, sliding_window)
    for item in items:
        count += 1
        # (a step's own items read as the core's class, which the compiled build reads directly: any other item,
        # read by name, takes a generic lookup per field, a few hundred instructions each)
        if isinstance(item, ScheduledRequest):
            n, start, samples, is_decode = item.num_new_tokens, item.start_pos, item.samples, item.is_decode
        else:
            n, start, samples, is_decode = item.num_new_tokens, item.start_pos, item.samples, item.is_decode
        end = start + n
        if samples:  # a verification step's LM head runs at the last verified token and at every draft
            sampled += 1 + len(item.spec_token_ids)
        if attended_limit:  # sink+window: attention reads at most the retained tokens
            end, start = min(end, attended_limit), min(start, attended_limit)
        blocks += -(-end // block_size)
        if is_decode:
            decodes += 1
            ctx += end
            ctx_max = max(ctx_max, end)
        else:
            prefill += n
            attn2 += n * (2 * start + n)
        if sliding_window:
            capped = min(end, sliding_window)
            w_blocks += -(-capped // block_size)
            if is_decode:
                w_ctx += capped
            else:
                w_attn2 += windowed_attention2(start, start + n, sliding_window)
    return (count, prefill, attn2, decodes, ctx, ctx_max, blocks, sampled, int(prefill + decodes >= 2), w_attn2, w_ctx,
            w_blocks)


def decode_sums(bulk: list[Request], block_size: int) -> tuple[int, int, int]:
    """(Σ, Σ of // block_size, max) of the computed tokens of `bulk` (as `SchedulerOutput.decode_sums`)."""
    context = blocks = longest = 0
    for request in bulk:  # (a loop over ints: the compiled build runs it without a list or a boxed sum)
        computed: int = request.num_computed_tokens
        context += computed
        blocks += computed // block_size
        if computed > longest:
            longest = computed
    return context, blocks, longest


def window_decode_sums(ends: Sequence[int], block_size: int, window: int) -> tuple[int, int]:
    """Σ min(end, window) and Σ of the blocks those keys span, over decodes attending `ends` tokens."""
    capped = [min(end, window) for end in ends]
    return sum(capped), sum([-(-c // block_size) for c in capped])


def _block_changes(changes: list[int], context: i64, steps: i64, block_size: i64, limit: i64) -> i64:
    """Record one request's blocks ⌈a / b⌉ in `changes` (one per step of the stretch), a = context + j tokens in its
    steps j < `steps` (>= 1): they grow by one at each step j >= 1 where a − 1 is a multiple of b while a <= `limit`
    (a window: afterwards the keys it reads stay at `limit`; context + steps: no limit inside the stretch), and
    leave after its last step (a request live to the stretch's end leaves after it: nothing to record). Returns its
    step-0 blocks, which join at step 0: the caller sums them (every request's change at step 0, kept in a local
    instead of boxed into changes[0] once per request)."""
    blocks: i64 = -(-min(context, limit) // block_size)
    joined = blocks
    step: i64 = (1 - context) % block_size or block_size  # the first j >= 1 with (context + j − 1) % b == 0
    while step < steps and context + step <= limit:
        changes[step] = changes[step] + 1
        blocks += 1
        step += block_size
    if steps < len(changes):
        changes[steps] = changes[steps] - blocks
    return joined


def stretch_sums(contexts: list[int], remaining: list[int], k: int, block_size: int, window: int,
                 spread: bool) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int]]:
    """Per step of the stretch: (live requests, Σ attended tokens, Σ their blocks, the longest attended or [] when
    not `spread`, Σ min(attended, window) and Σ its blocks or [] and [] when `window` is 0). A step nobody is live
    in has 0 everywhere.

    The changes are kept for the stretch's k steps: a request live in all of them (most are, in a short stretch)
    leaves after it, which no sum reads - so its leaving is not recorded (three list updates per request saved)."""
    live_changes = [0] * k
    context_changes = [0] * k  # Σ of the live requests' step-0 contexts; each step adds its live count
    block_changes = [0] * k
    longest_ending = [0] * (k + 1) if spread else []  # the longest step-0 context of those live to step j - 1
    # Step 0's changes (every live request joins there) are summed in native locals, not boxed into lists
    live: i64 = 0
    joined: i64 = 0
    joined_blocks: i64 = 0
    for i in range(len(contexts)):
        context: i64 = contexts[i]
        steps: i64 = min(remaining[i], k)
        if steps <= 0:
            continue
        live += 1
        joined += context
        if steps < k:  # it leaves inside the stretch
            live_changes[steps] = live_changes[steps] - 1
            context_changes[steps] = context_changes[steps] - context
        joined_blocks += _block_changes(block_changes, context, steps, block_size, context + steps)
        if spread and context > longest_ending[steps]:
            longest_ending[steps] = context
    if k:
        live_changes[0] = live_changes[0] + live  # (an index steps >= 1 never holds step 0's)
        context_changes[0] = context_changes[0] + joined
        block_changes[0] = block_changes[0] + joined_blocks
    lives, attended, touched = [0] * k, [0] * k, [0] * k
    count: i64 = 0
    total: i64 = 0
    blocks: i64 = 0
    for j in range(k):
        count += live_changes[j]
        total += context_changes[j]
        blocks += block_changes[j]
        lives[j] = count
        attended[j] = total + j * count
        touched[j] = blocks
    longest: list[int] = []
    if spread:  # the longest live context: the largest step-0 context among the requests still live, plus j
        longest = [0] * k
        top = 0
        for j in range(k - 1, -1, -1):
            top = max(top, longest_ending[j + 1])
            longest[j] = top + j if lives[j] else 0
    capped, capped_blocks = window_sums(contexts, remaining, k, block_size, window) if window else ([], [])
    return lives, attended, touched, longest, capped, capped_blocks


def window_sums(contexts: list[int], remaining: list[int], k: int, block_size: int,
                window: int) -> tuple[list[int], list[int]]:
    """Per step: Σ min(attended, window) over the live requests, and Σ of the blocks those keys span. A request's
    capped count grows by one per step until it reaches the window, then stays. (Changes kept for the k steps, as
    in `stretch_sums`.)"""
    level_changes = [0] * k  # its step-0 value joins, its last step's value leaves
    slope_changes = [0] * k  # +1 from step 1 up to the step it reaches the window
    block_changes = [0] * k
    joined_blocks: i64 = 0  # step 0's blocks, summed natively as in `stretch_sums`
    for i in range(len(contexts)):
        context = contexts[i]
        steps = min(remaining[i], k)
        if steps <= 0:
            continue
        level_changes[0] = level_changes[0] + min(context, window)
        if steps < k:
            level_changes[steps] = level_changes[steps] - min(context + steps - 1, window)
        growing = min(window - context, steps - 1)  # the last step its capped count still grows in
        if growing >= 1:
            slope_changes[1] = slope_changes[1] + 1
            if growing + 1 < k:
                slope_changes[growing + 1] = slope_changes[growing + 1] - 1
        joined_blocks += _block_changes(block_changes, context, steps, block_size, window)
    if k:
        block_changes[0] = block_changes[0] + joined_blocks
    capped, capped_blocks = [0] * k, [0] * k
    level = slope = grown = blocks = 0
    for j in range(k):
        level += level_changes[j]
        slope += slope_changes[j]
        grown += slope
        blocks += block_changes[j]
        capped[j] = level + grown
        capped_blocks[j] = blocks
    return capped, capped_blocks
