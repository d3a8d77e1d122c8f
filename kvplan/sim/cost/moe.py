"""The routed experts of an MoE model: what one step's expert GEMMs cost on one rank.

A batch of T tokens, each routed to k of E experts: with routing spread evenly (what the load-balancing loss
trains for), the expected number of experts that receive at least one token is E × (1 − (1 − k/E)^T), and each of
them multiplies its T × k / touched tokens. Each touched expert is one GEMM: its rows computed in whole tiles
(tile quantization, as the dense GEMMs), its weights read once. So a small decode batch reads many experts for a
few rows each (weight-bandwidth bound over the touched experts), and a large prefill touches every expert and is
compute bound over the active parameters only. Each rank holds 1/tp of every expert (TP) or whole experts on
1/tp of the ranks (EP): either way a rank's share of the compute and of the weights read is 1/tp; what differs is
the collective (`sim.cost.parallel`). Uneven routing (a hot expert) is not modelled: a lower bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvplan.sim.cost.features import step_max
from kvplan.sim.specs.arch import ModelSpec, stage_layers


def expected_touched(experts: int, per_token: int, tokens):
    """Expected experts with at least one of `tokens` tokens (each routed to `per_token` distinct experts). One
    step and a stretch's array go through numpy's power alike: its vectorised pow (SIMD on AVX-512 machines)
    differs from C's by an ulp, which would make the fast path's step times differ from the step-by-step ones."""
    untouched = np.power(1.0 - per_token / experts, np.asarray(tokens, dtype=np.float64))
    share = experts * (1.0 - untouched)
    return share if isinstance(tokens, np.ndarray) else float(share)


@dataclass(slots=True, frozen=True)
class ExpertCost:
    experts: int
    per_token: int
    layers: float  # MoE layers on the busiest pipeline stage (a share of them: pp need not divide the layers)
    expert_params: int
    bytes_per_param: float
    tp: int
    tile: int
    flop_rate: float
    byte_rate: float

    @classmethod
    def of(cls, model: ModelSpec, tp: int, pp: int, tile: int, flop_rate: float, byte_rate: float) -> ExpertCost:
        width = model.expert_dtype_bytes if model.expert_dtype_bytes is not None else (
            model.dtype_bytes if model.weight_dtype_bytes is None else model.weight_dtype_bytes)
        layers = model.num_moe_layers * stage_layers(model.num_layers, pp) / model.num_layers
        return cls(model.num_experts, model.experts_per_token, layers, model.expert_params, width, tp, tile,
                   flop_rate, byte_rate)

    def time(self, tokens):
        """Seconds of the routed experts for a step of `tokens` tokens (a number or an array)."""
        touched = expected_touched(self.experts, self.per_token, tokens)
        rows = tokens * self.per_token / step_max(touched, 1.0)
        padded = -(-rows // self.tile) * self.tile
        flops = 2.0 * self.expert_params * touched * padded / self.tp
        read = touched * self.expert_params * self.bytes_per_param / self.tp
        return self.layers * step_max(flops / self.flop_rate, read / self.byte_rate)
