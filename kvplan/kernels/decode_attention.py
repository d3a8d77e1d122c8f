"""`paged_decode_attention`: one query token per request against its paged KV cache.

Grid: (request, KV head, split). A program serves all query heads that share its KV head (GQA), so each K/V
row is loaded once for the whole group; the group is padded to 16 rows because `tl.dot` needs them. With
`num_splits > 1` the visible positions of a request are cut into that many tile-aligned ranges, one per
program, which keeps the GPU busy when there are few requests with long contexts; each split writes its
normalized partial output and log-sum-exp, and a second kernel merges them.

Sink + window visibility: the visible set [0, sink_end) ∪ [window_start, n) is walked as one "virtual"
sequence of `visible` indices, so splits divide only visible work and invisible (possibly released) blocks
are never touched.
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

MAX_SPLITS = 64


# Lengths of sink and window vary per deployment; specializing on them (Triton does for the value 1) would
# only add compilations.
@triton.jit(do_not_specialize=["sink_tokens", "window_tokens"])
def _decode_split_kernel(q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, block_tables_ptr,
                         context_lens_ptr, out_ptr, part_out_ptr, part_lse_ptr,
                         sm_scale_log2, sink_tokens, window_tokens,
                         stride_qs, stride_qh, stride_bt, stride_os, stride_oh,
                         GROUP: tl.constexpr, BLOCK_H: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                         HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                         SPLIT: tl.constexpr, QUANT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)  # a launch value, not a constant: one compilation serves every count
    group_rows = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, HEAD_DIM)
    row_mask = group_rows < GROUP
    heads = kv_head * GROUP + group_rows
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + dims[None, :],
                mask=row_mask[:, None], other=0.0).to(tl.float32)

    n = tl.load(context_lens_ptr + seq)
    sink_end, window_start, visible = visible_span(n, n - 1, sink_tokens, window_tokens)
    per_split = tl.cdiv(tl.cdiv(visible, num_splits), BLOCK_N) * BLOCK_N
    lo = split * per_split
    hi = tl.minimum(visible, lo + per_split)

    m_i = tl.full([BLOCK_H], NEG_INIT, tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    block_table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for start in range(lo, hi, BLOCK_N):
        index = start + tl.arange(0, BLOCK_N)
        kv_mask = index < hi
        pos = span_position(index, sink_end, window_start)
        m_i, l_i, acc = attend_tile(q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
                                    block_table, pos, kv_mask, kv_mask[None, :], kv_head, dims, sm_scale_log2,
                                    BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, QUANT, DOT_PRECISION)

    o = normalize(acc, l_i)
    if not SPLIT:
        tl.store(out_ptr + seq * stride_os + heads[:, None] * stride_oh + dims[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])
    else:
        part = (seq * (NUM_KV_HEADS * GROUP) + heads) * num_splits + split
        tl.store(part_out_ptr + part[:, None] * HEAD_DIM + dims[None, :], o, mask=row_mask[:, None])
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + part, lse, mask=row_mask)


@triton.jit
def _merge_splits_kernel(part_out_ptr, part_lse_ptr, out_ptr, stride_os, stride_oh, num_splits,
                         NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_P: tl.constexpr):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, BLOCK_P)
    dims = tl.arange(0, HEAD_DIM)
    part = (seq * NUM_HEADS + head) * num_splits + splits
    split_mask = splits < num_splits
    lse = tl.load(part_lse_ptr + part, mask=split_mask, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # every split empty (empty context): all weights become 0
    w = tl.exp2(lse - m)
    parts = tl.load(part_out_ptr + part[:, None] * HEAD_DIM + dims[None, :], mask=split_mask[:, None],
                    other=0.0)
    total = tl.sum(w, 0)
    o = tl.sum(w[:, None] * parts, 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + dims, o.to(out_ptr.dtype.element_ty))


def _check(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
           context_lens: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None) -> bool:
    quantized = check_attention(q, k_cache, v_cache, block_tables, q.shape[0], k_scale, v_scale)
    check_tensor("context_lens", context_lens, 1, (torch.int32,))
    check_shape("context_lens", context_lens, (q.shape[0],))
    check_same_device(q=q, k_cache=k_cache, block_tables=block_tables, context_lens=context_lens)
    return quantized


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context_len: int, num_sms: int,
                      min_tokens_per_split: int = 256) -> int:
    """Splits per request so that the grid covers about two waves of `num_sms` programs, without cutting a
    context into pieces shorter than `min_tokens_per_split` (the merge then costs more than it gains)."""
    programs = max(1, num_seqs * num_kv_heads)
    wanted = math.ceil(2 * num_sms / programs)
    most = max(1, max_context_len // min_tokens_per_split)
    return max(1, min(wanted, most, MAX_SPLITS))


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, *,
                           scale: float | None = None, num_splits: int = 1, sink_tokens: int = 0,
                           window_tokens: int = 0, k_scale: torch.Tensor | None = None,
                           v_scale: torch.Tensor | None = None, max_context_len: int | None = None,
                           out: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of `q[num_seqs, num_heads, head_dim]` over each request's cached tokens; returns `out`.

    Request r attends to positions p < context_lens[r] through `block_tables[r]` (int32); with
    `window_tokens > 0` only p < sink_tokens or p >= context_lens[r] - window_tokens. An empty context gives
    zeros. `max_context_len`, when given, is checked against the block table's capacity (the kernel itself
    reads no value on the host). Quantized caches need `k_scale`/`v_scale` (see `kernels.quant`).
    """
    quantized = _check(q, k_cache, v_cache, block_tables, context_lens, k_scale, v_scale)
    check_int("num_splits", num_splits, 1, MAX_SPLITS)
    check_int("sink_tokens", sink_tokens, 0)
    check_int("window_tokens", window_tokens, 0)
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    if max_context_len is not None:
        check_int("max_context_len", max_context_len, 0, block_tables.shape[1] * block_size)
    out = check_out(out, q)
    if num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    parts = (torch.empty((num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device),
             torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=q.device)
             ) if num_splits > 1 else (None, None)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, k_scale, v_scale, block_tables, context_lens, out, *parts,
        scale * LOG2E, sink_tokens, window_tokens,
        q.stride(0), q.stride(1), block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=group, BLOCK_H=max(16, triton.next_power_of_2(group)), NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim, BLOCK_SIZE=block_size, BLOCK_N=block_n(head_dim), SPLIT=num_splits > 1,
        QUANT=quantized, DOT_PRECISION=dot_precision(k_cache.dtype == torch.float32),
    )
    if num_splits > 1:
        _merge_splits_kernel[(num_seqs, num_heads)](
            *parts, out, out.stride(0), out.stride(1), num_splits, NUM_HEADS=num_heads, HEAD_DIM=head_dim,
            BLOCK_P=triton.next_power_of_2(num_splits),
        )
    return out
