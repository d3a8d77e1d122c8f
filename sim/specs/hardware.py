"""Accelerator specifications for the analytic (roofline) cost model.

Figures are vendor datasheet values: dense (no sparsity) BF16/FP16 tensor throughput, HBM/GDDR bandwidth,
device memory, and the host link (PCIe or NVLink-C2C) bandwidth one direction, used for swap transfers.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.errors import UserError

GIB = 1024**3


@dataclass(slots=True, frozen=True)
class HardwareSpec:
    name: str
    peak_flops: float  # dense FP16/BF16 FLOP/s
    hbm_bandwidth: float  # bytes/s
    memory_bytes: float
    host_link_bandwidth: float  # bytes/s, one direction (swap to and from CPU memory)


HARDWARE: dict[str, HardwareSpec] = {spec.name: spec for spec in (
    HardwareSpec("a100-40gb", 312e12, 1.555e12, 40 * GIB, 25e9),
    HardwareSpec("a100-80gb", 312e12, 2.039e12, 80 * GIB, 25e9),
    HardwareSpec("h100-sxm", 989e12, 3.35e12, 80 * GIB, 50e9),
    HardwareSpec("h200", 989e12, 4.8e12, 141e9, 50e9),
    HardwareSpec("l4", 121e12, 0.3e12, 24 * GIB, 25e9),
    HardwareSpec("l40s", 362e12, 0.864e12, 48 * GIB, 25e9),
    HardwareSpec("a10g", 125e12, 0.6e12, 24 * GIB, 25e9),
    HardwareSpec("rtx-4090", 165e12, 1.008e12, 24 * GIB, 25e9),
)}


def get_hardware(name: str) -> HardwareSpec:
    spec = HARDWARE.get(name)
    if spec is None:
        raise UserError(f"--hardware: unknown hardware {name!r}; allowed: {', '.join(sorted(HARDWARE))}, or "
                         "cpu-local (this machine, through a shipped calibrated profile)")
    return spec
