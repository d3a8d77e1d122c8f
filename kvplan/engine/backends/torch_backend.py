"""Reference attention over the paged cache, in torch: gather each request's keys through its block table.

Decodes are batched in groups of similar context length: each group's blocks are gathered with one row-wise
index_select and attended with two batched matmuls on that layout (no permuted copy of K or V). Prefill chunks are
handled one request at a time with SDPA: its causal path when the chunk has no cached prefix, else an explicit
mask (a query at position p sees keys at positions <= p, within the sinks or the window). GQA never repeats K/V.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvplan.engine.forward_context import AttentionMetadata, LayerKV

DECODE_GROUP = 16  # decodes per gathered batch


class TorchAttentionBackend:
    name = "torch"

    def __init__(self) -> None:
        self._groups_meta: AttentionMetadata | None = None  # the step `_groups` were built for
        self._groups: list[DecodeGroup] = []

    def store_kv(self, key: torch.Tensor, value: torch.Tensor, layer: LayerKV, slot_mapping: torch.Tensor) -> None:
        """Write the new tokens' K/V at their slots; a quantized cache gets the rows quantized per token per
        head and their scales (kernels.quant, the scheme the Triton store kernel uses)."""
        kv_heads, head_dim = layer.key.shape[2], layer.key.shape[3]
        for x, cache, scales in ((key, layer.key, layer.key_scale), (value, layer.value, layer.value_scale)):
            if scales is not None:
                from kvplan.kernels.quant import quantize_rows  # here: the kernels package loads triton

                x, row_scales = quantize_rows(x, cache.dtype)
                scales.view(-1, kv_heads).index_copy_(0, slot_mapping, row_scales)
                cache, x = cache.view(torch.uint8), x.view(torch.uint8)  # CPU index ops lack float8: move bytes
            cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, x.to(cache.dtype))

    def attend(self, query: torch.Tensor, layer: LayerKV, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        out = torch.empty_like(query)
        key_cache = layer.key
        kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
        gather = _RowGather(layer, query.dtype)
        for start, length, positions, slots in zip(meta.prefill_query_starts, meta.prefill_query_lens,
                                                   meta.prefill_key_positions, meta.prefill_key_slots, strict=True):
            q = query[start:start + length].transpose(0, 1).unsqueeze(0)  # [1, heads, n, d]
            k, v = gather.slots(slots)
            k = k.view(-1, kv_heads, head_dim).transpose(0, 1).unsqueeze(0)
            v = v.view(-1, kv_heads, head_dim).transpose(0, 1).unsqueeze(0)
            if meta.rope is not None:
                out[start:start + length] = _shifted_attention(q, k, v, positions, meta, scale)[0].transpose(0, 1)
                continue
            if len(positions) == length and not meta.window_tokens:  # no prefix, no window: plain causal
                mask, causal = None, True
            else:
                mask, causal = meta.visible(positions, positions[-length:]), False
            out[start:start + length] = _sdpa(q, k, v, mask, causal, scale)[0].transpose(0, 1)
        if meta.decode_block_tables is not None:
            self._decode(query[meta.num_prefill_tokens:], layer, meta, scale, out[meta.num_prefill_tokens:])
        return out

    def _decode(self, query: torch.Tensor, layer: LayerKV, meta: AttentionMetadata, scale: float,
                out: torch.Tensor) -> None:
        """Decodes in groups of similar context length, each gathered only up to its own longest context, so a
        few long requests do not make every request pay for padding."""
        shape = layer.key.shape
        gather = _RowGather(layer, query.dtype)
        for group in self._decode_groups(meta, shape[1]):
            k, v = gather.blocks(group.blocks)
            k, v = (x.view(len(group.rows), -1, *shape[2:]) for x in (k, v))
            out[group.rows] = _decode_attention(query[group.rows], k, v, group.bias, scale)

    def _decode_groups(self, meta: AttentionMetadata, block_size: int) -> list[DecodeGroup]:
        """The step's decode groups, built once and reused by every layer."""
        if self._groups_meta is not meta:
            self._groups_meta, self._groups = meta, decode_groups(meta, block_size)
        return self._groups


class _RowGather:
    """Reads K/V rows (token slots) or whole blocks out of a layer's cache. 2-D views: index_select over whole
    rows is several times faster than over a 3-D or 4-D tensor. A quantized cache is dequantized on read, to
    the query's dtype, with the scales of the rows read."""

    def __init__(self, layer: LayerKV, dtype: torch.dtype) -> None:
        self.layer, self.dtype = layer, dtype

    def slots(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._read(slots, self.layer.key.shape[0] * self.layer.key.shape[1])

    def blocks(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._read(blocks, self.layer.key.shape[0])

    def _read(self, index: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        layer, out = self.layer, []
        for cache, scales in ((layer.key, layer.key_scale), (layer.value, layer.value_scale)):
            if scales is None:
                values = cache.view(rows, -1).index_select(0, index)
            else:  # [rows, (tokens x) heads x dim] * one scale per (token, head); bytes moved as uint8, as stored
                values = cache.view(torch.uint8).view(rows, -1).index_select(0, index).view(cache.dtype)
                s = scales.view(rows, -1).index_select(0, index)
                values = (values.view(*s.shape, -1).float() * s.unsqueeze(-1)).to(self.dtype).view(len(index), -1)
            out.append(values)
        return out[0], out[1]


@dataclass(slots=True)
class DecodeGroup:
    rows: torch.Tensor  # [n] decode rows in the packed batch
    blocks: torch.Tensor  # [n * width] int64 physical blocks to gather, row by row (holes read block 0, masked)
    bias: torch.Tensor  # [n, 1, width * block_size] float32: 0 where the key is visible, -inf elsewhere


def decode_groups(meta: AttentionMetadata, block_size: int) -> list[DecodeGroup]:
    context = meta.decode_context_lens.long()
    groups = []
    for rows in torch.argsort(context).split(DECODE_GROUP):
        width = -(-int(context[rows].max()) // block_size)
        blocks = meta.decode_block_tables[rows, :width].clamp(min=0).long().reshape(-1)
        visible = meta.decode_key_mask[rows, :width * block_size]
        bias = torch.zeros(visible.shape, dtype=torch.float32).masked_fill_(~visible, float("-inf"))
        groups.append(DecodeGroup(rows, blocks, bias.unsqueeze(1)))
    return groups


def _decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """One query per request: q [B, H, D], k/v [B, keys, Hkv, D] as gathered, bias [B, 1, keys] -> [B, H, D].

    Two batched matmuls straight on the gathered layout, with no permuted copy of K or V: every query head is
    scored against every KV head (H / Hkv times the FLOPs, which are negligible next to reading the cache), and
    query head h keeps KV head h // (H / Hkv), as HF's repeat_kv pairs them. The softmax runs in float32 over
    the last dimension, and its probabilities [B, H, keys] feed the second matmul as they are.
    """
    batch, keys, kv_heads, dim = k.shape
    heads = q.shape[1]
    group = heads // kv_heads
    scores = torch.bmm(q.to(k.dtype), k.reshape(batch, keys * kv_heads, dim).transpose(1, 2))  # [B, H, keys*Hkv]
    # [B, kv head of the query head, group, keys, key's kv head]: the diagonal pairs each query head with its KV head
    scores = scores.view(batch, kv_heads, group, keys, kv_heads).diagonal(dim1=1, dim2=4)  # [B, G, keys, Hkv]
    scores = scores.permute(0, 3, 1, 2).float().contiguous().view(batch, heads, keys).mul_(scale).add_(bias)
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    out = torch.bmm(probs, v.reshape(batch, keys, kv_heads * dim))  # [B, H, Hkv * D]
    out = out.view(batch, kv_heads, group, kv_heads, dim).diagonal(dim1=1, dim2=3)  # [B, G, D, Hkv]
    return out.permute(0, 3, 1, 2).reshape(batch, heads, dim).to(q.dtype)


def _shifted_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_positions: torch.Tensor,
                       meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Attention with StreamingLLM's shifted positions (engine.rope): as `_sdpa` with the sink+window mask, but
    each query's scores against the sink keys use the query rotated back by its offset. q [1, H, n, D], k/v
    [1, Hkv, T, D] -> [1, H, n, D]."""
    n, group = q.shape[2], q.shape[1] // k.shape[1]
    query_positions = key_positions[-n:]
    k, v = (x.repeat_interleave(group, dim=1).to(torch.float32) for x in (k, v))  # HF's repeat_kv pairing
    qf = q.to(torch.float32)
    scores = qf @ k.transpose(-1, -2)  # [1, H, n, T]
    sinks = key_positions < meta.sink_tokens
    if bool(sinks.any()):
        offsets = meta.rope.sink_offsets(query_positions, meta.sink_tokens, meta.window_tokens)
        scores[..., sinks] = meta.rope.rotate(qf, -offsets) @ k[..., sinks, :].transpose(-1, -2)
    scores = (scores * scale).masked_fill(~meta.visible(key_positions, query_positions), float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v).to(q.dtype)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool,
          scale: float) -> torch.Tensor:
    """q [B, H, Tq, D], k/v [B, Hkv, Tk, D] in the cache dtype -> [B, H, Tq, D] in q's dtype."""
    out = F.scaled_dot_product_attention(q.to(k.dtype), k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                         enable_gqa=q.shape[1] != k.shape[1])
    return out.to(q.dtype)
