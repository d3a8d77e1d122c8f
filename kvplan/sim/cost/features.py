"""Step features both cost models price, for one step or a vectorised stretch of pure-decode steps.

Per step: scheduled requests, prefill tokens (every token that is not a one-token decode), prefill attention
work Σ chunk × (start + chunk/2) (kept doubled, so it stays an exact integer), decode requests, Σ and max of
decode context (tokens attended, the new one included), KV blocks touched (Σ over requests of the blocks their
attention reads: the block-size effect), sampled rows (requests whose last pending token is computed in this
step: only those rows go through the LM head and the sampler), and `batched`: 1 when the linear layers see two or
more token rows. One row is a matrix-vector product, which CPU BLAS libraries run on a different, cheaper path
than a matrix-matrix product (measured on llama-100m bf16, 2 cores: 42 ms for one decode, 70 ms for two).

`step_features` reads any sequence of items with `num_new_tokens`, `start_pos`, `is_decode`, `samples` and
`spec_token_ids` (the drafts a speculative step verifies: its LM head runs at each of them too): the
core's `ScheduledRequest`s in the simulator, or the items of a recorded engine step profile (`kvplan calibrate`),
so a live step and a simulated one are described by the same arithmetic.

A model with sliding-window layers (Gemma 2/3, gpt-oss) adds the same three attention features with each
query's keys capped at the window W (a query at position p reads min(p + 1, W) keys): `window_attention2`,
`window_context` and `window_blocks`. The cost model prices its full layers on the plain features and its
sliding layers on these; they stay 0 when no window is given.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Generic, TypeVar

import numpy as np

from kvplan.sim.cost.step_sums import scheduled_sums, stretch_sums, window_decode_sums

# What a feature is: `int` for one step, `np.ndarray` (int64, one entry per step) for a stretch of steps.
N = TypeVar("N", int, np.ndarray)


@dataclass(slots=True)
class StepFeatures(Generic[N]):
    """Integer features: plain ints for one step (`StepFeatures[int]`), int64 arrays (one entry per step) for a
    stretch (`StepFeatures[np.ndarray]`; a feature that is 0 in every step of it may stay a plain 0). The cost
    models apply the same IEEE operations to either, so a step is priced bit-identically both ways."""

    num_requests: N
    prefill_tokens: N | int
    prefill_attention2: N | int  # 2 × Σ chunk × (start + chunk/2) = Σ chunk × (2 start + chunk)
    decode_requests: N
    decode_context: N
    decode_context_max: N
    blocks_touched: N
    sampled: N  # rows that reach the LM head (every decode; a prefill's last chunk)
    batched: N  # 1 if the step computes >= 2 token rows (matrix-matrix, not matrix-vector)
    # The attention features of sliding-window layers (keys capped at the window); 0 without a window.
    window_attention2: N | int = 0
    window_context: N | int = 0
    window_blocks: N | int = 0


FEATURE_NAMES = tuple(f.name for f in fields(StepFeatures))


@dataclass(slots=True)
class StepItem:
    """One row group of a step that is no scheduler output (a draft model's pass, a step reconstructed from a
    client's token times): the fields `step_features` reads."""

    num_new_tokens: int
    start_pos: int
    is_decode: bool
    samples: bool = True
    spec_token_ids: tuple[int, ...] = ()


def step_max(a, b):
    """max of plain numbers, or element-wise when either is a stretch's array (the same IEEE result per entry,
    so a step prices bit-identically alone or in a stretch)."""
    return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)


def is_zero(feature) -> bool:
    """A feature left a plain 0 (a stretch's prefill features): a term it multiplies is exactly +0.0, and adding
    +0.0 to a non-negative number changes no bit, so a cost model may leave such a term out."""
    return type(feature) is int and feature == 0


def step_min(a, b):
    """min, as `step_max`."""
    return np.minimum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else min(a, b)


def step_features(items: Iterable, block_size: int, attended_limit: int = 0, bulk: Sequence = (),
                  sliding_window: int = 0) -> StepFeatures[int]:
    """Features of one step's scheduled items, plus the core's bulk-scheduled plain decodes `bulk` (requests
    about to compute one token each, never sink+window). `attended_limit` > 0 caps the tokens attention reads
    (sink+window); `sliding_window` > 0 adds the window features of sliding layers (`step_sums.scheduled_sums`)."""
    return StepFeatures(*scheduled_sums(items, block_size, attended_limit, list(bulk), sliding_window))


def decode_stretch_features(contexts: Sequence[int] | np.ndarray, remaining: Sequence[int] | np.ndarray, k: int,
                            block_size: int, sliding_window: int = 0,
                            spread: bool = True) -> StepFeatures[np.ndarray]:
    """Features of k pure-decode steps where request i attends contexts[i] + j tokens in step j (0-based) and
    runs remaining[i] steps: a request that finishes drops out of the later steps. Summed in O(n + k) by
    `step_sums.stretch_sums` (lists of ints, as the replica keeps them, pass through unconverted).
    `spread` False leaves `decode_context_max` and `batched` a plain 0, for a cost model that prices neither
    (`sim.cost.reads_spread`): array operations fewer per stretch."""
    contexts = contexts if type(contexts) is list else np.asarray(contexts, dtype=np.int64).tolist()
    remaining = remaining if type(remaining) is list else np.asarray(remaining, dtype=np.int64).tolist()
    live, attended, blocks, longest, capped, capped_blocks = stretch_sums(contexts, remaining, k, block_size,
                                                                         sliding_window, spread)
    count = np.array(live, dtype=np.int64)  # one array: the cost models recognise a decode stretch by it
    window: tuple = (0, 0, 0)
    if sliding_window:
        window = (0, np.array(capped, dtype=np.int64), np.array(capped_blocks, dtype=np.int64))
    spread_terms = (np.array(longest, dtype=np.int64), (count >= 2).astype(np.int64)) if spread else (0, 0)
    return StepFeatures(count, 0, 0, count, np.array(attended, dtype=np.int64), spread_terms[0],
                        np.array(blocks, dtype=np.int64), count, spread_terms[1], *window)


def first_decode_features(contexts: list[int], block_size: int, sliding_window: int = 0) -> StepFeatures[int]:
    """The first step of `decode_stretch_features` as plain ints (a cheap estimate of the step time)."""
    window = (0, *window_decode_sums(contexts, block_size, sliding_window)) if sliding_window else (0, 0, 0)
    n = len(contexts)  # ⌈c / b⌉ = (c - 1) // b + 1
    return StepFeatures(n, 0, 0, n, sum(contexts), max(contexts), sum([(c - 1) // block_size for c in contexts]) + n,
                        n, int(n >= 2), *window)
