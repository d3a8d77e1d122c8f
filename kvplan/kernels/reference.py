"""Torch reference implementations of the paged-KV kernels: slow, obvious, float32 throughout.

Each mirrors one kernel's contract exactly (same arguments, same results up to rounding) so that tests can
compare the two. They loop over requests in Python and gather K/V through the block table, reading only the
visible positions, so a block table entry that the contract says is never read may hold anything.
"""

from __future__ import annotations

import math

import torch

from kvplan.kernels.quant import dequantize, is_quantized, quantize_rows


def ref_store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor, k_scale: torch.Tensor | None = None,
                 v_scale: torch.Tensor | None = None) -> None:
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    for src, cache, scale in ((key, k_cache, k_scale), (value, v_cache, v_scale)):
        rows = cache.view(-1, *cache.shape[2:])
        if is_quantized(cache.dtype):
            q, s = quantize_rows(src[keep], cache.dtype)
            rows[slots] = q
            scale.view(-1, scale.shape[-1])[slots] = s
        else:
            rows[slots] = src[keep].to(cache.dtype)


def gather_kv(cache: torch.Tensor, scale: torch.Tensor | None, block_table: torch.Tensor,
              positions: torch.Tensor) -> torch.Tensor:
    """Float32 rows `[len(positions), num_kv_heads, head_dim]` of one request's cache at token `positions`."""
    block_size = cache.shape[1]
    blocks = block_table[positions // block_size].long()
    offsets = positions % block_size
    rows = cache[blocks, offsets]
    return dequantize(rows, scale[blocks, offsets]) if scale is not None else rows.float()


def in_view(pos: torch.Tensor, query_pos: torch.Tensor, sink_tokens: int, window_tokens: int) -> torch.Tensor:
    """Whether the query at `query_pos` sees position `pos` (broadcasting): causal, then p < sink or
    p > query_pos - window (window 0 = no limit)."""
    causal = pos <= query_pos
    if window_tokens == 0:
        return causal
    return causal & ((pos < sink_tokens) | (pos > query_pos - window_tokens))


def visible_positions(end: int, sink_tokens: int = 0, window_tokens: int = 0, first_query: int | None = None,
                      device: torch.device | str = "cpu") -> torch.Tensor:
    """Positions below `end` that some query at first_query … end-1 (default: only end-1) sees."""
    p = torch.arange(end, device=device)
    if window_tokens == 0:
        return p
    first = end - 1 if first_query is None else first_query
    return p[(p < sink_tokens) | (p > first - window_tokens)]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
           mask: torch.Tensor | None = None) -> torch.Tensor:
    """Float32 attention of q `[m, num_heads, d]` over k/v `[n, num_kv_heads, d]`; `mask[m, n]`: visible.
    A query with nothing visible gets zeros (the kernels' convention for an empty context)."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,nhd->hmn", q.float(), k) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # all -inf rows: zeros, not NaN
    return torch.einsum("hmn,nhd->mhd", probs, v)


def ref_paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_tables: torch.Tensor, context_lens: torch.Tensor,
                               scale: float | None = None, sink_tokens: int = 0, window_tokens: int = 0,
                               k_scale: torch.Tensor | None = None,
                               v_scale: torch.Tensor | None = None) -> torch.Tensor:
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for r, n in enumerate(context_lens.tolist()):
        pos = visible_positions(n, sink_tokens, window_tokens, device=q.device)
        k = gather_kv(k_cache, k_scale, block_tables[r], pos)
        v = gather_kv(v_cache, v_scale, block_tables[r], pos)
        out[r] = attend(q[r : r + 1], k, v, scale)[0]
    return out.to(q.dtype)


def ref_paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor,
                                prefix_lens: torch.Tensor, scale: float | None = None,
                                sink_tokens: int = 0, window_tokens: int = 0,
                                k_scale: torch.Tensor | None = None,
                                v_scale: torch.Tensor | None = None) -> torch.Tensor:
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    bounds = cu_seqlens_q.tolist()
    for r, prefix in enumerate(prefix_lens.tolist()):
        start, end = bounds[r], bounds[r + 1]
        pos = visible_positions(prefix + end - start, sink_tokens, window_tokens, prefix, q.device)
        k = gather_kv(k_cache, k_scale, block_tables[r], pos)
        v = gather_kv(v_cache, v_scale, block_tables[r], pos)
        q_pos = prefix + torch.arange(end - start, device=q.device)
        out[start:end] = attend(q[start:end], k, v, scale,
                                mask=in_view(pos[None, :], q_pos[:, None], sink_tokens, window_tokens))
    return out.to(q.dtype)


def ref_copy_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor) -> None:
    pairs = block_mapping.long().cpu()
    dst[pairs[:, 1].to(dst.device)] = src[pairs[:, 0].to(src.device)].to(dst.device)
