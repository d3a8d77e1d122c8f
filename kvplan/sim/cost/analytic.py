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
- attention: `sim.gpu.attention.AttentionCost` (docs/attention.md): the larger of its FLOPs (prefill pairs at a
  FlashAttention-class efficiency that depends on the head dim and the keys per query, plus decode pairs) and the
  KV blocks it reads (whole blocks, each with a gather overhead, so the block size shows; every request's blocks,
  a prefill's cached prefix included), plus a floor per layer's kernel;
- element-wise (memory-bound): RMSNorms, RoPE, the MLP activation, residual adds, the embedding gather and the
  KV-cache write, bytes per token at memory bandwidth.
`StepFeatures.batched` (a CPU BLAS effect: one token row runs a cheaper matrix-vector kernel) is priced by the
calibrated model only; on a GPU the tile quantization above already makes one row cost a whole tile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import overload

import numpy as np

from kvplan.errors import UserError
from kvplan.sim.cost.features import FEATURE_NAMES, StepFeatures
from kvplan.sim.cost.moe import ExpertCost
from kvplan.sim.cost.parallel import (
    Shape,
    all_to_all_time,
    allreduce_time,
    micro_batches,
    moe_activation_width,
    send_recv_time,
    weight_bytes_per_rank,
)
from kvplan.sim.gpu.attention import AttentionCost
from kvplan.sim.specs.arch import ModelSpec, stage_layers
from kvplan.sim.specs.hardware import HardwareSpec


def elementwise_bytes_per_token(model: ModelSpec, kv_dtype_bytes: float | None = None, tp: int = 1,
                                pp: int = 1) -> float:
    """HBM bytes one token's memory-bound (non-GEMM, non-attention) kernels read and write on one rank, all layers
    of its pipeline stage.

    Per layer, in elements of the model dtype (h hidden, i intermediate, q/k widths heads × head_dim):
      2 RMSNorms (before attention and MLP), each reads and writes h:     4h
      2 residual adds, each reads 2h and writes h:                        6h
      RoPE on q and k, read and written:                                  2 × (heads + kv_heads) × head_dim
      MLP activation: SwiGLU SiLU(gate) × up reads 2i, writes i:          3i (a plain MLP's reads, writes i: 2i)
    Once per token: the embedding row gather (read + write h) and the final RMSNorm (4h in all). The KV-cache
    write reads the fresh K and V (model dtype) and stores them in the cache (KV dtype). Norm weights, the
    attention's q/output and the logits are left out (a few hidden vectors, or per sampled row only). OPT
    (LayerNorm, learned positions instead of RoPE) is counted the same way. With TP the norms and residual adds
    run whole on every rank, RoPE and the activation on the rank's heads and MLP share; an MoE layer's activation
    runs over its routed and shared experts' widths.
    Llama-3-8B bf16: 94,208 elements per layer, 6.3 MB per token with the KV write - ~4.7% of a 2048-token
    A100-80GB prefill at the defaults.
    """
    h, heads = model.hidden_size, model.num_heads // tp + model.kv_heads_per_rank(tp)
    per_layer = 4 * h + 6 * h + 2 * heads * model.head_dim + (3 if model.gated_mlp else 2) * \
        model.intermediate_size / tp
    moe_layer = 4 * h + 6 * h + 2 * heads * model.head_dim + 3 * (model.experts_per_token + model.shared_experts) * \
        model.moe_intermediate_size / tp
    dense = model.num_layers - model.num_moe_layers
    layers = dense * per_layer + model.num_moe_layers * moe_layer
    if pp > 1:
        layers = layers * stage_layers(model.num_layers, pp) / model.num_layers
    elements = layers + 4 * h
    return elements * model.dtype_bytes + model.kv_bytes_per_token(None, tp, pp) + \
        model.kv_bytes_per_token(kv_dtype_bytes, tp, pp)


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
    # Fraction of peak FLOP/s the attention kernels achieve; None: the shape-aware law fitted on FlashAttention-3's
    # published speeds (`sim.gpu.attention`, docs/attention.md). A number replaces that law's e(head_dim).
    attention_efficiency: float | None = None
    # GEMM rows computed in whole tiles: NVIDIA "Matrix Multiplication Background User's Guide" (tile
    # quantization): a GEMM computes whole output tiles, so M rows cost ceil(M / tile) × tile rows of work;
    # 128-row tiles on A100/H100 tensor cores (the guide's efficient tile sizes are 128 or 256 on a side).
    gemm_tile_rows: int = 128
    # Achieved fraction of the GPU-to-GPU link bandwidth in all-reduce / all-to-all (0.6) and in a send/recv
    # (0.8): fitted, with the node's latencies, to Vidur's A100 DGX profiles (large all-reduces reach ~170 GB/s
    # bus bandwidth on the 300 GB/s NVLink, a send/recv ~230 GB/s; docs/parallel_validation.md).
    link_efficiency: float = 0.6
    p2p_efficiency: float = 0.8
    # The replica's GPUs (tensor, pipeline and expert parallelism); one GPU by default.
    shape: Shape = field(default_factory=Shape)
    # Derived once (the model's sizes are properties computed on every access).
    _layer_flops: float = field(init=False, repr=False)
    _head_flops: float = field(init=False, repr=False)
    _layer_read_s: float = field(init=False, repr=False)
    _head_read_s: float = field(init=False, repr=False)
    _elementwise: float = field(init=False, repr=False)
    _flop_rate: float = field(init=False, repr=False)
    _byte_rate: float = field(init=False, repr=False)
    _attention: AttentionCost = field(init=False, repr=False)
    _experts: ExpertCost | None = field(init=False, repr=False)
    _hidden_bytes: float = field(init=False, repr=False)
    _stage_moe_layers: float = field(init=False, repr=False)
    _stage_dense_layers: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for key in ("compute_efficiency", "memory_efficiency", "attention_efficiency", "link_efficiency",
                    "p2p_efficiency"):
            value = getattr(self, key)
            if value is None and key == "attention_efficiency":  # the fitted law
                continue
            if not 0.0 < value <= 1.0:
                raise UserError(f"cost.{key}: must be a fraction in (0, 1], got {value!r}")
        for key in ("step_overhead_s", "request_overhead_s"):
            if getattr(self, key) < 0:
                raise UserError(f"cost.{key}: must be >= 0, got {getattr(self, key)!r}")
        tile: object = self.gemm_tile_rows  # cost options come from a file: whatever was written there
        if not (isinstance(tile, int) and tile >= 1):
            raise UserError(f"cost.gemm_tile_rows: must be an integer >= 1, got {self.gemm_tile_rows!r}")
        m, tp, pp = self.model, self.shape.tp, self.shape.pp
        self._flop_rate = self.hardware.peak_flops * self.compute_efficiency
        self._byte_rate = self.hardware.hbm_bandwidth * self.memory_efficiency
        share = stage_layers(m.num_layers, pp) / m.num_layers / tp  # this rank's part of the layers (1.0 alone)
        self._layer_flops = 2.0 * m.dense_part_params * share
        self._head_flops = 2.0 * m.lm_head_params / tp
        self._layer_read_s = m.layer_weight_bytes * share / self._byte_rate
        self._head_read_s = m.lm_head_params * m.dtype_bytes / tp / self._byte_rate
        self._elementwise = elementwise_bytes_per_token(m, self.kv_dtype_bytes, tp, pp)
        # The KV read runs at the attention law's fitted bandwidth fraction, not the weights' `memory_efficiency`.
        self._attention = AttentionCost(m, self.hardware, self.block_size, self.kv_dtype_bytes, tp, pp,
                                        self.attention_efficiency)
        self._experts = ExpertCost.of(m, tp, pp, self.gemm_tile_rows, self._flop_rate, self._byte_rate) \
            if m.is_moe else None
        self._hidden_bytes = m.hidden_size * m.dtype_bytes
        self._stage_moe_layers = m.num_moe_layers * tp * share
        self._stage_dense_layers = (m.num_layers - m.num_moe_layers) * tp * share

    @property
    def sliding_window(self) -> int:
        """The window of the model's sliding layers, 0 when every layer attends to the whole context: the replica
        asks for the window features with it."""
        return self._attention.sliding_window

    @property
    def kv_bytes_per_token(self) -> float:
        """One token's KV bytes on one rank (its KV heads, its stage's layers)."""
        return self.model.kv_bytes_per_token(self.kv_dtype_bytes, self.shape.tp, self.shape.pp)

    @property
    def bytes_per_block(self) -> float:
        return self.kv_bytes_per_token * self.block_size

    @overload
    def step_times(self, f: StepFeatures[int]) -> float: ...
    @overload
    def step_times(self, f: StepFeatures[np.ndarray]) -> np.ndarray: ...
    def step_times(self, f: StepFeatures) -> np.ndarray | float:
        """Seconds per step: plain ints give a float, a stretch's int64 arrays an array (bit-identical entries).
        With PP the batch runs as `micro_batches` micro-batches through the stages: in steady state a stage is
        never idle (vLLM keeps pp batches in flight), so a step takes pp × one micro-batch's time on the busiest
        stage, plus the sends between stages."""
        if self.shape.pp == 1:
            compute = self._stage_time(f)
        else:
            pp, m = self.shape.pp, micro_batches(f.num_requests, self.shape.pp)
            part = StepFeatures(*(getattr(f, name) / m for name in FEATURE_NAMES))
            tokens = part.prefill_tokens + part.decode_requests
            hop = send_recv_time(tokens * self._hidden_bytes, self.hardware, self.p2p_efficiency,
                                 self.shape.crosses_nodes(self.hardware))
            compute = pp * self._stage_time(part) + (pp - 1) * hop
        return compute + self.step_overhead_s + self.request_overhead_s * f.num_requests

    def _stage_time(self, f: StepFeatures) -> np.ndarray | float:
        """One rank's compute for the features `f` on the busiest pipeline stage (the whole model without PP)."""
        tile = self.gemm_tile_rows
        tokens = f.prefill_tokens + f.decode_requests
        gemm_rows = -(-tokens // tile) * tile  # integer ceil division, on ints and arrays alike
        head_rows = -(-f.sampled // tile) * tile
        layers = _max(self._layer_flops * gemm_rows / self._flop_rate, self._layer_read_s)
        head = _max(self._head_flops * head_rows / self._flop_rate, self._head_read_s) * (f.sampled > 0)
        elementwise = self._elementwise * tokens / self._byte_rate
        compute = layers + head + self._attention.time(f) + elementwise
        if self._experts is not None:
            compute = compute + self._experts.time(tokens)
        if self.shape.tp > 1:
            compute = compute + self._collectives(tokens)
        return compute

    def _collectives(self, tokens) -> np.ndarray | float:
        """The stage's TP collectives: two all-reduces of the hidden states per layer; with EP an MoE layer's
        second one is an all-to-all dispatch of each token to its k experts' ranks and a combine back."""
        tp, hw, eff = self.shape.tp, self.hardware, self.link_efficiency
        hidden = tokens * self._hidden_bytes
        reduce = allreduce_time(hidden, tp, hw, eff)
        if not (self.shape.expert_parallel and self._experts is not None):
            return 2 * (self._stage_dense_layers + self._stage_moe_layers) * reduce
        dispatch = all_to_all_time(hidden * self._experts.per_token, tp, hw, eff)
        return 2 * self._stage_dense_layers * reduce + self._stage_moe_layers * (reduce + 2 * dispatch)

    def transfer_time(self, swapped_blocks: int, copied_blocks: int, disk_blocks: int = 0) -> float:
        """Swap over the host link; a copy-on-write block is read and written in HBM; a disk-tier block streams
        drive -> host -> GPU, pipelined, so at the slower of the drive and the host link."""
        hw = self.hardware
        swap = swapped_blocks * self.bytes_per_block / hw.host_link_bandwidth
        copy = 2 * copied_blocks * self.bytes_per_block / self._byte_rate
        disk = disk_blocks * self.bytes_per_block / min(hw.disk_bandwidth, hw.host_link_bandwidth)
        return swap + copy + disk


def kv_capacity_blocks(model: ModelSpec, hardware: HardwareSpec, block_size: int, *,
                       kv_dtype_bytes: float | None = None, gpu_memory_utilization: float = 0.9,
                       max_num_batched_tokens: int = 2048, max_num_seqs: int = 256, shape: Shape | None = None) -> int:
    """KV blocks that fit on each rank: (memory × utilization − the rank's weights − activation reserve) ÷ the
    rank's bytes per block. Every rank holds the same tokens (its heads' or its layers' part of them)."""
    shape = shape or Shape()
    budget = hardware.memory_bytes * gpu_memory_utilization - weight_bytes_per_rank(model, shape)
    budget -= activation_reserve(model, max_num_batched_tokens, max_num_seqs, shape.tp)
    per_block = model.kv_bytes_per_token(kv_dtype_bytes, shape.tp, shape.pp) * block_size
    return max(int(budget // per_block), 0)


def activation_reserve(model: ModelSpec, max_num_batched_tokens: int, max_num_seqs: int, tp: int = 1) -> float:
    """Peak activation memory of one step on one rank: hidden states and the rank's share of the MLP
    intermediate of every batched token, plus fp32 logits of every sequence (what vLLM's profiling run
    measures; the logits are gathered whole)."""
    width = model.intermediate_size if tp == 1 and not model.is_moe else moe_activation_width(model) / tp
    per_token = (4 * model.hidden_size + 2 * width) * model.dtype_bytes
    return max_num_batched_tokens * per_token + max_num_seqs * model.vocab_size * 4
