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
    (each with `prefill_query_lens[i]` tokens), then decodes (one token each).

    Visibility (StreamingLLM-style when `window_tokens` > 0): the query at position q sees key positions
    p <= q with p < sink_tokens or p > q - window_tokens. Blocks released by sink+window are -1 in the block
    tables and are never read (no visible position lies in them).
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64, physical slot each new token's K/V is written to
    num_prefill_tokens: int
    sink_tokens: int
    window_tokens: int
    # prefill (chunk, recompute) requests, each attending causally to its cached prefix plus itself
    prefill_query_starts: list[int]
    prefill_query_lens: list[int]
    prefill_key_positions: list[torch.Tensor]  # per request: positions of the keys it holds, up to its last query
    prefill_key_slots: list[torch.Tensor]  # per request: slots of those keys
    prefill_block_tables: torch.Tensor | None  # [num_prefills, max_blocks] int32, -1 = none / released
    prefill_cu_seqlens: torch.Tensor | None  # [num_prefills + 1] int32
    prefill_prefix_lens: torch.Tensor | None  # [num_prefills] int32: tokens before each chunk
    # decode requests: one query each, over `decode_context_lens` keys
    decode_block_tables: torch.Tensor | None  # [num_decodes, max_blocks] int32, -1 = none / released
    decode_context_lens: torch.Tensor | None  # [num_decodes] int32
    decode_key_mask: torch.Tensor | None  # [num_decodes, max_blocks * block_size] bool: key visible
    # position_mode 'shifted' (engine.rope): every request takes the per-request (prefill) path, and its scores
    # against the sinks use the query rotated back to the cache's own positions
    rope: object | None = None  # engine.rope.Rope

    def visible(self, key_positions: torch.Tensor, query_positions: torch.Tensor) -> torch.Tensor:
        """[queries, keys] bool: causal, and inside the sinks or the window."""
        k, q = key_positions.unsqueeze(0), query_positions.unsqueeze(1)
        mask = k <= q
        if self.window_tokens:
            mask &= (k < self.sink_tokens) | (k > q - self.window_tokens)
        return mask


@dataclass(slots=True)
class LayerKV:
    key: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    value: torch.Tensor
    # quantized caches (fp8 e4m3, int8): one float32 scale per token per KV head, [num_blocks, block_size,
    # num_kv_heads], addressed by the same slot as the row (kernels.quant); None for 16/32-bit caches
    key_scale: torch.Tensor | None = None
    value_scale: torch.Tensor | None = None

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every tensor a block copy or swap must move: K, V and, when quantized, their scales."""
        return (self.key, self.value) if self.key_scale is None else (self.key, self.value, self.key_scale,
                                                                      self.value_scale)


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
