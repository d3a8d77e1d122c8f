"""Pricing tidy profile rows with the per-op laws, and fitting the laws' constants on them.

`predict(rows, laws, hw)` gives each row's law time in ms (rows of one GPU). The fits minimise a log error (so a
10% miss on a 5 µs norm weighs as much as one on a 50 ms GEMM): its mean square, or with `l1` its mean absolute
value (the median's estimator: a few rows far off, such as small all-reduces that include the ranks' launch skew,
pull it less), with a Nelder-Mead search in log parameter space (numpy only: neither scipy nor scikit-learn is
installed in the project's environment); discrete choices (GEMM tiles, wave quantization, which element-wise
ops have a core limit or a whole-GPU rate, the all-reduce's hop term and loss) are made by the caller on
held-out error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import pandas as pd

from kvplan.sim.gpu.laws import ELEMENTWISE_LAW_OPS, GpuLaws
from kvplan.sim.gpu.profiles import GEMM_OPS
from kvplan.sim.gpu.shapes import elementwise_elements, gemm_dims
from kvplan.sim.specs.hardware import HardwareSpec

LAW_FAMILIES = ("gemm", "elementwise", "allreduce", "send_recv")


def _shape(part: pd.DataFrame) -> tuple:
    ints = (part[c].to_numpy(np.int64) for c in ("hidden", "heads", "kv_heads", "intermediate"))
    return (*ints, part["gated"].to_numpy(bool), part["tp"].to_numpy(np.int64))


def prepare(rows: pd.DataFrame) -> tuple[int, list[tuple[str, np.ndarray, dict]]]:
    """The rows cut once into per-op arrays (what `predict_prepared` prices; a fit prices them thousands of times)."""
    ops = rows["op"].to_numpy()
    parts = []
    for op in np.unique(ops):
        mask = ops == op
        part = rows[mask]
        arrays: dict = {"tokens": part["tokens"].to_numpy(np.int64)}
        if op in GEMM_OPS:
            arrays["k"], arrays["n"] = gemm_dims(op, *_shape(part))
        elif op in ELEMENTWISE_LAW_OPS:
            arrays["bytes"] = 2.0 * elementwise_elements(op, *_shape(part)) * arrays["tokens"]
        elif op in ("all_reduce", "send_recv"):
            arrays["size"], arrays["gpus"] = part["message_bytes"].to_numpy(float), part["tp"].to_numpy(np.int64)
            arrays["across"] = part["devices_per_node"].to_numpy(np.int64) < arrays["gpus"]
        parts.append((str(op), np.flatnonzero(mask), arrays))
    return len(rows), parts


def predict_prepared(prepared: tuple[int, list], laws: GpuLaws, hw: HardwareSpec) -> np.ndarray:
    count, parts = prepared
    out = np.full(count, np.nan)
    for op, idx, a in parts:
        if op in GEMM_OPS:
            out[idx] = laws.gemm_time(a["tokens"], a["k"], a["n"], hw) * 1e3
        elif op in ELEMENTWISE_LAW_OPS:
            out[idx] = laws.elementwise_time(op, a["bytes"], hw) * 1e3
        elif op == "all_reduce":
            times = np.full(len(idx), np.nan)
            for g in np.unique(a["gpus"][~a["across"]]):
                sel = ~a["across"] & (a["gpus"] == g)
                times[sel] = laws.allreduce_time(a["size"][sel], int(g), hw) * 1e3
            out[idx] = times
        elif op == "send_recv":
            out[idx] = np.where(a["across"], laws.send_recv_time(a["size"], hw, True),
                                laws.send_recv_time(a["size"], hw, False)) * 1e3
    return out


def predict(rows: pd.DataFrame, laws: GpuLaws, hw: HardwareSpec) -> np.ndarray:
    """Law time in ms of each row the laws price (gemm, elementwise, one-node allreduce, send_recv); NaN for
    the others (attention rows, all-reduces across nodes)."""
    return predict_prepared(prepare(rows), laws, hw)


def nelder_mead(objective: Callable[[np.ndarray], float], x0: Sequence[float] | np.ndarray, iterations: int = 2000,
                step: float = 0.3) -> np.ndarray:
    """Minimise `objective` from `x0` (deterministic: the simplex starts at x0 and x0 + step along each axis)."""
    n = len(x0)
    simplex = np.array([x0] + [np.asarray(x0, float) + step * np.eye(n)[i] for i in range(n)], float)
    values = np.array([objective(x) for x in simplex])
    for _ in range(iterations):
        order = np.argsort(values)
        simplex, values = simplex[order], values[order]
        if values[-1] - values[0] < 1e-12:
            break
        centre = simplex[:-1].mean(axis=0)
        reflected = centre + (centre - simplex[-1])
        fr = objective(reflected)
        if fr < values[0]:
            expanded = centre + 2.0 * (centre - simplex[-1])
            fe = objective(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centre + 0.5 * (simplex[-1] - centre)
            fc = objective(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex[1:] = simplex[0] + 0.5 * (simplex[1:] - simplex[0])
                values[1:] = [objective(x) for x in simplex[1:]]
    return simplex[int(np.argmin(values))]


def _log_loss(groups: list[tuple[pd.DataFrame, HardwareSpec]], make: Callable[[np.ndarray], GpuLaws],
              l1: bool = False):
    measured = np.concatenate([np.log(rows["measured_ms"].to_numpy(float)) for rows, _ in groups])
    prepared = [(prepare(rows), hw) for rows, hw in groups]

    def loss(p: np.ndarray) -> float:
        laws = make(p)
        pred = np.concatenate([predict_prepared(prep, laws, hw) for prep, hw in prepared])
        with np.errstate(all="ignore"):
            err = np.log(pred) - measured
        if not np.all(np.isfinite(err)):
            return 1e9
        return float(np.mean(np.abs(err))) if l1 else float(np.mean(err * err))
    return loss


def fit_gemm(groups, base: GpuLaws, warm: bool = False) -> GpuLaws:
    """Compute and memory efficiency and the kernel floor, for the tiles and waves `base` chooses (`warm`: start
    the search from `base`'s values)."""
    def make(p):
        e = np.exp(p)
        return replace(base, gemm_compute_efficiency=min(float(e[0]), 1.0),
                       gemm_memory_efficiency=min(float(e[1]), 1.0),
                       gemm_floor_s=float(e[2]) * 1e-6)
    start = [base.gemm_compute_efficiency, base.gemm_memory_efficiency, base.gemm_floor_s * 1e6] if warm else \
        [0.7, 0.8, 5.0]
    best = nelder_mead(_log_loss(groups, make), np.log(start), 1500)
    return make(best)


def fit_elementwise(groups, base: GpuLaws, warm: bool = False, bandwidth_only: tuple[str, ...] = ("add",),
                    fit_power: bool = True) -> GpuLaws:
    """The bandwidth fraction, the p-norm's power (1 when not `fit_power`: the two limits add), and per op its
    floor in cycles and its core rate in bytes per cycle (none for the ops in `bandwidth_only`); which ops have a
    whole-GPU rate comes from `base`."""
    ops = ELEMENTWISE_LAW_OPS
    rated = [op for op in ops if op not in bandwidth_only]
    n = len(ops)

    def make(p):
        e = np.exp(p)
        # a fraction of the datasheet bandwidth: at most 1 (the core term takes what the bandwidth cannot)
        return replace(base, elementwise_bandwidth_efficiency=min(float(e[0]), 1.0),
                       elementwise_power=1.0 + float(e[1]) if fit_power else 1.0,
                       elementwise_floor_cycles={op: float(e[2 + i]) * 1e3 for i, op in enumerate(ops)},
                       elementwise_cycle_rate={op: float(e[2 + n + i]) for i, op in enumerate(rated)})
    if warm:
        start = [base.elementwise_bandwidth_efficiency, max(base.elementwise_power - 1.0, 0.05)] + \
            [base.elementwise_floor_cycles[op] * 1e-3 for op in ops] + \
            [base.elementwise_cycle_rate[op] for op in rated]
    else:  # a whole-GPU rate starts at an SM's rate times a typical SM count, a warp's at an SM's over 64 warps
        sm = 6.0 / 64 if base.elementwise_per_warp else 6.0
        start = [0.85, 0.6] + [5.0] * n + [300.0 if op in base.elementwise_whole_gpu else sm for op in rated]
    loss = _log_loss(groups, make)
    best = nelder_mead(loss, np.log(start), 1500 if warm else 6000, 0.1 if warm else 0.3)
    if not warm:  # a second, finer simplex from the first's best (the first stalls with 13 parameters)
        best = nelder_mead(loss, best, 3000, 0.1)
    return make(best)


def fit_allreduce(groups, base: GpuLaws, hops: bool, l1: bool = True) -> GpuLaws:
    """Latency (plus, with `hops`, a latency per further GPU) and link efficiency of the one-node all-reduce
    (`l1`: minimising the mean absolute log error)."""
    def make(p):
        e = np.exp(p)
        return replace(base, allreduce_latency_s=float(e[0]) * 1e-6,
                       allreduce_hop_latency_s=float(e[2]) * 1e-6 if hops else 0.0,
                       allreduce_efficiency=min(float(e[1]), 1.0))
    best = nelder_mead(_log_loss(groups, make, l1), np.log([20.0, 0.6, 2.0] if hops else [20.0, 0.6]), 1500)
    return make(best)


def fit_send_recv(groups, base: GpuLaws) -> GpuLaws:
    """Latency and efficiency inside a node and across nodes."""
    def make(p):
        e = np.exp(p)
        return replace(base, p2p_latency_s=float(e[0]) * 1e-6, p2p_efficiency=min(float(e[1]), 1.0),
                       network_latency_s=float(e[2]) * 1e-6, network_efficiency=min(float(e[3]), 1.0))
    best = nelder_mead(_log_loss(groups, make), np.log([8.0, 0.8, 15.0, 0.3]), 2000)
    return make(best)


def law_rows(rows: pd.DataFrame, family: str) -> pd.DataFrame:
    """The rows of `family` the laws price (all-reduce: inside one node, as tensor parallelism runs)."""
    part = rows[rows["family"] == family]
    if family == "allreduce":
        part = part[part["devices_per_node"] >= part["tp"]]
    return part
