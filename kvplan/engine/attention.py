"""Paged attention plugged into unmodified HF modules through transformers' `AttentionInterface`.

HF computes Q, K, V (after RoPE) and calls the registered function per layer with tensors shaped
[1, heads, tokens, head_dim] for the packed batch. We store the new K/V into the paged cache and let the
backend attend through the block tables.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface

from kvplan.engine.forward_context import current_context

ATTN_IMPLEMENTATION = "kvplan_paged"


def paged_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, scaling: float | None = None,
                            dropout: float = 0.0, **kwargs) -> tuple[torch.Tensor, None]:
    context = current_context()
    layer = context.layers[module.layer_idx]
    q = query[0].transpose(0, 1)  # [tokens, heads, head_dim]
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    backend = context.backend
    backend.store_kv(k, v, layer, context.metadata.slot_mapping)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    out = backend.attend(q, layer, context.metadata, scale)
    return out.unsqueeze(0), None  # [1, tokens, heads, head_dim], as HF's attention functions return


def register_paged_attention() -> str:
    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
    return ATTN_IMPLEMENTATION
