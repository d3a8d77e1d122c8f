"""What one forward pass needs to know about the paged KV cache, shared with the attention function.

HF models call attention once per layer with no idea of block tables. The model runner fills an
`AttentionMetadata` for the step and installs it here for the duration of the forward pass; the registered
attention function reads it (and the per-layer KV tensors) from here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class AttentionMetadata:
    """The batch is packed: all new tokens of all scheduled requests in one sequence, prefills first
    (each with `query_lens[i]` tokens), then decodes (one token each)."""

    slot_mapping: torch.Tensor  # [num_tokens] int64, physical slot each new token's K/V is written to
    # prefill (or chunk / recompute) requests, each attending to its cached prefix plus itself, causally
    prefill_query_starts: list[int]
    prefill_query_lens: list[int]
    prefill_key_positions: list[torch.Tensor]  # per request: positions of the keys it attends to
    prefill_key_slots: list[torch.Tensor]  # per request: slots of those keys
    # decode requests: one query each, attending to `decode_context_lens` keys through `decode_block_tables`
    num_prefill_tokens: int
    decode_block_tables: torch.Tensor | None  # [num_decodes, max_blocks] int64 (holes point at block 0)
    decode_key_mask: torch.Tensor | None  # [num_decodes, max_blocks * block_size] bool: key visible


@dataclass(slots=True)
class LayerKV:
    key: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    value: torch.Tensor


@dataclass(slots=True)
class ForwardContext:
    metadata: AttentionMetadata
    layers: list[LayerKV]
    backend: object  # an attention backend (engine.backends)


_current: ForwardContext | None = None


@contextmanager
def forward_context(context: ForwardContext) -> Iterator[None]:
    global _current
    previous, _current = _current, context
    try:
        yield
    finally:
        _current = previous


def current_context() -> ForwardContext:
    if _current is None:
        raise RuntimeError("paged attention was called outside the engine's forward pass (no forward context); "
                           "load models for HF generate with a standard attn_implementation")
    return _current
