"""The attention kernels' cost on one rank: prefill as causal FLOPs at a FlashAttention-class efficiency that
depends on the head dim and on how many keys each query reads, decode as the KV bytes it reads plus a paged-gather
overhead per block touched and per request, and a fixed floor per kernel launch (one attention kernel per layer
per step, as vLLM's unified varlen kernels run prefill and decode rows together).

The law, per step, on one rank of the busiest pipeline stage (L its layers, F the attention FLOPs of one
(query, key) pair over those layers, B the KV bytes of one token over those layers, b the block size):

    compute = F × (Σ pairs + K0(d) × Σ queries + Σ context) / (peak × e(d))
    read    = B × (blocks × (b + g) + r × requests) / (HBM × eta)
    time    = max(compute, read) + L × kernel_s

The larger of compute and read, not their sum: one kernel per layer runs the step's prefill and decode rows
together, and it streams K/V while it computes (a long prefill is compute-bound, its KV read hidden; a decode
batch or a short chunk after a long cached prefix is bound by the read).

- Σ pairs = Σ chunk × (start + chunk / 2) (causal; `StepFeatures.prefill_attention2` / 2), Σ queries = the prefill
  tokens, Σ context = the keys the decode rows read. K0 is the per-query-tile work (loading Q, the epilogue, the
  partly masked diagonal tile) in keys' worth: a chunk whose queries read K keys on average runs at
  e × K / (K + K0), which is how FlashAttention's speed grows with the sequence length (FA3 paper, Fig. 5). e(d)
  and K0(d) are fitted per head dim on the published points of `attention_reference` (64, 128, 256; linear in
  log2(head_dim) between, clamped outside).
- blocks = `StepFeatures.blocks_touched` (whole blocks: vLLM's paged kernels load a block's every slot and mask the
  scores), so a block costs the bytes of b tokens plus g tokens' worth of gather overhead (the block-table
  lookup, its dependent address, the start of a new run of memory): per token (b + g) / b, which is why small
  blocks cost more (vLLM paper, Fig. 18). g comes from the engine's own paged kernel measured on CPU (the shape:
  overhead relative to one token's K/V, `kvplan.bench.attention_blocks`); no published GPU figure varies the
  block size of one kernel, so g is carried over, not fitted on a GPU. r (per decode request: its query, softmax
  merge and output, in tokens' worth), eta and kernel_s are fitted on published H100 paged-decode timings.
- GQA enters through B (KV heads × head_dim): a decode reads each KV head once for its whole query group.

Sliding-window layers are priced on the window features, full layers on the plain ones. Plain ints or a
stretch's arrays: the same IEEE operations either way (`tests/sim/test_fast_path.py`).

Every constant below is written from `attention_reference.fit_constants()` (the published points) and
`kvplan.bench.attention_blocks.fit_decode` (the CPU measurement); `scripts/attention_block_size.py --fit` prints
both fits and tests/sim/test_attention.py checks that the constants are what the fits give.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from kvplan.sim.cost.features import StepFeatures, is_zero, step_max
from kvplan.sim.specs.arch import ModelSpec, stage_layers
from kvplan.sim.specs.hardware import HardwareSpec

# Fitted on FlashAttention-3's causal forward speeds on H100 SXM5 (attention_reference.PREFILL_POINTS):
# head_dim -> (e: efficiency at long sequences, K0: per-query overhead in keys).
PREFILL_LAW: dict[int, tuple[float, float]] = {64: (0.5085, 365.6), 128: (0.6627, 243.5), 256: (0.7018, 281.1)}
# Fitted on the H100 paged-decode timings (attention_reference.DECODE_POINTS), with GATHER_TOKENS held fixed.
DECODE_ETA = 0.7864  # achieved fraction of peak HBM bandwidth reading K/V
# Per decode request, in tokens' worth of K/V: fitted, clamped at 0 (the fitted decode timings share one batch
# size, 64, so a per-request cost cannot be told from the kernel floor there; the term stays for a richer table).
REQUEST_TOKENS = 0.0
KERNEL_S = 11.79e-6  # per attention kernel launch (one per layer per step): its floor on the GPU
# Measured on this repository's fused CPU decode kernel (kvplan.bench.attention_blocks): a block's overhead in
# tokens' worth of K/V.
GATHER_TOKENS = 0.4


def prefill_law(head_dim: int) -> tuple[float, float]:
    """(e, K0) for `head_dim`: linear in log2(head_dim) between the fitted head dims, clamped outside them."""
    dims = sorted(PREFILL_LAW)
    x = min(max(math.log2(head_dim), math.log2(dims[0])), math.log2(dims[-1]))
    for lo, hi in itertools.pairwise(dims):
        if x <= math.log2(hi):
            w = (x - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
            (e0, k0), (e1, k1) = PREFILL_LAW[lo], PREFILL_LAW[hi]
            return e0 + w * (e1 - e0), k0 + w * (k1 - k0)
    return PREFILL_LAW[dims[-1]]


def attention_head_dim(model: ModelSpec) -> int:
    """The query-key width the kernel tiles over: head_dim, or MLA's qk_nope + qk_rope dims."""
    return model.qk_nope_head_dim + model.qk_rope_head_dim if model.is_mla else model.head_dim


@dataclass(slots=True)
class AttentionCost:
    model: ModelSpec
    hardware: HardwareSpec
    block_size: int
    kv_dtype_bytes: float | None = None
    tp: int = 1
    pp: int = 1
    # None: the fitted law (PREFILL_LAW's e for the model's head dim). A number replaces e, a flat fraction of peak
    # FLOP/s (the cost option `attention_efficiency`); K0 still applies.
    attention_efficiency: float | None = None
    # None: DECODE_ETA, fitted on published paged-decode timings. A number replaces it (`memory_efficiency`).
    memory_efficiency: float | None = None
    gather_tokens: float = GATHER_TOKENS
    request_tokens: float = REQUEST_TOKENS
    kernel_s: float = KERNEL_S
    _prefill_unit: float = field(init=False, repr=False)
    _decode_unit: float = field(init=False, repr=False)
    _queries_k0: float = field(init=False, repr=False)
    _token_bytes: float = field(init=False, repr=False)
    _block_tokens: float = field(init=False, repr=False)
    _flop_rate: float = field(init=False, repr=False)
    _byte_rate: float = field(init=False, repr=False)
    _floor: float = field(init=False, repr=False)
    _sliding_share: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        m = self.model
        layers = stage_layers(m.num_layers, self.pp)
        share = layers / m.num_layers / self.tp  # this rank's part of the layers' query heads
        efficiency, k0 = prefill_law(attention_head_dim(m))
        if self.attention_efficiency is not None:
            efficiency = self.attention_efficiency
        self._prefill_unit = m.prefill_pair_flops * share
        self._decode_unit = m.decode_pair_flops * share
        self._queries_k0 = k0
        self._token_bytes = m.kv_bytes_per_token(self.kv_dtype_bytes, self.tp, self.pp)
        self._block_tokens = self.block_size + self.gather_tokens
        self._flop_rate = self.hardware.peak_flops * efficiency
        eta = DECODE_ETA if self.memory_efficiency is None else self.memory_efficiency
        self._byte_rate = self.hardware.hbm_bandwidth * eta
        self._floor = layers * self.kernel_s
        # Sliding-window layers attend to at most `sliding_window` keys: their share of the attention work and
        # of the KV bytes read is priced on the step's window features (every stage holds the same mix).
        kinds = m.layer_types or ()
        self._sliding_share = kinds.count("sliding_attention") / m.num_layers if m.sliding_window else 0.0

    @property
    def sliding_window(self) -> int:
        """The window of the model's sliding layers, 0 when every layer attends to the whole context."""
        window = self.model.sliding_window
        return int(window) if window and self._sliding_share else 0

    def time(self, f: StepFeatures) -> np.ndarray | float:
        """Seconds of the step's attention kernels on one rank of the busiest pipeline stage."""
        attention2: np.ndarray | float = f.prefill_attention2
        context: np.ndarray | float = f.decode_context
        blocks: np.ndarray | float = f.blocks_touched
        if self._sliding_share:  # full layers read every key, sliding layers the window's
            full, sliding = 1.0 - self._sliding_share, self._sliding_share
            attention2 = full * attention2 + sliding * f.window_attention2
            context = full * context + sliding * f.window_context
            blocks = full * blocks + sliding * f.window_blocks
        # A term that is exactly +0.0 is left out rather than added (decode steps: no prefill; REQUEST_TOKENS 0):
        # x + 0.0 is x for every x >= 0, so the time is the same bit for bit, with fewer array operations.
        compute = self._decode_unit * context
        if not (is_zero(attention2) and is_zero(f.prefill_tokens)):
            compute = self._prefill_unit * (attention2 / 2.0 + self._queries_k0 * f.prefill_tokens) + compute
        read = blocks * self._block_tokens
        if self.request_tokens:
            read = read + self.request_tokens * f.decode_requests
        return step_max(compute / self._flop_rate, self._token_bytes * read / self._byte_rate) + self._floor
