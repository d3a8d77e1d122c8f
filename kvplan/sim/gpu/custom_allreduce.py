"""vLLM's own all-reduce for the small messages of decode: its custom all-reduce kernel on NVLink, priced by a law
fitted on published measurements of that kernel.

vLLM reduces a TP group's hidden states with its custom all-reduce (`vllm/distributed/device_communicators/
custom_all_reduce.py`: one kernel that reads the peers' buffers over NVLink, captured in the CUDA graph) when every
GPU of the group is linked by NVLink (on PCIe only for two GPUs) and the message fits its buffer (`max_size`, 8 MiB
by default); larger messages go to NCCL. Vidur's profiles time NCCL in eager mode, where a small all-reduce costs
40-60 µs of launch and rank skew; vLLM's kernel takes 9-45 µs for the same sizes on an H100 node. A decode step's
all-reduces (batch × hidden × 2 bytes: 16 KiB to 2 MiB) are all in that regime, so pricing them with NCCL's law
would make TP decode far too slow.

The measurements (`PUBLISHED`): sgl-project/sglang pull request #2904 (2025-01-15, "optimize custom allreduce
kernel"), its table "unit test performance in H100 (without cuda graph)", rows "vllm": latency in ms of vLLM's
custom all-reduce for TP 2/4/8 at 512 B to 1 MiB. Without CUDA graphs they include a launch each: an upper bound
on the kernel inside vLLM's graphs.

The law: α + β (n − 1) + S × (n − 1) / n / (η × link): a fixed kernel time, a latency per further peer, and the
bytes each GPU reads from its peers at a fraction η of the datasheet NVLink bandwidth (`fit` chooses this form
against S × (n − 1) / (η × link), a one-shot read of every peer's whole buffer, by leave-one-GPU-count-out error).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvplan.sim.cost.features import step_min
from kvplan.sim.specs.hardware import HardwareSpec

MAX_BYTES = 8 * 1024 * 1024  # vLLM's CustomAllreduce `max_size` default: larger messages go to NCCL
SOURCE = "sgl-project/sglang PR #2904, H100 without CUDA graphs, vLLM's custom all-reduce rows"
# (tp, bytes) -> ms, as the table prints them
PUBLISHED: dict[tuple[int, int], float] = {
    (2, 512): 0.0095, (4, 512): 0.0091, (8, 512): 0.0101,
    (2, 4096): 0.0088, (4, 4096): 0.0085, (8, 4096): 0.0093,
    (2, 32768): 0.0087, (4, 32768): 0.0092, (8, 32768): 0.0118,
    (2, 262144): 0.0129, (4, 262144): 0.0206, (8, 262144): 0.0241,
    (2, 524288): 0.0177, (4, 524288): 0.0269, (8, 524288): 0.0304,
    (2, 1048576): 0.0266, (4, 1048576): 0.0402, (8, 1048576): 0.0450,
}
MEASURED_ON = "h100-sxm"


@dataclass(slots=True, frozen=True)
class CustomAllreduce:
    """The fitted constants; `one_shot`: the bytes term is S (n − 1) (every peer's buffer read whole) instead of
    S (n − 1) / n (a reduce-scatter then all-gather of shares)."""

    latency_s: float
    hop_latency_s: float
    efficiency: float
    one_shot: bool = False

    def time(self, nbytes, n: int, hw: HardwareSpec):
        """Seconds of vLLM's custom all-reduce of `nbytes` (a number or an int64 array) over n NVLink GPUs."""
        share = (n - 1) if self.one_shot else (n - 1) / n
        return self.latency_s + self.hop_latency_s * (n - 1) + nbytes * share / (hw.link_bandwidth * self.efficiency)


def applies(n: int, hw: HardwareSpec) -> bool:
    """vLLM uses its custom all-reduce on a fully NVLinked group (PCIe: two GPUs only, and not modelled here: the
    published figures are NVLink ones)."""
    return n > 1 and hw.interconnect == "nvlink"


def _design(points: list[tuple[int, int]], hw: HardwareSpec, one_shot: bool) -> np.ndarray:
    rows = [(1.0, n - 1.0, size * ((n - 1) if one_shot else (n - 1) / n) / hw.link_bandwidth) for n, size in points]
    return np.array(rows)


def fit(points: list[tuple[int, int]], hw: HardwareSpec, one_shot: bool) -> CustomAllreduce:
    """Least squares on relative error over `points` (keys of PUBLISHED) of α, β and 1/η (non-negative α, β)."""
    measured = np.array([PUBLISHED[p] * 1e-3 for p in points])
    design = _design(points, hw, one_shot) / measured[:, None]
    coef, *_ = np.linalg.lstsq(design, np.ones(len(points)), rcond=None)
    if coef[1] < 0:  # a negative per-peer latency: refit without it
        sub, *_ = np.linalg.lstsq(design[:, [0, 2]], np.ones(len(points)), rcond=None)
        coef = np.array([sub[0], 0.0, sub[1]])
    return CustomAllreduce(float(coef[0]), float(coef[1]), float(1.0 / coef[2]), one_shot)


def errors(law: CustomAllreduce, points: list[tuple[int, int]], hw: HardwareSpec) -> np.ndarray:
    """Signed relative errors (predicted / measured − 1) of `law` on `points`."""
    return np.array([law.time(size, n, hw) / (PUBLISHED[(n, size)] * 1e-3) - 1.0 for n, size in points])


def leave_one_count_out(hw: HardwareSpec, one_shot: bool) -> np.ndarray:
    """Signed errors of every point predicted by the law fitted on the other GPU counts."""
    counts = sorted({n for n, _ in PUBLISHED})
    out = []
    for held in counts:
        train = [p for p in PUBLISHED if p[0] != held]
        test = [p for p in PUBLISHED if p[0] == held]
        out.append(errors(fit(train, hw, one_shot), test, hw))
    return np.concatenate(out)


def chosen(hw: HardwareSpec) -> tuple[CustomAllreduce, dict[bool, np.ndarray]]:
    """The law fitted on every point, in the form with the smaller leave-one-GPU-count-out median |error|, and
    each form's held-out errors."""
    held = {one_shot: leave_one_count_out(hw, one_shot) for one_shot in (False, True)}
    best = min(held, key=lambda form: float(np.median(np.abs(held[form]))))
    return fit(list(PUBLISHED), hw, best), held


def _shipped() -> CustomAllreduce:
    from kvplan.sim.specs.hardware import get_hardware

    return chosen(get_hardware(MEASURED_ON))[0]


LAW = _shipped()  # fitted once on import: 18 points, a 3-column least squares


def step_allreduce_time(nccl, nbytes, n: int, hw: HardwareSpec):
    """Seconds of a TP all-reduce in a vLLM step: where vLLM can use its custom kernel (`applies`, up to
    MAX_BYTES) the faster of that kernel and `nccl` (the NCCL law's time for the same bytes, a number or an
    array), else `nccl`. The faster, not the kernel alone: vLLM's size limits per GPU count hand the larger
    messages to NCCL (or its symmetric-memory all-reduce) where those are faster, and the custom law is measured up
    to 1 MiB only, where its achieved bandwidth is still rising."""
    if not applies(n, hw):
        return nccl
    custom = step_min(LAW.time(nbytes, n, hw), nccl)
    if isinstance(nbytes, np.ndarray):
        return np.where(nbytes <= MAX_BYTES, custom, nccl)
    return custom if nbytes <= MAX_BYTES else nccl
