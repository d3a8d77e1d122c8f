"""Accelerator specifications for the analytic (roofline) cost model, and the node each one comes in.

Device figures are vendor datasheet values: dense (no sparsity) BF16/FP16 tensor throughput, HBM/GDDR bandwidth,
device memory, and the host link (PCIe or NVLink-C2C) bandwidth one direction, used for swap transfers.

Node figures (what tensor and pipeline parallelism cost, `sim.gpu.laws`): GPUs per node, the GPU-to-GPU link
bandwidth per GPU one direction, whether the switch reduces in the network (NVLink SHARP, "NVLS"), and the per-GPU
network bandwidth between nodes. Latencies and achieved fractions of these bandwidths are not datasheet figures:
they are the laws' fitted constants (docs/gpu_fidelity.md). Sources:
- A100 SXM (HGX/DGX A100, 8 GPUs on NVSwitch): NVLink 3, 12 links x 25 GB/s = 300 GB/s per direction (NVIDIA A100
  datasheet: 600 GB/s bidirectional); one 200 Gb/s HDR InfiniBand adapter per GPU (DGX A100 user guide): 25 GB/s.
- H100 SXM / H200 (HGX H100/H200, 8 GPUs on third-generation NVSwitch with SHARP): NVLink 4, 18 links = 450 GB/s
  per direction (datasheets: 900 GB/s bidirectional); one 400 Gb/s ConnectX-7 per GPU (DGX H100): 50 GB/s.
- L40S, L4, A10G (no NVLink): PCIe Gen4 x16, 32 GB/s per direction (datasheets: 64 GB/s bidirectional), 8 per
  box as AWS g6e.48xlarge (L40S), g6.48xlarge (L4) and g5.48xlarge (A10G) sell them, with 400 Gb/s (g6e),
  100 Gb/s (g6) and 100 Gb/s (g5) of network per instance, shared by its 8 GPUs.
- RTX 4090: one per box (NVIDIA disabled peer-to-peer on it: no practical tensor parallelism).
- A40 (PCIe Gen4, 84 SMs, 149.7 TFLOP/s BF16 dense, 696 GB/s GDDR6, 48 GB: NVIDIA A40 datasheet); RTX PRO 6000
  Blackwell Server Edition (PCIe Gen5 x16, 64 GB/s per direction, 188 SMs, 96 GB GDDR7 at 1.792 TB/s: NVIDIA
  datasheet; BF16 dense with FP32 accumulation 503.8 TFLOP/s, a quarter of its dense FP4 rate); B200 (HGX B200:
  148 SMs, 180 GB HBM3e at 8 TB/s, 2.25 PFLOP/s BF16 dense, NVLink 5 at 900 GB/s per direction with NVLS).
SM counts (GEMM wave quantization) are from the architecture whitepapers (A100 108, H100/H200 SXM 132, A40 84,
L4 58, L40S 142, A10G 80, RTX 4090 128). Boost clocks (the element-wise law counts kernel floors and per-SM byte
rates in cycles) are the datasheet / whitepaper "boost clock": A100 SXM 1410 MHz (A100 whitepaper), H100 SXM and
H200 1980 MHz, B200 1965 MHz, A40 1740 MHz (A40 datasheet), L4 2040 MHz, L40S 2520 MHz, A10G 1710 MHz, RTX PRO
6000 Blackwell Server Edition 2617 MHz, RTX 4090 2520 MHz.

Dense FP8 tensor-core rates (what `--quantization fp8` GEMMs run at, `sim.specs.quantization`), each half the
datasheet's "with sparsity" figure: H100 SXM and H200 1979 TFLOP/s (H100 / H200 datasheets: 3,958 with sparsity),
B200 4.5 PFLOP/s (HGX B200 datasheet: 9 PFLOP/s FP8 per GPU with sparsity), L40S 733 TFLOP/s (L40S datasheet:
1,466 with sparsity), L4 242.5 TFLOP/s (L4 datasheet: 485 with sparsity), RTX 4090 330.3 TFLOP/s (Ada whitepaper,
FP8 with FP32 accumulate, the accumulation vLLM's FP8 GEMMs use; as its BF16 figure), RTX PRO 6000 Blackwell Server
Edition 1007.6 TFLOP/s (twice its BF16 rate: half of the dense FP4 rate, 4 PFLOP/s FP4 with sparsity in its
datasheet). The Ampere GPUs (A100, A40, A10G) have no FP8 tensor cores: 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.errors import UserError, short_repr

GIB = 1024**3


@dataclass(slots=True, frozen=True)
class HardwareSpec:
    name: str
    peak_flops: float  # dense FP16/BF16 FLOP/s
    hbm_bandwidth: float  # bytes/s
    memory_bytes: float
    host_link_bandwidth: float  # bytes/s, one direction (swap to and from CPU memory)
    gpus_per_node: int = 1
    interconnect: str = "none"  # the GPU-to-GPU link inside a node
    link_bandwidth: float = 0.0  # bytes/s per GPU, one direction, inside a node
    nvls: bool = False  # the switch reduces in the network (NVLink SHARP): an all-reduce moves each byte once
    internode_bandwidth: float = 0.0  # bytes/s per GPU between nodes (pipeline stages on different nodes)
    # bytes/s a local NVMe reads (a PCIe 4.0 x4 data-centre drive, ~6.5 GB/s sequential): the disk prefix tier
    disk_bandwidth: float = 6.5e9
    sm_count: int = 0  # streaming multiprocessors (GEMM wave quantization); datasheet / whitepaper figure
    clock_hz: float = 0.0  # boost clock (element-wise floors and per-SM rates in cycles); 0: unknown
    # most threads resident on one SM (CUDA C++ Programming Guide, table of compute capabilities: 2048 on
    # compute capability 8.0, 9.0, 10.0; 1536 on 8.6, 8.9, 12.0): the element-wise cores' width; 0: unknown
    threads_per_sm: int = 0
    fp8_flops: float = 0.0  # dense FP8 tensor-core FLOP/s; 0: no FP8 tensor cores (Ampere)


def _nvlink(name, flops, hbm, memory, host, link, nvls, internode, sms, clock, threads=2048, fp8=0.0) -> HardwareSpec:
    return HardwareSpec(name, flops, hbm, memory, host, 8, "nvlink", link, nvls, internode, sm_count=sms,
                        clock_hz=clock, threads_per_sm=threads, fp8_flops=fp8)


def _pcie(name, flops, hbm, memory, host, internode, sms, clock, link=32e9, kind="pcie4",
          threads=1536, fp8=0.0) -> HardwareSpec:
    # every PCIe card listed is compute capability 8.6 (A40, A10G), 8.9 (L4, L40S) or 12.0 (RTX PRO 6000)
    return HardwareSpec(name, flops, hbm, memory, host, 8, kind, link, False, internode, sm_count=sms,
                        clock_hz=clock, threads_per_sm=threads, fp8_flops=fp8)


HARDWARE: dict[str, HardwareSpec] = {spec.name: spec for spec in (
    _nvlink("a100-40gb", 312e12, 1.555e12, 40 * GIB, 25e9, 300e9, False, 25e9, 108, 1.41e9),
    _nvlink("a100-80gb", 312e12, 2.039e12, 80 * GIB, 25e9, 300e9, False, 25e9, 108, 1.41e9),
    _nvlink("h100-sxm", 989e12, 3.35e12, 80 * GIB, 50e9, 450e9, True, 50e9, 132, 1.98e9, fp8=1979e12),
    _nvlink("h200", 989e12, 4.8e12, 141e9, 50e9, 450e9, True, 50e9, 132, 1.98e9, fp8=1979e12),
    _nvlink("b200", 2.25e15, 8.0e12, 180e9, 50e9, 900e9, True, 50e9, 148, 1.965e9, fp8=4.5e15),
    _pcie("a40", 149.7e12, 0.696e12, 48 * GIB, 25e9, 100e9 / 8 / 8, 84, 1.74e9),
    _pcie("l4", 121e12, 0.3e12, 24 * GIB, 25e9, 100e9 / 8 / 8, 58, 2.04e9, fp8=242.5e12),
    _pcie("l40s", 362e12, 0.864e12, 48 * GIB, 25e9, 400e9 / 8 / 8, 142, 2.52e9, fp8=733e12),
    _pcie("a10g", 125e12, 0.6e12, 24 * GIB, 25e9, 100e9 / 8 / 8, 80, 1.71e9),
    _pcie("rtx-pro-6000", 503.8e12, 1.792e12, 96e9, 50e9, 400e9 / 8 / 8, 188, 2.617e9, link=64e9,
          kind="pcie5", fp8=1007.6e12),
    HardwareSpec("rtx-4090", 165e12, 1.008e12, 24 * GIB, 25e9, sm_count=128, clock_hz=2.52e9,
                 threads_per_sm=1536, fp8_flops=330.3e12),
)}


def hardware_names() -> list[str]:
    """Every name --hardware takes: the specs above, then the devices with shipped calibrated profiles."""
    from kvplan.sim.specs.profiles import PROFILED_DEVICES

    return [*sorted(HARDWARE), *PROFILED_DEVICES]


def get_hardware(name: str) -> HardwareSpec:
    spec = HARDWARE.get(name)
    if spec is None:
        from kvplan.engine.core.names import did_you_mean

        raise UserError(f"--hardware: unknown hardware {short_repr(name)}; {did_you_mean(name, hardware_names())}"
                        f"allowed: {', '.join(sorted(HARDWARE))}, or cpu-local (this machine, through a shipped "
                        "calibrated profile)")
    return spec
