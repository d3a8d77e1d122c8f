"""Analytic roofline cost: a step's time is the sum of its operator groups, each at efficiency-derated peaks
(the longer of its compute time and its memory-traffic time where both matter), plus a fixed per-step overhead
(scheduling, launch) and a per-request overhead (input preparation, sampling) - the BLIS/inference-sim recipe
with hand-set instead of fitted coefficients.

With M = the step's tokens (prefill tokens + decodes) and S = its sampled rows (`StepFeatures.sampled`):
- layer GEMMs: max(2 × layer matmul params × M' FLOPs, the layers' weights read once), where M' is M rounded up
  to whole GEMM tiles (tile quantization: a small-M GEMM runs well below the large-GEMM efficiency);
- LM head: the same for vocab × hidden over S' (S in whole tiles) - only sampled rows reach it - and nothing
  when S = 0. Its weight (the embedding table when tied) is read once here; an untied input embedding is only
  gathered row by row (element-wise below), so the step streams layers + head, not `weight_bytes`;
- attention: 4 × layers × heads × head_dim FLOPs per (query, key) pair; prefill pairs (causal, Σ chunk ×
  (start + chunk/2)) at FlashAttention efficiency, plus decode attention = max(its FLOPs, the KV blocks attention
  reads: whole blocks, so the block size shows; every request's blocks, a prefill's cached prefix included);
- element-wise (memory-bound): RMSNorms, RoPE, the MLP activation, residual adds, the embedding gather and the
  KV-cache write, bytes per token at memory bandwidth.
`StepFeatures.batched` (a CPU BLAS effect: one token row runs a cheaper matrix-vector kernel) is priced by the
calibrated model only; on a GPU the tile quantization above already makes one row cost a whole tile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvplan.sim.cost.features import StepFeatures
from kvplan.sim.specs.hardware import HardwareSpec
from kvplan.sim.specs.models import ModelSpec


def elementwise_bytes_per_token(model: ModelSpec, kv_dtype_bytes: float | None = None) -> float:
    """HBM bytes one token's memory-bound (non-GEMM, non-attention) kernels read and write, all layers.

    Per layer, in elements of the model dtype (h hidden, i intermediate, q/k widths heads × head_dim):
      2 RMSNorms (before attention and MLP), each reads and writes h:     4h
      2 residual adds, each reads 2h and writes h:                        6h
      RoPE on q and k, read and written:                                  2 × (heads + kv_heads) × head_dim
      MLP activation: SwiGLU SiLU(gate) × up reads 2i, writes i:          3i (a plain MLP's reads, writes i: 2i)
    Once per token: the embedding row gather (read + write h) and the final RMSNorm (4h in all). The KV-cache
    write reads the fresh K and V (model dtype) and stores them in the cache (KV dtype). Norm weights, the
    attention's q/output and the logits are left out (a few hidden vectors, or per sampled row only). OPT
    (LayerNorm, learned positions instead of RoPE) is counted the same way.
    Llama-3-8B bf16: 94,208 elements per layer, 6.3 MB per token with the KV write - ~4.7% of a 2048-token
    A100-80GB prefill at the defaults.
    """
    h, heads = model.hidden_size, model.num_heads + model.num_kv_heads
    per_layer = 4 * h + 6 * h + 2 * heads * model.head_dim + (3 if model.gated_mlp else 2) * model.intermediate_size
    elements = model.num_layers * per_layer + 4 * h
    return elements * model.dtype_bytes + model.kv_bytes_per_token() + model.kv_bytes_per_token(kv_dtype_bytes)


def _max(a, b):
    """max of plain numbers, or element-wise when either is a stretch's array (the same IEEE result per entry)."""
    return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)


@dataclass(slots=True)
class AnalyticCost:
    model: ModelSpec
    hardware: HardwareSpec
    block_size: int
    kv_dtype_bytes: float | None = None
    # Achieved fraction of peak dense FLOP/s for large GEMMs: hand-set planner default (not a measurement).
    compute_efficiency: float = 0.6
    # Achieved fraction of peak HBM bandwidth: hand-set planner default (not a measurement).
    memory_efficiency: float = 0.8
    # Scheduling, input preparation and kernel launches per step: hand-set planner default.
    step_overhead_s: float = 2e-3
    # Per scheduled request (metadata, sampling): hand-set planner default.
    request_overhead_s: float = 2e-5
    # Fraction of peak FLOP/s FlashAttention achieves: FlashAttention-2 (Dao 2023, arXiv:2307.08691) reports its
    # forward pass at 50-73% of the A100's theoretical maximum, the top at long sequences; causal masking and
    # inference-sized chunks (a few thousand queries at most) run toward the low end, so the low end: 0.5.
    attention_efficiency: float = 0.5
    # GEMM rows computed in whole tiles: NVIDIA "Matrix Multiplication Background User's Guide" (tile
    # quantization): a GEMM computes whole output tiles, so M rows cost ceil(M / tile) × tile rows of work;
    # 128-row tiles on A100/H100 tensor cores (the guide's efficient tile sizes are 128 or 256 on a side).
    gemm_tile_rows: int = 128
    # Derived once (the model's sizes are properties computed on every access).
    _layer_flops: float = field(init=False, repr=False)
    _head_flops: float = field(init=False, repr=False)
    _layer_read_s: float = field(init=False, repr=False)
    _head_read_s: float = field(init=False, repr=False)
    _attn_unit: float = field(init=False, repr=False)
    _elementwise: float = field(init=False, repr=False)
    _kv_block: float = field(init=False, repr=False)
    _flop_rate: float = field(init=False, repr=False)
    _attn_rate: float = field(init=False, repr=False)
    _byte_rate: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for key in ("compute_efficiency", "memory_efficiency", "attention_efficiency"):
            value = getattr(self, key)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"cost.{key}: must be a fraction in (0, 1], got {value!r}")
        for key in ("step_overhead_s", "request_overhead_s"):
            if getattr(self, key) < 0:
                raise ValueError(f"cost.{key}: must be >= 0, got {getattr(self, key)!r}")
        if not (isinstance(self.gemm_tile_rows, int) and self.gemm_tile_rows >= 1):
            raise ValueError(f"cost.gemm_tile_rows: must be an integer >= 1, got {self.gemm_tile_rows!r}")
        m = self.model
        self._flop_rate = self.hardware.peak_flops * self.compute_efficiency
        self._attn_rate = self.hardware.peak_flops * self.attention_efficiency
        self._byte_rate = self.hardware.hbm_bandwidth * self.memory_efficiency
        self._layer_flops = 2.0 * m.layer_matmul_params
        self._head_flops = 2.0 * m.lm_head_params
        self._layer_read_s = m.layer_matmul_params * m.dtype_bytes / self._byte_rate
        self._head_read_s = m.lm_head_params * m.dtype_bytes / self._byte_rate
        self._attn_unit = 4.0 * m.num_layers * m.num_heads * m.head_dim
        self._elementwise = elementwise_bytes_per_token(m, self.kv_dtype_bytes)
        self._kv_block = self.bytes_per_block

    @property
    def kv_bytes_per_token(self) -> float:
        return self.model.kv_bytes_per_token(self.kv_dtype_bytes)

    @property
    def bytes_per_block(self) -> float:
        return self.kv_bytes_per_token * self.block_size

    def step_times(self, f: StepFeatures) -> np.ndarray | float:
        """Seconds per step: plain ints give a float, a stretch's int64 arrays an array (bit-identical entries)."""
        tile = self.gemm_tile_rows
        tokens = f.prefill_tokens + f.decode_requests
        gemm_rows = -(-tokens // tile) * tile  # integer ceil division, on ints and arrays alike
        head_rows = -(-f.sampled // tile) * tile
        layers = _max(self._layer_flops * gemm_rows / self._flop_rate, self._layer_read_s)
        head = _max(self._head_flops * head_rows / self._flop_rate, self._head_read_s) * (f.sampled > 0)
        prefill_attn = self._attn_unit * (f.prefill_attention2 / 2.0) / self._attn_rate
        decode_attn = _max(self._attn_unit * f.decode_context / self._attn_rate,
                           self._kv_block * f.blocks_touched / self._byte_rate)
        elementwise = self._elementwise * tokens / self._byte_rate
        compute = layers + head + prefill_attn + decode_attn + elementwise
        return compute + self.step_overhead_s + self.request_overhead_s * f.num_requests

    def transfer_time(self, swapped_blocks: int, copied_blocks: int) -> float:
        """Swap over the host link; a copy-on-write block is read and written in HBM."""
        swap = swapped_blocks * self.bytes_per_block / self.hardware.host_link_bandwidth
        copy = 2 * copied_blocks * self.bytes_per_block / self._byte_rate
        return swap + copy


def kv_capacity_blocks(model: ModelSpec, hardware: HardwareSpec, block_size: int, *,
                       kv_dtype_bytes: float | None = None, gpu_memory_utilization: float = 0.9,
                       max_num_batched_tokens: int = 2048, max_num_seqs: int = 256) -> int:
    """KV blocks that fit: (memory × utilization − weights − activation reserve) ÷ bytes per block."""
    budget = hardware.memory_bytes * gpu_memory_utilization - model.weight_bytes
    budget -= activation_reserve(model, max_num_batched_tokens, max_num_seqs)
    return max(int(budget // (model.kv_bytes_per_token(kv_dtype_bytes) * block_size)), 0)


def activation_reserve(model: ModelSpec, max_num_batched_tokens: int, max_num_seqs: int) -> float:
    """Peak activation memory of one step: hidden states and the MLP intermediate of every batched token,
    plus fp32 logits of every sequence (what vLLM's profiling run measures)."""
    per_token = (4 * model.hidden_size + 2 * model.intermediate_size) * model.dtype_bytes
    return max_num_batched_tokens * per_token + max_num_seqs * model.vocab_size * 4
