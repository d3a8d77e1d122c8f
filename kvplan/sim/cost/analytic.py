"""Analytic step cost: a step's time is the sum of its ops, each priced by its per-op law (`sim.gpu.laws`:
datasheet numbers and constants fitted on measured GPUs), or by the GPU's measured table when it has a profile
(`sim.gpu.table`, SimSpec `gpu_profile`); the engine core's CPU work (vLLM's scheduler: per step, per running
request, per admitted prefill; measured, `sim.gpu.host_overhead`) overlaps it under async scheduling, so a step
takes the longer of the two (their sum with `async_scheduling` off).

With M = the step's tokens (prefill tokens + decodes) and S = its sampled rows (`StepFeatures.sampled`), on one
rank of the busiest pipeline stage:
- layer GEMMs, per op shape (`sim.gpu.shapes`): qkv (h × (heads + 2 kv heads) × d / t), out, up+gate, down over
  M rows, each with the GEMM law (tile and wave quantization, roofline of FLOPs vs weight + activation bytes,
  a kernel floor); an MoE layer's router and shared experts as one more GEMM, its routed experts by
  `sim.cost.moe` at the GEMM law's efficiencies; a quantized model's at its weight width and GEMM rate (fp8: the
  FP8 tensor cores; awq / gptq: weight-only, the BF16 rate; `sim.specs.quantization`);
- LM head: vocab / t × hidden over S rows, nothing when S = 0 (only sampled rows reach it), in the model dtype;
- attention: `sim.gpu.attention.AttentionCost` (docs/attention.md): the larger of its FLOPs (prefill pairs at a
  FlashAttention-class efficiency that depends on the head dim and the keys per query, plus decode pairs) and the
  KV blocks it reads (whole blocks, each with a gather overhead, so the block size shows), plus a floor per layer;
- element-wise, per op with its law (a floor per kernel plus bytes): per layer the two norms, RoPE, the MLP
  activation, the residual add and the KV-cache write; per step the embedding gather and the final norm;
- TP collectives: two all-reduces of the hidden states per layer with the per-GPU-count law (EP: an all-to-all
  dispatch and combine instead of an MoE layer's second all-reduce); PP: a send/recv between stages.
`StepFeatures.batched` (a CPU BLAS effect) is priced by the calibrated model only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, overload

import numpy as np

from kvplan.errors import UserError
from kvplan.sim.cost.features import FEATURE_NAMES, StepFeatures, is_zero, step_max
from kvplan.sim.cost.moe import ExpertCost
from kvplan.sim.cost.parallel import Shape, micro_batches, moe_activation_width, weight_bytes_per_rank
from kvplan.sim.cost.step_law import StepLaw
from kvplan.sim.cost.token_table import TokenTable
from kvplan.sim.gpu.attention import AttentionCost
from kvplan.sim.gpu.custom_allreduce import step_allreduce_time
from kvplan.sim.gpu.host_overhead import HOST
from kvplan.sim.gpu.laws import GpuLaws, shipped_laws
from kvplan.sim.specs.arch import ModelSpec, stage_layers
from kvplan.sim.specs.hardware import HardwareSpec
from kvplan.sim.specs.quantization import gemm_peak, gemm_tile_rows

if TYPE_CHECKING:  # the table (pandas) is loaded only when a GPU profile is given
    from kvplan.sim.gpu.table import MeasuredTable


@dataclass(slots=True, frozen=True)
class _Op:
    """One kind of kernel of the step: `count` of them (layers on this rank's stage), priced on M rows."""

    name: str  # the Vidur op name (a measured table's series)
    count: float
    law: str = ""  # the element-wise law it is priced with ("": its own name)
    k: int = 0  # GEMM: one rank's weight is k × n
    n: int = 0
    bytes_per_token: float = 0.0  # element-wise: bytes read + written per token


def step_ops(model: ModelSpec, tp: int = 1, pp: int = 1, kv_dtype_bytes: float | None = None) -> tuple[
        list[_Op], list[_Op], float]:
    """(GEMMs over the step's tokens, element-wise ops, the weight bytes per GEMM parameter) of one rank of the
    busiest stage. Per-rank shapes as `sim.gpu.shapes`; element-wise bytes per token in the model dtype (h
    hidden, i intermediate): norms 2h, residual add 3h, RoPE 2 × (heads + kv heads) / t × d, SwiGLU 3i / t (a
    plain MLP 2i / t; an MoE layer its routed and shared experts' widths), the KV-cache write reads the fresh K
    and V and stores them in the cache dtype; the embedding gather 2h and the final norm 2h once per step."""
    m, h = model, model.hidden_size
    share = stage_layers(m.num_layers, pp) / m.num_layers
    layers = m.num_layers * share
    moe_layers = m.num_moe_layers * share
    dense = layers - moe_layers
    d = m.head_dim
    heads, kv = m.num_heads // tp, m.kv_heads_per_rank(tp)
    attn_params = m.attention_params  # q, k, v, o of one layer (MLA: its projections)
    out_k = (m.v_head_dim or d) * heads
    qkv_n = max((attn_params - out_k * tp * h) // (h * tp), 1)
    gemms = [_Op("attn_pre_proj", layers, k=h, n=qkv_n), _Op("attn_post_proj", layers, k=out_k, n=h)]
    width = (2 if m.gated_mlp else 1) * m.intermediate_size // tp
    if dense > 0:
        gemms += [_Op("mlp_up_proj", dense, k=h, n=width),
                  _Op("mlp_down_proj", dense, k=m.intermediate_size // tp, n=h)]
    if moe_layers > 0:
        fixed = (m.moe_fixed_params - attn_params) // (h * tp)  # router and shared experts, as one GEMM
        if fixed > 0:
            gemms.append(_Op("moe_fixed", moe_layers, k=h, n=fixed))
    act = 2.0 * m.dtype_bytes
    moe_act = 3 * (m.experts_per_token + m.shared_experts) * m.moe_intermediate_size / tp
    kv_layer = (m.kv_bytes_per_token(None, tp, pp) + m.kv_bytes_per_token(kv_dtype_bytes, tp, pp)) / layers
    elementwise = [
        _Op("input_layernorm", layers + 1, bytes_per_token=h * act),  # + the final norm
        _Op("post_attention_layernorm", layers, bytes_per_token=h * act),
        _Op("attn_rope", layers, bytes_per_token=(heads + kv) * d * act),
        _Op("add", layers, bytes_per_token=1.5 * h * act),
        _Op("kv_cache_write", layers, "add", bytes_per_token=kv_layer),  # a copy kernel, priced as one
        _Op("emb", 1.0, bytes_per_token=h * act)]
    if dense > 0:
        # SwiGLU reads gate and up (width) and writes half of it; a plain activation reads and writes width
        elementwise.append(_Op("mlp_act", dense, bytes_per_token=(0.75 if m.gated_mlp else 1.0) * width * act))
    if moe_layers > 0:
        elementwise.append(_Op("moe_act", moe_layers, "mlp_act", bytes_per_token=moe_act * m.dtype_bytes))
    weight = m.dtype_bytes if m.weight_dtype_bytes is None else m.weight_dtype_bytes
    return gemms, elementwise, weight


@dataclass(slots=True)
class AnalyticCost:
    model: ModelSpec
    hardware: HardwareSpec
    block_size: int
    kv_dtype_bytes: float | None = None
    # Overrides of the laws' fitted constants (None: the law's, `sim.gpu.laws` / docs/gpu_fidelity.md).
    compute_efficiency: float | None = None  # GEMM: achieved fraction of peak dense FLOP/s
    memory_efficiency: float | None = None  # GEMMs (and, when set, attention's KV reads): fraction of HBM bandwidth
    # The engine core's CPU work per step (vLLM's scheduler and output update), per running request and per
    # admitted prefill: measured on vLLM's own code (`sim.gpu.host_overhead`, docs/host_overhead.md).
    step_overhead_s: float = HOST.step_s
    request_overhead_s: float = HOST.step_per_seq_s
    admit_overhead_s: float = HOST.admit_per_request_s
    # vLLM's async scheduling (the default since it became one: `async_scheduling` None -> True in
    # vllm/config/vllm.py) schedules step n + 1 while step n runs on the GPU, so a step takes the longer of the
    # two, not their sum; False: the CPU work and the forward pass run one after the other.
    async_scheduling: bool = True
    # Neither the longest decode context nor `batched` enters the laws (`sim.cost.reads_spread`)
    reads_spread: ClassVar[bool] = False
    # Fraction of peak FLOP/s the attention kernels achieve; None: the shape-aware law fitted on FlashAttention-3's
    # published speeds (`sim.gpu.attention`, docs/attention.md). A number replaces that law's e(head_dim).
    attention_efficiency: float | None = None
    gemm_tile_rows: int | None = None  # GEMM tile rows (None: the law's)
    link_efficiency: float | None = None  # all-reduce / all-to-all: achieved fraction of the link bandwidth
    p2p_efficiency: float | None = None  # send/recv inside a node
    # The replica's GPUs (tensor, pipeline and expert parallelism); one GPU by default.
    shape: Shape = field(default_factory=Shape)
    laws: GpuLaws | None = None  # None: the shipped fitted constants
    table: MeasuredTable | None = None  # this GPU's measured per-op table (a profile), if any
    _laws: GpuLaws = field(init=False, repr=False)
    _gemms: list[_Op] = field(init=False, repr=False)
    _table_gemms: list[tuple[_Op, tuple]] = field(init=False, repr=False)
    _ew_floor: float = field(init=False, repr=False)
    _ew_per_token: float = field(init=False, repr=False)
    _table_ew: list[tuple[_Op, tuple]] = field(init=False, repr=False)
    _weight_bytes: float = field(init=False, repr=False)
    _gemm_peak: float = field(init=False, repr=False)  # FLOP/s of the layer GEMMs (sim.specs.quantization)
    _gemm_tile: int | None = field(init=False, repr=False)  # rows their kernels pad to (None: the law's)
    _byte_rate: float = field(init=False, repr=False)
    _attention: AttentionCost = field(init=False, repr=False)
    _experts: ExpertCost | None = field(init=False, repr=False)
    _hidden_bytes: float = field(init=False, repr=False)
    _stage_moe_layers: float = field(init=False, repr=False)
    _stage_dense_layers: float = field(init=False, repr=False)
    # The terms of `_stage_time` that depend on the token count (or the sampled rows) alone, tabulated
    _linear: TokenTable = field(init=False, repr=False)
    _head: TokenTable = field(init=False, repr=False)
    _decode_linear: TokenTable = field(init=False, repr=False)
    _expert_table: TokenTable | None = field(init=False, repr=False)
    _collective_table: TokenTable | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for key in ("compute_efficiency", "memory_efficiency", "attention_efficiency", "link_efficiency",
                    "p2p_efficiency"):
            value = getattr(self, key)
            if value is not None and not 0.0 < value <= 1.0:
                raise UserError(f"cost.{key}: must be a fraction in (0, 1], got {value!r}")
        for key in ("step_overhead_s", "request_overhead_s", "admit_overhead_s"):
            if getattr(self, key) < 0:
                raise UserError(f"cost.{key}: must be >= 0, got {getattr(self, key)!r}")
        tile: object = self.gemm_tile_rows  # cost options come from a file: whatever was written there
        if tile is not None and not (isinstance(tile, int) and tile >= 1):
            raise UserError(f"cost.gemm_tile_rows: must be an integer >= 1, got {self.gemm_tile_rows!r}")
        laws = self.laws if self.laws is not None else shipped_laws()
        overrides: dict[str, Any] = {"gemm_compute_efficiency": self.compute_efficiency,
                     "gemm_memory_efficiency": self.memory_efficiency, "gemm_tile_m": self.gemm_tile_rows,
                     "allreduce_efficiency": self.link_efficiency, "p2p_efficiency": self.p2p_efficiency}
        self._laws = laws = replace(laws, **{k: v for k, v in overrides.items() if v is not None})
        m, hw, tp, pp = self.model, self.hardware, self.shape.tp, self.shape.pp
        gemms, elementwise, self._weight_bytes = step_ops(m, tp, pp, self.kv_dtype_bytes)
        shape_key = (m.hidden_size, m.num_heads, m.num_kv_heads, m.intermediate_size, m.gated_mlp, tp)
        measured = self.table.series if self.table is not None else {}
        # a profile's GEMMs were measured on the model dtype's weights: GEMMs over quantized weights run other kernels
        gemm_measured = measured if m.weight_dtype_bytes is None else {}
        self._table_gemms = [(op, ("op", op.name, *shape_key)) for op in gemms
                             if ("op", op.name, *shape_key) in gemm_measured]
        self._gemms = [op for op in gemms if ("op", op.name, *shape_key) not in gemm_measured]
        self._table_ew = [(op, ("op", op.name, *shape_key)) for op in elementwise
                          if ("op", op.name, *shape_key) in measured]
        rest = [op for op in elementwise if ("op", op.name, *shape_key) not in measured]
        self._ew_floor = sum(op.count * laws.elementwise_floor(op.law or op.name, hw) for op in rest)
        self._ew_per_token = sum(op.count * op.bytes_per_token * laws.elementwise_rate(op.law or op.name, hw)
                                 for op in rest)
        self._byte_rate = hw.hbm_bandwidth * laws.gemm_memory_efficiency
        self._gemm_peak, self._gemm_tile = gemm_peak(m, hw), gemm_tile_rows(m)
        flop_rate = self._gemm_peak * laws.gemm_compute_efficiency
        # the attention kernels keep their own KV-read efficiency (sim.gpu.attention) unless the user sets one
        kv_read = {} if self.memory_efficiency is None else {"memory_efficiency": self.memory_efficiency}
        self._attention = AttentionCost(m, hw, self.block_size, self.kv_dtype_bytes, tp, pp,
                                        self.attention_efficiency, **kv_read)
        tile = laws.gemm_tile_m if self._gemm_tile is None else self._gemm_tile
        self._experts = ExpertCost.of(m, tp, pp, tile, flop_rate, self._byte_rate) if m.is_moe else None
        self._hidden_bytes = m.hidden_size * m.dtype_bytes
        share = stage_layers(m.num_layers, pp) / m.num_layers
        self._stage_moe_layers = m.num_moe_layers * share
        self._stage_dense_layers = (m.num_layers - m.num_moe_layers) * share
        self._linear, self._head = TokenTable(self._linear_time), TokenTable(self._head_time)
        self._decode_linear = TokenTable(self._decode_linear_time)
        self._expert_table = TokenTable(self._experts.time) if self._experts is not None else None
        self._collective_table = TokenTable(self._collectives) if tp > 1 else None

    @property
    def resolved_laws(self) -> GpuLaws:
        """The constants this cost prices with (the laws with this cost's overrides)."""
        return self._laws

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
            hop = self._laws.send_recv_time(tokens * self._hidden_bytes, self.hardware,
                                            self.shape.crosses_nodes(self.hardware))
            compute = pp * self._stage_time(part) + (pp - 1) * hop
        # prefill chunks (every non-decode request in the step): an upper bound on the requests admitted in it
        host = self.step_overhead_s + self.request_overhead_s * f.num_requests
        if f.num_requests is not f.decode_requests:  # (one array in a decode stretch: admit × 0 adds +0.0)
            host = host + self.admit_overhead_s * (f.num_requests - f.decode_requests)
        return step_max(compute, host) if self.async_scheduling else compute + host

    def step_law(self) -> StepLaw | None:
        """This model's step as a `StepLaw` (the same times, on plain numbers), or None where a step takes another
        branch of `step_times`: pipeline parallelism (micro-batches) or sliding-window layers (their window
        features)."""
        attention = self._attention
        if self.shape.pp != 1 or attention._sliding_share:
            return None
        return StepLaw(self._linear, self._head, self._decode_linear, self._expert_table, self._collective_table,
                       attention._prefill_unit, attention._queries_k0, attention._decode_unit,
                       attention._block_tokens, attention.request_tokens, attention._flop_rate,
                       attention._token_bytes, attention._byte_rate, attention._floor, self.step_overhead_s,
                       self.request_overhead_s, self.admit_overhead_s, self.async_scheduling)

    def _gemm(self, rows, k: int, n: int):
        """A layer GEMM: the layers' weight width, at the rate their quantization runs at."""
        return self._laws.gemm_time(rows, k, n, self.hardware, self._weight_bytes, self.model.dtype_bytes,
                                    self._gemm_peak, self._gemm_tile)

    def _gemm_law(self, op: _Op) -> Callable:
        return lambda rows: self._gemm(rows, op.k, op.n)

    def _elementwise_law(self, op: _Op) -> Callable:
        return lambda tokens: self._laws.elementwise_time(op.name, op.bytes_per_token * tokens, self.hardware)

    def _measured(self, key: tuple, x, law: Callable):
        """The table's seconds for series `key` at x (`law`, the op's law, where the table extrapolates)."""
        assert self.table is not None
        return self.table.op_seconds(key, x, law)

    def _stage_time(self, f: StepFeatures) -> np.ndarray | float:
        """One rank's compute for the features `f` on the busiest pipeline stage (the whole model without PP): the
        terms that depend on one count are looked up (`token_table`), in the order the sum has always run."""
        tokens = f.decode_requests if is_zero(f.prefill_tokens) else f.prefill_tokens + f.decode_requests
        if tokens is f.sampled:  # a decode stretch's one array (`decode_stretch_features`): both terms at once
            compute = self._decode_linear.at(tokens) + self._attention.time(f)
        else:
            compute = self._linear.at(tokens) + self._head.at(f.sampled) + self._attention.time(f)
        if self._expert_table is not None:
            compute = compute + self._expert_table.at(tokens)
        if self._collective_table is not None:
            compute = compute + self._collective_table.at(tokens)
        return compute

    def _linear_time(self, tokens) -> np.ndarray | float:
        """The element-wise ops and the layer GEMMs over `tokens` rows (the `_linear` table's term)."""
        compute = self._ew_floor + self._ew_per_token * tokens
        for op in self._gemms:
            compute = compute + op.count * self._gemm(tokens, op.k, op.n)
        for op, key in self._table_gemms:
            compute = compute + op.count * self._measured(key, tokens, self._gemm_law(op))
        for op, key in self._table_ew:
            compute = compute + op.count * self._measured(key, tokens, self._elementwise_law(op))
        return compute

    def _decode_linear_time(self, tokens) -> np.ndarray | float:
        """The linear layers plus the LM head of a step whose every token is sampled (the `_decode_linear` table's
        term: the same addition `_stage_time` makes of the two tables' entries)."""
        return self._linear.at(tokens) + self._head.at(tokens)

    def _head_time(self, sampled) -> np.ndarray | float:
        """The LM head over the `sampled` rows, nothing when none is sampled (the `_head` table's term)."""
        m = self.model  # the LM head stays in the model dtype, at the BF16 rate, whatever the layers' quantization
        head = self._laws.gemm_time(sampled, m.hidden_size, m.vocab_size // self.shape.tp, self.hardware,
                                    m.dtype_bytes, m.dtype_bytes)
        return head * (sampled > 0)

    def _collectives(self, tokens) -> np.ndarray | float:
        """The stage's TP collectives: two all-reduces of the hidden states per layer; with EP an MoE layer's
        second one is an all-to-all dispatch of each token to its k experts' ranks and a combine back."""
        tp, hw, laws = self.shape.tp, self.hardware, self._laws
        hidden = tokens * self._hidden_bytes
        reduce = laws.allreduce_time(hidden, tp, hw)
        key = ("net", "all_reduce", tp, False)
        if self.table is not None and key in self.table.series:
            reduce = self._measured(key, hidden, lambda nbytes: laws.allreduce_time(nbytes, tp, hw))
        else:  # vLLM's own kernel for the messages it takes (sim.gpu.custom_allreduce); a profile measured NCCL
            reduce = step_allreduce_time(reduce, hidden, tp, hw)
        if not (self.shape.expert_parallel and self._experts is not None):
            return 2 * (self._stage_dense_layers + self._stage_moe_layers) * reduce
        dispatch = laws.all_to_all_time(hidden * self._experts.per_token, tp, hw)
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
                       max_num_batched_tokens: int = 2048, max_num_seqs: int = 256, shape: Shape | None = None,
                       lora_bytes: float = 0.0) -> int:
    """KV blocks that fit on each rank: (memory × utilization − the rank's weights − activation reserve − its LoRA
    buffers) ÷ the rank's bytes per block. Every rank holds the same tokens (its heads' or its layers' part of
    them). `lora_bytes`: the stacked adapter buffers vLLM allocates before sizing the cache (`sim.lora`)."""
    shape = shape or Shape()
    budget = hardware.memory_bytes * gpu_memory_utilization - weight_bytes_per_rank(model, shape)
    budget -= activation_reserve(model, max_num_batched_tokens, max_num_seqs, shape.tp) + lora_bytes
    per_block = model.kv_bytes_per_token(kv_dtype_bytes, shape.tp, shape.pp) * block_size
    return max(int(budget // per_block), 0)


def activation_reserve(model: ModelSpec, max_num_batched_tokens: int, max_num_seqs: int, tp: int = 1) -> float:
    """Peak activation memory of one step on one rank: hidden states and the rank's share of the MLP
    intermediate of every batched token, plus fp32 logits of every sequence (what vLLM's profiling run
    measures; the logits are gathered whole)."""
    width = model.intermediate_size if tp == 1 and not model.is_moe else moe_activation_width(model) / tp
    per_token = (4 * model.hidden_size + 2 * width) * model.dtype_bytes
    return max_num_batched_tokens * per_token + max_num_seqs * model.vocab_size * 4
