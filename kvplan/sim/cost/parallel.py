"""A replica on several GPUs: the deployment shape (tensor, pipeline, expert parallelism), what it refuses, the
collectives it pays for and what each rank's memory holds.

- Tensor parallelism (TP, Megatron-style as vLLM runs it): every layer's GEMMs and attention heads split across
  the TP ranks, KV heads too (a KV head replicated when there are fewer KV heads than ranks); each layer pays two
  all-reduces of the step's hidden states (after attention and after the MLP). TP stays inside one node.
- Pipeline parallelism (PP): the layers split into stages, one TP group each; the hidden states of a micro-batch
  are sent from stage to stage (across nodes when the replica spans more GPUs than a node has).
- Expert parallelism (EP, vLLM's `enable_expert_parallel`): an MoE layer's experts are placed whole on the TP
  ranks instead of each being sharded; the MoE layer's all-reduce becomes an all-to-all dispatch of each token's
  hidden state to its experts' ranks and a combine back.

Collective times are the per-op laws of `sim.gpu.laws` (all-reduce per GPU count, ring or NVLink SHARP;
all-to-all; send/recv), fitted on Vidur's DGX A100 profiles (docs/gpu_fidelity.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvplan.errors import UserError
from kvplan.sim.specs.arch import ModelSpec, stage_layers
from kvplan.sim.specs.hardware import HardwareSpec


@dataclass(slots=True, frozen=True)
class Shape:
    """One replica's GPUs: tp × pp of them."""

    tp: int = 1
    pp: int = 1
    expert_parallel: bool = False

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    def crosses_nodes(self, hardware: HardwareSpec) -> bool:
        return self.gpus > hardware.gpus_per_node


def tp_choices(model: ModelSpec, hardware: HardwareSpec) -> list[int]:
    """TP degrees the model's heads allow inside one node of `hardware`."""
    return [t for t in range(1, hardware.gpus_per_node + 1) if tp_problem(model, t) is None]


def tp_problem(model: ModelSpec, tp: int) -> str | None:
    if model.num_heads % tp:
        return f"does not divide {model.name}'s {model.num_heads} attention heads"
    if not model.is_mla and model.num_kv_heads % tp and tp % model.num_kv_heads:
        return f"and {model.name}'s {model.num_kv_heads} KV heads neither divide nor replicate evenly"
    return None


def check_shape(model: ModelSpec, hardware: HardwareSpec, shape: Shape) -> None:
    """Refuse a shape the model or the node cannot take, one line naming the flag and what is allowed."""
    allowed = ", ".join(map(str, tp_choices(model, hardware)))
    if shape.tp > hardware.gpus_per_node:
        raise UserError(f"--tensor-parallel-size: {shape.tp} exceeds the {hardware.gpus_per_node} GPU(s) of one "
                         f"{hardware.name} node; allowed: {allowed} (tensor parallelism stays inside a node; "
                         "pipeline stages may span nodes)")
    problem = tp_problem(model, shape.tp)
    if problem is not None:
        raise UserError(f"--tensor-parallel-size: {shape.tp} {problem}; allowed: {allowed}")
    if shape.pp > model.num_layers:
        raise UserError(f"--pipeline-parallel-size: {shape.pp} exceeds {model.name}'s {model.num_layers} layers; "
                         f"allowed: 1 to {model.num_layers}")
    if shape.crosses_nodes(hardware) and hardware.internode_bandwidth <= 0:
        raise UserError(f"--pipeline-parallel-size: {shape.tp} x {shape.pp} GPUs exceed one {hardware.name} box "
                         f"({hardware.gpus_per_node} GPU) and it states no network between boxes; allowed: at most "
                         f"{hardware.gpus_per_node} GPU(s) per replica")


def weight_bytes_per_rank(model: ModelSpec, shape: Shape) -> float:
    """Resident weight bytes of the busiest rank: its share of its stage's layers, and (vocab-parallel) its share of
    the embedding table or the LM head - with PP the first stage holds the one and the last the other."""
    if shape.tp == 1 and shape.pp == 1:
        return model.weight_bytes
    layers = (model.layer_weight_bytes + model.expert_weight_bytes) * stage_layers(model.num_layers, shape.pp) / \
        model.num_layers
    tables = model.embedding_bytes if shape.pp == 1 else model.vocab_size * model.hidden_size * model.dtype_bytes
    return (layers + tables) / shape.tp


def moe_activation_width(model: ModelSpec) -> int:
    """The widest MLP intermediate one token has in flight (an MoE token: its routed and shared experts)."""
    if not model.is_moe:
        return model.intermediate_size
    experts = (model.experts_per_token + model.shared_experts) * model.moe_intermediate_size
    return max(experts, model.intermediate_size if model.dense_layers else 0)


def _clip(a, low: int, high: int):
    return np.clip(a, low, high) if isinstance(a, np.ndarray) else min(max(a, low), high)


def micro_batches(num_requests, pp: int):
    """Micro-batches a PP step's batch is cut into: pp (vLLM keeps pp batches in flight), fewer when fewer
    requests run (a request is never split); one for a stretch's steps after every request finished."""
    return _clip(num_requests, 1, pp)
