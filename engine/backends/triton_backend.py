"""Attention through the paged Triton kernels (`kernels/`): store the new K/V, then one prefill launch over the
packed chunks and one split-KV decode launch over the decoding requests."""

from __future__ import annotations

import torch

import kernels
from engine.forward_context import AttentionMetadata


class TritonAttentionBackend:
    name = "triton"

    def store_kv(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        kernels.store_kv(key.to(key_cache.dtype), value.to(value_cache.dtype), key_cache, value_cache, slot_mapping)

    def attend(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float) -> torch.Tensor:
        q = query.to(key_cache.dtype)
        out = torch.empty_like(q)
        split = meta.num_prefill_tokens
        window = {"sink_tokens": meta.sink_tokens, "window_tokens": meta.window_tokens}
        if meta.prefill_query_lens:
            kernels.paged_prefill_attention(
                q[:split], key_cache, value_cache, meta.prefill_block_tables, meta.prefill_cu_seqlens,
                meta.prefill_prefix_lens, scale=scale, max_query_len=max(meta.prefill_query_lens), out=out[:split],
                **window)
        if meta.decode_block_tables is not None:
            tables = meta.decode_block_tables
            splits = kernels.choose_num_splits(tables.shape[0], key_cache.shape[2],
                                               tables.shape[1] * key_cache.shape[1], _num_sms(q.device))
            kernels.paged_decode_attention(q[split:], key_cache, value_cache, tables, meta.decode_context_lens,
                                           scale=scale, num_splits=splits, out=out[split:], **window)
        return out.to(query.dtype)


def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
