"""Multi-LoRA serving in the simulator: the adapters' memory, their GEMMs in every step and their loads.

What vLLM does, and so what is priced here (the admission rule, `max_loras`, and which adapter sits in which GPU
slot are the shared core's: engine.core):

* **Memory.** vLLM allocates, for every linear layer it wraps (q, k, v, o, gate, up, down of every layer), stacked
  LoRA buffers of `max_loras` slots of `max_lora_rank` before it profiles memory, so that memory is taken from the
  KV cache whatever adapters are later loaded: `reserved_bytes`. Column-parallel layers (qkv, gate/up) keep A
  whole and shard B by output; row-parallel ones (o, down) shard A by input and keep B whole.
* **Compute.** Every step runs a shrink (x @ A^T) and an expand (@ B^T) kernel per wrapped layer over the step's
  token rows, each row with its request's adapter (Punica's SGMV, vLLM's `lora_shrink` / `lora_expand`): the
  kernels read each active adapter's A and B once and compute 2 x rows x rank x (d_in + d_out) FLOPs; they run
  at the padded `max_lora_rank` (the stacked buffers' width). A step without adapter rows runs no LoRA kernel.
  Priced with the GPU laws' fitted GEMM constants (kernel floor, compute and memory efficiency) on a GPU. On a
  calibrated profile (a measured CPU engine) with the profile's measured `lora` section when it has one
  (`kvplan calibrate --max-lora-rank`, calibration.lora): seconds_per_slot x active adapters +
  seconds_per_row_rank x adapter rows x max_lora_rank - the live engine's per-slot op overhead dominates on a CPU.
  Without it, a fallback: the profile's per-token linear cost scaled by the LoRA FLOPs against the layers' own
  FLOPs per token (which misses that overhead: ~2x too cheap for SmolLM2-135M on a 2-core CPU).
* **Loads.** An adapter the slot manager brings into a GPU slot is copied over the host link; one not in the
  CPU cache is first read from the drive. vLLM loads adapters before the step's forward pass, so the time adds to
  that step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kvplan.errors import UserError
from kvplan.sim.specs.arch import ModelSpec
from kvplan.sim.specs.hardware import HardwareSpec

if TYPE_CHECKING:
    from kvplan.engine.core.lora import LoraSlots


@dataclass(frozen=True, slots=True)
class LoraShapes:
    """One rank's LoRA matrices of one layer at rank 1: `shrink` = Σ d_in of the A matrices, `expand` = Σ d_out of
    the B matrices (elements per unit of rank), and how many shrink/expand kernel pairs a layer runs."""

    shrink: int
    expand: int
    kernels: int = 4  # qkv, o, gate_up, down (vLLM's merged wrappers)

    @classmethod
    def of(cls, model: ModelSpec, tp: int = 1) -> LoraShapes:
        if model.is_moe or model.is_mla:
            raise UserError(f"--enable-lora: {model.name} is an {'MoE' if model.is_moe else 'MLA'} model; the "
                            "simulator prices LoRA on dense attention and MLP layers; allowed: a dense model")
        h, d = model.hidden_size, model.head_dim
        q, kv, inter = model.num_heads * d // tp, model.kv_heads_per_rank(tp) * d, model.intermediate_size // tp
        mlp_in = 2 if model.gated_mlp else 1  # gate and up share the input (two A slices), or one up projection
        # A: qkv 3 slices of h; o the rank's q width; gate/up slices of h; down the rank's intermediate width
        shrink = 3 * h + q + mlp_in * h + inter
        # B: q + 2 kv outputs (the rank's heads); o and down the whole hidden; gate/up the rank's widths
        expand = q + 2 * kv + h + mlp_in * inter + h
        return cls(shrink, expand)

    def adapter_elements(self, rank: int, layers: float) -> float:
        return rank * (self.shrink + self.expand) * layers


def reserved_bytes(model: ModelSpec, max_loras: int, max_lora_rank: int, tp: int = 1) -> float:
    """The bytes on each GPU vLLM's stacked LoRA buffers take before the KV cache is sized."""
    shapes = LoraShapes.of(model, tp)
    return max_loras * shapes.adapter_elements(max_lora_rank, model.num_layers) * model.dtype_bytes


def adapter_bytes(model: ModelSpec, rank: int) -> float:
    """One adapter's weights (every layer, every rank's share together): what a load moves."""
    return LoraShapes.of(model).adapter_elements(rank, model.num_layers) * model.dtype_bytes


@dataclass(slots=True)
class LoraCost:
    """Seconds of a step's LoRA kernels and of adapter loads (see the module)."""

    model: ModelSpec
    max_lora_rank: int
    layers: float  # the busiest stage's layers
    shapes: LoraShapes
    host_link_bandwidth: float  # bytes/s
    disk_bandwidth: float
    # GPU laws: (kernel floor s, FLOP/s achieved, bytes/s achieved); None on a calibrated profile
    gpu: tuple[float, float, float] | None = None
    # calibrated: seconds per LoRA FLOP (the profile's per-token linear cost / the layers' FLOPs per token)
    seconds_per_flop: float = 0.0
    # calibrated with a measured `lora` section: (seconds per active adapter, seconds per adapter row x rank)
    measured: tuple[float, float] | None = None

    def step_seconds(self, rows: int, active: int) -> float:
        """The step's LoRA kernels: `rows` token rows with an adapter, of `active` distinct adapters."""
        if rows == 0:
            return 0.0
        r, s = self.max_lora_rank, self.shapes
        if self.measured is not None:
            per_slot, per_row_rank = self.measured
            return per_slot * active + per_row_rank * rows * r
        flops = 2.0 * rows * r * (s.shrink + s.expand) * self.layers
        if self.gpu is None:
            return flops * self.seconds_per_flop
        floor, flop_rate, byte_rate = self.gpu
        dtype = self.model.dtype_bytes
        moved = (active * r * (s.shrink + s.expand) + rows * (s.shrink + s.expand + 2 * s.kernels * r)) * dtype
        return self.layers * 2 * s.kernels * floor + max(flops / flop_rate, moved * self.layers / byte_rate)

    def load_seconds(self, ranks_from_cpu: list[int], ranks_from_disk: list[int]) -> float:
        """Copying adapters into GPU slots: over the host link, after a drive read for those not in the CPU
        cache."""
        host = sum(adapter_bytes(self.model, r) for r in ranks_from_cpu + ranks_from_disk)
        disk = sum(adapter_bytes(self.model, r) for r in ranks_from_disk)
        return host / self.host_link_bandwidth + disk / self.disk_bandwidth


def gpu_lora_cost(model: ModelSpec, hardware: HardwareSpec, max_lora_rank: int, tp: int, layers: float,
                  floor_s: float, compute_efficiency: float, memory_efficiency: float) -> LoraCost:
    return LoraCost(model, max_lora_rank, layers, LoraShapes.of(model, tp), hardware.host_link_bandwidth,
                    hardware.disk_bandwidth,
                    (floor_s, hardware.peak_flops * compute_efficiency, hardware.hbm_bandwidth * memory_efficiency))


def calibrated_lora_cost(model: ModelSpec, max_lora_rank: int, token_seconds: float, host_link_bandwidth: float,
                         disk_bandwidth: float, measured: dict | None = None) -> LoraCost:
    """On a measured CPU engine: the profile's measured `lora` section when given (per active adapter and per
    adapter row x rank, see the module); else the fallback, a LoRA FLOP costing what a FLOP of the layers' own
    GEMMs does (the profile's per-token linear cost over the 2 FLOPs per layer GEMM parameter a token costs)."""
    per_token = 2.0 * model.layer_matmul_params
    return LoraCost(model, max_lora_rank, model.num_layers, LoraShapes.of(model), host_link_bandwidth,
                    disk_bandwidth, None, token_seconds / per_token,
                    None if measured is None else (float(measured["seconds_per_slot"]),
                                                   float(measured["seconds_per_row_rank"])))


class LoraServing:
    """One replica's adapters: the core's slot manager (which adapters a step makes resident, LRU, vLLM's) and
    the prices of its loads and kernels. `seconds(step)` is what the step's LoRA work adds to its time."""

    __slots__ = ("cost", "loads", "slots")

    def __init__(self, slots: LoraSlots, cost: LoraCost | None) -> None:
        self.slots, self.cost = slots, cost
        self.loads = {"disk": 0, "gpu": 0}  # adapters read from disk / copied into a device slot

    def seconds(self, step) -> float:
        moved = self.slots.step(step)
        self.loads["disk"] += len(moved.disk_loads)
        self.loads["gpu"] += len(moved.gpu_loads)
        cost = self.cost
        if cost is None:  # a recorded run: the measured step time holds the LoRA work
            return 0.0
        rank = cost.max_lora_rank
        total = cost.load_seconds([rank] * (len(moved.gpu_loads) - len(moved.disk_loads)),
                                  [rank] * len(moved.disk_loads)) if moved.moved else 0.0
        if moved.slots:
            total += cost.step_seconds(lora_rows(step)[0], len(moved.slots))
        return total


def lora_rows(step) -> tuple[int, int]:
    """(token rows with an adapter, distinct adapters) of a scheduled step (a `SchedulerOutput`): what its LoRA
    kernels cost, priced here and measured by `calibration.lora`."""
    rows = sum(1 for request in step.decodes if request.lora_id)
    rows += sum(item.num_new_tokens for item in step.scheduled if item.request.lora_id)
    adapters = {r.lora_id for r in step.decodes if r.lora_id} | {i.request.lora_id for i in step.scheduled
                                                                 if i.request.lora_id}
    return rows, len(adapters)


def lora_serving(config, cost) -> LoraServing | None:
    """A replica's `LoraServing` under scheduler config `config` priced by `cost` (None: LoRA off). A GPU's
    analytic cost prices the kernels with its GEMM laws' constants; a calibrated profile with its measured `lora`
    section (else, as a fallback, its per-token linear cost scaled by FLOPs) and its measured swap rate (the
    engine's host memory copies) for loads; a recorded run adds nothing."""
    if not config.enable_lora:
        return None
    from kvplan.engine.core.lora import LoraSlots, max_cpu_loras_of
    from kvplan.sim.cost.analytic import AnalyticCost
    from kvplan.sim.cost.calibrated import CalibratedCost

    slots = LoraSlots(config.max_loras, max_cpu_loras_of(config.max_loras, config.max_cpu_loras))
    rank = config.max_lora_rank
    if isinstance(cost, AnalyticCost):
        laws, model, shape = cost.resolved_laws, cost.model, cost.shape
        from kvplan.sim.specs.arch import stage_layers

        priced: LoraCost | None = gpu_lora_cost(model, cost.hardware, rank, shape.tp,
                                                stage_layers(model.num_layers, shape.pp), laws.gemm_floor_s,
                                                laws.gemm_compute_efficiency, laws.gemm_memory_efficiency)
    elif isinstance(cost, CalibratedCost):
        from kvplan.sim.specs.models import get_model

        model = get_model(str(cost.meta.get("model")))
        block_bytes = model.kv_bytes_per_token() * int(cost.meta.get("block_size", 16))
        copy_rate = block_bytes / cost.swap_seconds_per_block if cost.swap_seconds_per_block > 0 else math.inf
        measured = cost.meta.get("lora")
        priced = calibrated_lora_cost(model, rank, cost.coefficients.get("prefill_tokens", 0.0), copy_rate, copy_rate,
                                      measured if isinstance(measured, dict) else None)
    else:
        priced = None
    return LoraServing(slots, priced)


def adapter_of(trace, row: int) -> tuple[int, str]:
    """make_request's LoRA fields for a trace row (`lora_id`, `lora_name`): its adapter's id (k for
    lora_names[k - 1]; 0 the base model) and name."""
    k = 0 if trace.lora is None else int(trace.lora[row])
    return k, trace.lora_names[k - 1] if k else ""


def check_trace_adapters(trace, enable_lora: bool) -> None:
    """A trace naming adapters needs --enable-lora (vLLM refuses an unknown model name the same way)."""
    if trace.lora is None or not trace.lora_names:
        return
    named = int(np.flatnonzero(trace.lora)[0]) if np.any(trace.lora) else None
    if named is not None and not enable_lora:
        raise UserError(f"trace: {trace.reference(named)} names LoRA adapter {trace.lora_of(named)!r}; allowed: "
                        "--enable-lora (engine.enable_lora: true), or a trace without a lora column")


def lora_note(info: dict) -> str | None:
    """simulate's note line on a run's adapter loads, or None without LoRA."""
    loads = info.get("lora")
    if loads is None:
        return None
    return (f"LoRA: {loads['gpu_loads']:,} adapter loads into device slots, {loads['disk_loads']:,} of them read "
            "from disk first (not in the CPU cache)")
