"""Reference attention over the paged cache: gather each request's keys through its slots, then SDPA.

Decodes are batched: their block tables are gathered into one padded [decodes, kv_heads, keys, head_dim]
tensor with a visibility mask, and one SDPA call covers them all. Prefill chunks are handled one request at a
time: a chunk with no cached prefix uses SDPA's causal path; a chunk after a prefix (chunked prefill, prefix-cache
hit, sink+window holes) uses an explicit mask (a query at position p sees keys at positions <= p). Attention runs
in the cache's dtype (the engine keeps a float32 cache on CPU, where half-precision attention is slow); GQA is
handled by SDPA without repeating K/V.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.forward_context import AttentionMetadata

DECODE_GROUP = 16  # decodes per gathered batch


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
            q = query[start:start + length].transpose(0, 1).unsqueeze(0)  # [1, heads, n, d]
            k = flat_k.index_select(0, slots).transpose(0, 1).unsqueeze(0)  # [1, kv_heads, keys, d]
            v = flat_v.index_select(0, slots).transpose(0, 1).unsqueeze(0)
            if len(positions) == length and not meta.window_tokens:  # no prefix, no window: plain causal
                mask, causal = None, True
            else:
                mask, causal = meta.visible(positions, positions[-length:]), False
            out[start:start + length] = _sdpa(q, k, v, mask, causal, scale)[0].transpose(0, 1)
        if meta.decode_block_tables is not None:
            self._decode(query[meta.num_prefill_tokens:], key_cache, value_cache, meta, scale,
                         out[meta.num_prefill_tokens:])
        return out


    @staticmethod
    def _decode(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float, out: torch.Tensor) -> None:
        """Decodes in groups of similar context length, each gathered only up to its own longest context, so a
        few long requests do not make every request pay for padding."""
        block_size, kv_heads, head_dim = key_cache.shape[1:]
        context = meta.decode_context_lens.long()
        for rows in torch.argsort(context).split(DECODE_GROUP):
            width = -(-int(context[rows].max()) // block_size)
            blocks = meta.decode_block_tables[rows, :width].clamp(min=0).long().reshape(-1)  # holes are masked
            k = key_cache.index_select(0, blocks).view(len(rows), -1, kv_heads, head_dim).transpose(1, 2)
            v = value_cache.index_select(0, blocks).view(len(rows), -1, kv_heads, head_dim).transpose(1, 2)
            mask = meta.decode_key_mask[rows, :width * block_size][:, None, None, :]
            out[rows] = _sdpa(query[rows].unsqueeze(2), k, v, mask, False, scale)[:, :, 0]


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool,
          scale: float) -> torch.Tensor:
    """q [B, H, Tq, D], k/v [B, Hkv, Tk, D] in the cache dtype -> [B, H, Tq, D] in q's dtype."""
    out = F.scaled_dot_product_attention(q.to(k.dtype), k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                         enable_gqa=q.shape[1] != k.shape[1])
    return out.to(q.dtype)
