"""`paged_prefill_attention`: a chunk of new query tokens per request, attending causally to the request's
cached prefix plus the chunk itself, all read from the paged cache (the chunk's own K/V are stored first).

This covers chunked prefill (prefix = tokens of earlier chunks) and prefix-cache hits (prefix = tokens
found in the cache), ragged across requests. Sink + window is walked as in decode (see
`attention_tl.visible_span`), over the positions the tile's earliest query can see, with each row's own
window applied as a score mask. Grid: (request, KV head, query tile). A tile's BLOCK_M rows are
(token, query head of the group) pairs, token-major, so one K/V load serves every head of the GQA group.
Query token i of request r sits at position prefix_lens[r] + i and sees positions 0 … prefix_lens[r] + i.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kvplan.kernels.attention_tl import (
    LOG2E,
    NEG_INIT,
    attend_tile,
    block_n,
    dot_precision,
    normalize,
    span_position,
    visible_span,
)
from kvplan.kernels.checks import check_attention, check_int, check_out, check_same_device, check_shape, check_tensor

BLOCK_M = 64


@triton.jit(do_not_specialize=["sink_tokens", "window_tokens"])
def _prefill_kernel(q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, block_tables_ptr,
                    cu_seqlens_ptr, prefix_lens_ptr, out_ptr, sm_scale_log2, sink_tokens, window_tokens,
                    stride_qt, stride_qh, stride_bt, stride_ot, stride_oh,
                    GROUP: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, TOKENS: tl.constexpr,
                    BLOCK_N: tl.constexpr, QUANT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    tile = tl.program_id(2)
    q_start = tl.load(cu_seqlens_ptr + seq)
    q_len = tl.load(cu_seqlens_ptr + seq + 1) - q_start
    prefix = tl.load(prefix_lens_ptr + seq)

    rows = tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    token = tile * TOKENS + rows // GROUP
    heads = kv_head * GROUP + rows % GROUP
    row_mask = (rows < TOKENS * GROUP) & (token < q_len)
    q_rows = (q_start + token).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                mask=row_mask[:, None], other=0.0).to(tl.float32)
    q_pos = tl.where(row_mask, prefix + token, -1)
    end = tl.max(q_pos, 0) + 1  # one past the last position any row sees; 0 for a tile past the chunk
    first_query = prefix + tile * TOKENS
    sink_end, window_start, visible = visible_span(end, first_query, sink_tokens, window_tokens)
    window_lo = q_pos + 1 - window_tokens  # per row: positions below it, past the sink, are out of view

    m_i = tl.full([BLOCK_M], NEG_INIT, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    block_table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for start in range(0, visible, BLOCK_N):
        index = start + tl.arange(0, BLOCK_N)
        kv_mask = index < visible
        pos = span_position(index, sink_end, window_start)
        in_view = (window_tokens == 0) | (pos[None, :] < sink_tokens) | (pos[None, :] >= window_lo[:, None])
        score_mask = (pos[None, :] <= q_pos[:, None]) & in_view
        m_i, l_i, acc = attend_tile(q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
                                    block_table, pos, kv_mask, score_mask, kv_head, dims, sm_scale_log2,
                                    BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, QUANT, DOT_PRECISION)

    o = normalize(acc, l_i)
    tl.store(out_ptr + q_rows[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :],
             o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])


def _check(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
           cu_seqlens_q: torch.Tensor, prefix_lens: torch.Tensor, k_scale: torch.Tensor | None,
           v_scale: torch.Tensor | None) -> bool:
    check_tensor("prefix_lens", prefix_lens, 1, (torch.int32,))
    num_seqs = prefix_lens.shape[0]
    quantized = check_attention(q, k_cache, v_cache, block_tables, num_seqs, k_scale, v_scale)
    check_tensor("cu_seqlens_q", cu_seqlens_q, 1, (torch.int32,))
    check_shape("cu_seqlens_q", cu_seqlens_q, (num_seqs + 1,))
    check_same_device(q=q, k_cache=k_cache, block_tables=block_tables, cu_seqlens_q=cu_seqlens_q,
                      prefix_lens=prefix_lens)
    return quantized


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor, prefix_lens: torch.Tensor,
                            *, scale: float | None = None, sink_tokens: int = 0, window_tokens: int = 0,
                            max_query_len: int | None = None,
                            k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                            out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of the packed chunk tokens `q[total_new_tokens, num_heads, head_dim]`; returns `out`.

    Request r owns rows cu_seqlens_q[r] … cu_seqlens_q[r+1]-1 (int32 offsets, cu_seqlens_q[0] = 0) and has
    `prefix_lens[r]` tokens cached before its chunk; the chunk's K/V must already be in the cache. With
    `window_tokens > 0` the query at position q sees only p < sink_tokens or p > q - window_tokens, as in
    decode; blocks no query of the chunk can see are never read.
    `max_query_len` (the longest chunk) sizes the grid; without it the wrapper reads cu_seqlens_q on the
    host, which synchronizes with the device.
    """
    quantized = _check(q, k_cache, v_cache, block_tables, cu_seqlens_q, prefix_lens, k_scale, v_scale)
    out = check_out(out, q)
    num_seqs = prefix_lens.shape[0]
    if max_query_len is None:
        max_query_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max()) if num_seqs else 0
    check_int("max_query_len", max_query_len, 0)
    check_int("sink_tokens", sink_tokens, 0)
    check_int("window_tokens", window_tokens, 0)
    if max_query_len == 0 or q.shape[0] == 0:
        return out
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    group = q.shape[1] // num_kv_heads
    tokens = BLOCK_M // group
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    _prefill_kernel[(num_seqs, num_kv_heads, triton.cdiv(max_query_len, tokens))](
        q, k_cache, v_cache, k_scale, v_scale, block_tables, cu_seqlens_q, prefix_lens, out,
        scale * LOG2E, sink_tokens, window_tokens,
        q.stride(0), q.stride(1), block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=group, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, BLOCK_M=BLOCK_M,
        TOKENS=tokens, BLOCK_N=block_n(head_dim), QUANT=quantized,
        DOT_PRECISION=dot_precision(k_cache.dtype == torch.float32),
        num_warps=8 if head_dim >= 128 else 4,  # a 64 x 128 float32 accumulator spills with 4 warps
    )
    return out
