"""Reference attention over the paged cache: gather each request's keys through its slots, then SDPA.

Decodes are batched: their block tables are gathered into one padded [decodes, kv_heads, keys, head_dim]
tensor with a visibility mask, and one SDPA call covers them all. Prefill chunks are handled one request at a
time with an explicit causal mask (a query at position p sees keys at positions <= p), which also covers
chunked prefill and prefix-cache hits (the prefix keys were written by earlier steps or other requests).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.forward_context import AttentionMetadata


class TorchAttentionBackend:
    name = "torch"

    def store_kv(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
        key_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, key.to(key_cache.dtype))
        value_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, value.to(value_cache.dtype))

    def attend(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float) -> torch.Tensor:
        out = torch.empty_like(query)
        kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
        flat_k = key_cache.view(-1, kv_heads, head_dim)
        flat_v = value_cache.view(-1, kv_heads, head_dim)
        for start, length, positions, slots in zip(meta.prefill_query_starts, meta.prefill_query_lens,
                                                   meta.prefill_key_positions, meta.prefill_key_slots, strict=True):
            q = query[start:start + length]
            query_positions = positions[-length:]  # the chunk's own tokens are the last keys
            mask = positions.unsqueeze(0) <= query_positions.unsqueeze(1)
            out[start:start + length] = _sdpa(q.unsqueeze(0), flat_k[slots].unsqueeze(0),
                                              flat_v[slots].unsqueeze(0), mask.unsqueeze(0), scale)[0]
        if meta.decode_block_tables is not None:
            tables = meta.decode_block_tables
            decodes = tables.shape[0]
            k = key_cache[tables].reshape(decodes, -1, kv_heads, head_dim)
            v = value_cache[tables].reshape(decodes, -1, kv_heads, head_dim)
            q = query[meta.num_prefill_tokens:].unsqueeze(1)  # [decodes, 1, heads, head_dim]
            mask = meta.decode_key_mask.unsqueeze(1)  # [decodes, 1, keys]
            out[meta.num_prefill_tokens:] = _sdpa(q, k, v, mask, scale)[:, 0]
        return out


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q [B, Tq, H, D], k/v [B, Tk, Hkv, D], mask [B, Tq, Tk] (True = visible) -> [B, Tq, H, D]."""
    heads, kv_heads = q.shape[2], k.shape[2]
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if heads != kv_heads:
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    dtype = q.dtype
    out = F.scaled_dot_product_attention(q, k.to(dtype), v.to(dtype), attn_mask=mask.unsqueeze(1), scale=scale)
    return out.transpose(1, 2)
