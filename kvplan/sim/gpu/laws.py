"""The transferable per-op laws: one GPU op's time from datasheet numbers (`HardwareSpec`: peak dense BF16 FLOP/s,
HBM bandwidth, SM count, the GPU-to-GPU link and the network) and a small set of fitted, shape-aware constants
(`GpuLaws`, fitted on the GPUs that have Vidur profiles by `sim.gpu.fit`, shipped in sim/profiles/gpu_laws.json).

- GEMM (M rows of activations times a K × N weight): floor + max(quantized FLOPs / (peak × e_c), bytes /
  (HBM × e_m)), peak the dense BF16 rate, or the FP8 rate for an fp8 (W8A8) model's layer GEMMs. The FLOPs are
  counted in whole output tiles (tile quantization: M rounded up to `tile_m` rows) and, with `waves`, in whole
  waves of tiles over the SMs (wave quantization: ceil(tiles / SMs) × SMs tiles of tile_m × tile_n); the bytes are
  the weight read once plus the activations in and out (the roofline's arithmetic intensity). The floor is a fixed
  kernel time (a few µs: launch-to-finish of the smallest GEMM).
- element-wise op (norm, RoPE, activation, residual add, embedding gather, KV write) moving B bytes:
  c_op / clock + B × ((1 / (HBM × η))^p + (1 / (W × clock × r_op))^p)^(1/p). A kernel floor of c_op cycles;
  two per-byte limits combined as a p-norm (p = 1 adds them, p → ∞ takes the slower): the memory system's (a
  fraction η of the datasheet bandwidth) and the cores' (r_op bytes per clock cycle per SM, W = the SM count;
  for the ops in `elementwise_whole_gpu`, whose measured rate follows the clock but not the SM count, r_op per
  cycle for the whole GPU, W = 1; with `elementwise_per_warp`, r_op per cycle per resident warp, W = SMs ×
  threads per SM / 32: a latency-bound kernel's bytes in flight scale with the threads an SM keeps resident,
  2048 on an A100, 1536 on an A40). An op with no r_op (the residual add: no reduction, no trigonometry) is
  bandwidth-bound alone. Cycles, not seconds or bytes/s per SM, because the A100 and the A40 (1410 vs 1740 MHz,
  108 vs 84 SMs) agree on them (docs/gpu_fidelity.md); the law is linear in B, so a step prices it as a floor
  plus a per-byte rate (`elementwise_floor`, `elementwise_rate`).
- all-reduce of S bytes over n GPUs: α + β (n − 1) + S × f(n) / (η × link), f = 2 (n − 1) / n for a ring, 1 with
  NVLink SHARP (`HardwareSpec.nvls`: each byte goes up to the switch once and comes down reduced once).
- send/recv of S bytes: α + S / (η × link) inside a node, α_net + S / (η_net × network) between nodes.

Every function takes plain numbers or int64 arrays (a stretch of steps) and applies the same IEEE operations to
either, so a step is priced bit-identically both ways.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from kvplan.errors import UserError
from kvplan.shipped import shipped_dir
from kvplan.sim.cost.features import step_max
from kvplan.sim.specs.hardware import HardwareSpec

ELEMENTWISE_LAW_OPS = ("emb", "input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")
GPU_LAWS = "gpu_laws.json"  # in the shipped sim/profiles folder (kvplan.shipped)


@dataclass(slots=True, frozen=True)
class GpuLaws:
    """The fitted constants of the per-op laws (defaults: the pure roofline, no floors, no per-SM limits)."""

    gemm_compute_efficiency: float = 1.0
    gemm_memory_efficiency: float = 1.0
    gemm_floor_s: float = 0.0
    gemm_tile_m: int = 1
    gemm_tile_n: int = 1
    gemm_waves: bool = False
    elementwise_bandwidth_efficiency: float = 1.0
    # per op (`ELEMENTWISE_LAW_OPS`): kernel floor in clock cycles, and bytes per cycle per SM (per GPU for the
    # ops in `elementwise_whole_gpu`; absent or 0: no core limit, bandwidth alone)
    elementwise_floor_cycles: dict[str, float] = field(default_factory=dict)
    elementwise_cycle_rate: dict[str, float] = field(default_factory=dict)
    elementwise_whole_gpu: tuple[str, ...] = ()
    elementwise_power: float = 1.0  # p of the p-norm that combines the two per-byte limits
    # per-SM rates counted per resident warp (W = SMs × threads per SM / 32) rather than per SM
    elementwise_per_warp: bool = False
    allreduce_latency_s: float = 0.0
    allreduce_hop_latency_s: float = 0.0
    allreduce_efficiency: float = 1.0
    p2p_latency_s: float = 0.0
    p2p_efficiency: float = 1.0
    network_latency_s: float = 0.0
    network_efficiency: float = 1.0

    def gemm_time(self, m, k: int, n: int, hw: HardwareSpec, weight_bytes: float = 2.0, act_bytes: float = 2.0,
                  peak: float | None = None, tile_m: int | None = None):
        """Seconds of an M × K by K × N GEMM (M a number or an int64 array; K, N one rank's weight). `peak`: the
        tensor-core FLOP/s it runs at (None: the dense BF16 rate; an fp8 GEMM passes `hw.fp8_flops`, priced with
        the same fitted efficiency); `tile_m`: the rows a kernel of another family pads M to (None: the fitted
        tile; Marlin's 16, `sim.specs.quantization`)."""
        tm = self.gemm_tile_m if tile_m is None else tile_m
        m_tiles = -(-m // tm)
        if self.gemm_waves and hw.sm_count > 0:
            tiles = m_tiles * -(-n // self.gemm_tile_n)
            waves = -(-tiles // hw.sm_count)
            flops = 2.0 * k * (tm * self.gemm_tile_n * hw.sm_count) * waves
        else:
            flops = 2.0 * k * n * tm * m_tiles
        moved = k * n * weight_bytes + m * ((k + n) * act_bytes)
        compute = flops / ((hw.peak_flops if peak is None else peak) * self.gemm_compute_efficiency)
        return self.gemm_floor_s + step_max(compute, moved / (hw.hbm_bandwidth * self.gemm_memory_efficiency))

    def elementwise_floor(self, op: str, hw: HardwareSpec) -> float:
        """Seconds of element-wise op `op`'s kernel floor (0 on a GPU whose clock is not known)."""
        cycles = self.elementwise_floor_cycles.get(op, 0.0)
        return cycles / hw.clock_hz if hw.clock_hz > 0 else 0.0

    def elementwise_rate(self, op: str, hw: HardwareSpec) -> float:
        """Seconds per byte of element-wise op `op`: the bandwidth limit and the core limit, p-norm combined (the
        bandwidth limit alone for an op without a core rate, or a GPU whose SM count or clock is not known)."""
        memory = 1.0 / (hw.hbm_bandwidth * self.elementwise_bandwidth_efficiency)
        rate = self.elementwise_cycle_rate.get(op, 0.0)
        if op in self.elementwise_whole_gpu:
            width = 1
        elif self.elementwise_per_warp:
            width = hw.sm_count * hw.threads_per_sm // 32
        else:
            width = hw.sm_count
        if rate <= 0 or width <= 0 or hw.clock_hz <= 0:
            return memory
        cores = 1.0 / (width * hw.clock_hz * rate)
        p = self.elementwise_power
        return (memory**p + cores**p) ** (1.0 / p)

    def elementwise_time(self, op: str, nbytes, hw: HardwareSpec):
        """Seconds of element-wise op `op` moving `nbytes` (read + written)."""
        return self.elementwise_floor(op, hw) + nbytes * self.elementwise_rate(op, hw)

    def allreduce_time(self, nbytes, n: int, hw: HardwareSpec):
        """Seconds of an all-reduce of `nbytes` over n GPUs of one node (0 for one GPU)."""
        if n == 1:
            return 0.0 * nbytes
        moved = nbytes if hw.nvls else nbytes * (2.0 * (n - 1) / n)
        latency = self.allreduce_latency_s + self.allreduce_hop_latency_s * (n - 1)
        return latency + moved / (hw.link_bandwidth * self.allreduce_efficiency)

    def all_to_all_time(self, nbytes, n: int, hw: HardwareSpec):
        """Seconds of an all-to-all in which each rank scatters `nbytes` over n ranks (the all-reduce's latency and
        link efficiency: no all-to-all is profiled)."""
        if n == 1:
            return 0.0 * nbytes
        latency = self.allreduce_latency_s + self.allreduce_hop_latency_s * (n - 1)
        return latency + nbytes * ((n - 1) / n) / (hw.link_bandwidth * self.allreduce_efficiency)

    def send_recv_time(self, nbytes, hw: HardwareSpec, across_nodes: bool):
        """Seconds to send `nbytes` to the next pipeline stage (inside the node, or over the network)."""
        if across_nodes:
            return self.network_latency_s + nbytes / (hw.internode_bandwidth * self.network_efficiency)
        return self.p2p_latency_s + nbytes / (hw.link_bandwidth * self.p2p_efficiency)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict, where: str = "gpu laws") -> GpuLaws:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise UserError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(names))}")
        whole = data.get("elementwise_whole_gpu", ())
        return cls(**{**data, "elementwise_whole_gpu": tuple(whole)})


def load_laws(path: Path | str | None = None) -> GpuLaws:
    """The shipped fitted constants (written by scripts/gpu_fidelity.py), or those of another such file."""
    path = Path(path) if path is not None else shipped_dir("sim/profiles") / GPU_LAWS
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: not a readable gpu-laws JSON file ({exc})") from None
    return GpuLaws.from_json(data["laws"], str(path))


_SHIPPED_LAWS: list[GpuLaws] = []


def shipped_laws() -> GpuLaws:
    """The shipped constants, read once per process."""
    if not _SHIPPED_LAWS:
        _SHIPPED_LAWS.append(load_laws())
    return _SHIPPED_LAWS[0]
