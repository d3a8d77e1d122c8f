"""Analytic roofline cost: each step takes the longer of its compute time and its memory-traffic time, at
efficiency-derated peaks, plus a fixed per-step overhead (scheduling, launch) and a per-request overhead
(input preparation, sampling) - the BLIS/inference-sim recipe with hand-set instead of fitted coefficients.

FLOPs: 2 × matmul parameters per token, plus attention 4 × layers × heads × head_dim per (query, key) pair.
Bytes: all weights once per step, the KV blocks attention reads (whole blocks: a partial last block is read in
full, so the block size shows), and the new tokens' K and V written.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sim.cost.features import StepFeatures
from sim.specs.hardware import HardwareSpec
from sim.specs.models import ModelSpec


@dataclass(slots=True)
class AnalyticCost:
    model: ModelSpec
    hardware: HardwareSpec
    block_size: int
    kv_dtype_bytes: float | None = None
    compute_efficiency: float = 0.6  # achieved fraction of peak dense FLOP/s
    memory_efficiency: float = 0.8  # achieved fraction of peak HBM bandwidth
    step_overhead_s: float = 2e-3
    request_overhead_s: float = 2e-5
    # Derived once (the model's sizes are properties computed on every access).
    _flops_per_token: float = field(init=False, repr=False)
    _attn_unit: float = field(init=False, repr=False)
    _weight_bytes: float = field(init=False, repr=False)
    _kv_token: float = field(init=False, repr=False)
    _kv_block: float = field(init=False, repr=False)
    _flop_rate: float = field(init=False, repr=False)
    _byte_rate: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for key in ("compute_efficiency", "memory_efficiency"):
            value = getattr(self, key)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"cost.{key}: must be a fraction in (0, 1], got {value!r}")
        for key in ("step_overhead_s", "request_overhead_s"):
            if getattr(self, key) < 0:
                raise ValueError(f"cost.{key}: must be >= 0, got {getattr(self, key)!r}")
        m = self.model
        self._flops_per_token = 2.0 * m.matmul_params
        self._attn_unit = 4.0 * m.num_layers * m.num_heads * m.head_dim
        self._weight_bytes = float(m.weight_bytes)
        self._kv_token = self.kv_bytes_per_token
        self._kv_block = self._kv_token * self.block_size
        self._flop_rate = self.hardware.peak_flops * self.compute_efficiency
        self._byte_rate = self.hardware.hbm_bandwidth * self.memory_efficiency

    @property
    def kv_bytes_per_token(self) -> float:
        return self.model.kv_bytes_per_token(self.kv_dtype_bytes)

    @property
    def bytes_per_block(self) -> float:
        return self.kv_bytes_per_token * self.block_size

    def step_times(self, f: StepFeatures) -> np.ndarray | float:
        tokens = f.prefill_tokens + f.decode_requests
        flops = self._flops_per_token * tokens + self._attn_unit * (f.prefill_attention2 / 2.0 + f.decode_context)
        traffic = self._weight_bytes + self._kv_block * f.blocks_touched + self._kv_token * tokens
        compute = flops / self._flop_rate
        memory = traffic / self._byte_rate
        longer = np.maximum(compute, memory) if isinstance(compute, np.ndarray) else max(compute, memory)
        return longer + self.step_overhead_s + self.request_overhead_s * f.num_requests

    def transfer_time(self, swapped_blocks: int, copied_blocks: int) -> float:
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
