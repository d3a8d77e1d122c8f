"""The attention kernels' cost on one rank: prefill (causal FLOPs at a FlashAttention-class efficiency) and decode
(the larger of its FLOPs and the KV bytes it reads, whole blocks, so the block size shows).

`AttentionCost.time(f)` prices the attention of a step's features (plain ints or a stretch's arrays, the same IEEE
operations either way). Sliding-window layers are priced on the window features, full layers on the plain ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvplan.sim.cost.features import StepFeatures
from kvplan.sim.specs.arch import ModelSpec, stage_layers
from kvplan.sim.specs.hardware import HardwareSpec


def _max(a, b):
    """max of plain numbers, or element-wise when either is a stretch's array (the same IEEE result per entry)."""
    return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)


@dataclass(slots=True)
class AttentionCost:
    model: ModelSpec
    hardware: HardwareSpec
    block_size: int
    kv_dtype_bytes: float | None = None
    tp: int = 1
    pp: int = 1
    # Fraction of peak FLOP/s FlashAttention achieves: FlashAttention-2 (Dao 2023, arXiv:2307.08691) reports its
    # forward pass at 50-73% of the A100's theoretical maximum, the top at long sequences; causal masking and
    # inference-sized chunks (a few thousand queries at most) run toward the low end, so the low end: 0.5.
    attention_efficiency: float = 0.5
    # Achieved fraction of peak HBM bandwidth reading the KV cache.
    memory_efficiency: float = 0.8
    _prefill_unit: float = field(init=False, repr=False)
    _decode_unit: float = field(init=False, repr=False)
    _kv_block: float = field(init=False, repr=False)
    _flop_rate: float = field(init=False, repr=False)
    _byte_rate: float = field(init=False, repr=False)
    _sliding_share: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        m = self.model
        share = stage_layers(m.num_layers, self.pp) / m.num_layers / self.tp  # this rank's part of the layers
        self._prefill_unit = m.prefill_pair_flops * share
        self._decode_unit = m.decode_pair_flops * share
        self._kv_block = m.kv_bytes_per_token(self.kv_dtype_bytes, self.tp, self.pp) * self.block_size
        self._flop_rate = self.hardware.peak_flops * self.attention_efficiency
        self._byte_rate = self.hardware.hbm_bandwidth * self.memory_efficiency
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
        prefill = self._prefill_unit * (attention2 / 2.0) / self._flop_rate
        decode = _max(self._decode_unit * context / self._flop_rate, self._kv_block * blocks / self._byte_rate)
        return prefill + decode
