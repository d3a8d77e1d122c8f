"""Peak HBM bandwidth of common GPUs, for reporting achieved bandwidth as a fraction of the device's peak.

Vendor datasheet figures in GB/s (10^9 bytes/s). CUDA device names are matched by substring, first match
wins, so the more specific names come first ("GH200" before "H200", "L40S" before "L4").
"""

from __future__ import annotations

from kvplan.errors import UserError

PEAK_HBM_GBPS: tuple[tuple[str, float], ...] = (
    ("GH200", 4000.0),
    ("H200", 4800.0),
    ("B200", 8000.0),
    ("H100 NVL", 3900.0),
    ("H100 PCIe", 2000.0),
    ("H100", 3350.0),
    ("H800", 3350.0),
    ("A100-SXM4-80GB", 2039.0),
    ("A100 80GB PCIe", 1935.0),
    ("A100", 1555.0),
    ("L40S", 864.0),
    ("L40", 864.0),
    ("L4", 300.0),
    ("A10G", 600.0),
    ("A10", 600.0),
    ("RTX 4090", 1008.0),
    ("RTX 3090", 936.0),
)


def peak_gbps(device_name: str, override: float | None = None) -> float | None:
    """Peak bandwidth for `device_name`, or `override` when given; None for a device not in the table."""
    if override is not None:
        if override <= 0:
            raise UserError(f"--peak-gbps: {override} must be positive")
        return override
    return next((gbps for key, gbps in PEAK_HBM_GBPS if key in device_name), None)
