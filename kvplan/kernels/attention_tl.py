"""Triton device functions shared by the paged decode and prefill attention kernels.

Both kernels walk a request's KV in tiles of BLOCK_N token positions. A tile may span several cache blocks
(block size 1 or 8) or part of one (block size 128), so every position is translated to its slot on its own:
slot = block_table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE. Masked positions never load their
block table entry, which is what keeps padding and released (-1) entries unread.

Softmax runs online in base 2 (scores pre-multiplied by scale * log2(e)). The running maximum starts at a
large finite negative instead of -inf so that a tile whose scores are all masked yields exp2(-inf) = 0
rather than exp2(-inf - -inf) = NaN.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from kvplan.kernels.quant_tl import load_rows

NEG_INIT = tl.constexpr(-1.0e30)
LOG2E = 1.4426950408889634


@triton.jit
def visible_span(end, first_query, sink_tokens, window_tokens):
    """Positions below `end` that queries at positions first_query … end-1 can see under sink + window:
    [0, sink_end) ∪ [window_start, end). Returns (sink_end, window_start, count). Window 0 means all."""
    windowed = window_tokens > 0
    sink_end = tl.where(windowed, tl.minimum(sink_tokens, end), end)
    window_start = tl.where(windowed, tl.maximum(sink_end, first_query + 1 - window_tokens), end)
    return sink_end, window_start, sink_end + end - window_start


@triton.jit
def span_position(index, sink_end, window_start):
    """Position of the index-th visible token, walking the visible span as one sequence."""
    return tl.where(index < sink_end, index, index - sink_end + window_start)


@triton.jit
def kv_offsets(block_table_ptr, pos, mask, kv_head,
               BLOCK_SIZE: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Element offsets of the cache rows and of their scales for token positions `pos` of one request."""
    block = tl.load(block_table_ptr + pos // BLOCK_SIZE, mask=mask, other=0).to(tl.int64)
    scale_offsets = (block * BLOCK_SIZE + pos % BLOCK_SIZE) * NUM_KV_HEADS + kv_head
    return scale_offsets * HEAD_DIM, scale_offsets


@triton.jit
def attend_tile(q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, block_table_ptr,
                pos, kv_mask, score_mask, kv_head, dims, sm_scale_log2,
                BLOCK_SIZE: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                QUANT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One online-softmax step of the query rows `q[rows, head_dim]` (float32) over the KV tile at `pos`.

    `kv_mask[n]` says which positions may be loaded, `score_mask[rows, n]` which scores count."""
    rows, scale_rows = kv_offsets(block_table_ptr, pos, kv_mask, kv_head, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k = load_rows(k_cache_ptr, k_scale_ptr, rows, scale_rows, dims, kv_mask, QUANT)
    v = load_rows(v_cache_ptr, v_scale_ptr, rows, scale_rows, dims, kv_mask, QUANT)
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * sm_scale_log2
    scores = tl.where(score_mask, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(scores - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def normalize(acc, l_i):
    """Attention output from the running sums; rows that saw no position get zeros."""
    safe = tl.where(l_i > 0, l_i, 1.0)
    return tl.where(l_i[:, None] > 0, acc / safe[:, None], 0.0)


def dot_precision(cache_dtype_is_fp32: bool) -> str:
    """float32 caches need exact products ("ieee"). 16-bit and quantized values, once upcast, are exact in
    TF32 (at most 10 mantissa bits), so the tensor cores lose nothing on Q·K; P·V rounds P to TF32 (~1e-3)."""
    return "ieee" if cache_dtype_is_fp32 else "tf32"


def is_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def block_n(head_dim: int) -> int:
    """KV positions per loop iteration. The interpreter pays per iteration, so it takes big tiles; on the GPU
    64 positions of head_dim <= 128 keep the K and V tiles in registers without spilling."""
    return 64 if is_interpreted() or head_dim <= 128 else 32
