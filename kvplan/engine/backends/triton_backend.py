"""Attention through the paged Triton kernels (`kernels/`): store the new K/V, then one prefill launch over the
packed chunks and one split-KV decode launch over the decoding requests."""

from __future__ import annotations

import torch

from kvplan import kernels
from kvplan.engine.forward_context import AttentionMetadata, LayerKV


class TritonAttentionBackend:
    name = "triton"

    def store_kv(self, key: torch.Tensor, value: torch.Tensor, layer: LayerKV, slot_mapping: torch.Tensor) -> None:
        quantized = layer.key_scale is not None  # the kernel quantizes itself, from the model's dtype
        kernels.store_kv(key if quantized else key.to(layer.key.dtype),
                         value if quantized else value.to(layer.value.dtype), layer.key, layer.value, slot_mapping,
                         layer.key_scale, layer.value_scale)

    def attend(self, query: torch.Tensor, layer: LayerKV, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        key_cache, value_cache = layer.key, layer.value
        # a quantized cache is read by the kernels with its scales; queries stay in the model's dtype
        q = query if layer.key_scale is not None else query.to(key_cache.dtype)
        out = torch.empty_like(q)
        split = meta.num_prefill_tokens
        window = {"sink_tokens": meta.sink_tokens, "window_tokens": meta.window_tokens,
                  "k_scale": layer.key_scale, "v_scale": layer.value_scale}
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
