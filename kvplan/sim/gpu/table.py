"""The measured-table predictor for a GPU that has a Vidur-format profile.

A series is one op at one shape: (op, hidden, heads, kv heads, intermediate, gated, TP) over tokens, or a
collective (op, GPU count, across nodes) over message bytes. Within a series the median time at each profiled x
is made monotone (a running maximum: more tokens never cost less) and interpolated linearly in log x / log time.
Outside the profiled x it extrapolates (`extrapolate`):
- "law": the per-op law (fitted on this GPU's rows) scaled to meet the series at its nearest end — the law's
  shape, the table's level; chosen by held-out error (docs/gpu_fidelity.md: the top 20% of each series' x
  held out and predicted from the rest);
- "loglog": the end segment's log-log slope continued (the other candidate of that comparison).
A shape the profile does not hold is priced by the law alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from kvplan.sim.gpu.fit import predict
from kvplan.sim.gpu.laws import GpuLaws, shipped_laws
from kvplan.sim.gpu.profiles import read_profiles, rows_for_hardware
from kvplan.sim.specs.hardware import HardwareSpec

SHAPE_KEY = ("op", "hidden", "heads", "kv_heads", "intermediate", "gated", "tp")
NET_KEY = ("op", "tp", "across")


def _x(rows: pd.DataFrame) -> np.ndarray:
    return np.where(rows["family"].isin(("allreduce", "send_recv")), rows["message_bytes"], rows["tokens"])


def _keys(rows: pd.DataFrame) -> list[tuple]:
    net = rows["family"].isin(("allreduce", "send_recv")).to_numpy()
    across = (rows["devices_per_node"] < rows["tp"]).to_numpy()
    shape = rows[list(SHAPE_KEY)].itertuples(index=False, name=None)
    return [("net", op, tp, bool(a)) if n else ("op", *s)
            for n, a, op, tp, s in zip(net, across, rows["op"], rows["tp"], shape, strict=True)]


@dataclass(slots=True)
class MeasuredTable:
    hardware: HardwareSpec
    laws: GpuLaws  # fitted on this GPU's own rows: the extrapolation's shape and the fallback
    extrapolate: str = "law"
    series: dict[tuple, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, rows: pd.DataFrame, hardware: HardwareSpec, laws: GpuLaws,
                  extrapolate: str = "law") -> MeasuredTable:
        """Series of the priced families' rows (attention rows are priced by `sim.gpu.attention`)."""
        rows = rows[rows["family"] != "attention"]
        frame = pd.DataFrame({"key": _keys(rows), "x": _x(rows), "t": rows["measured_ms"].to_numpy()})
        table = cls(hardware, laws, extrapolate)
        for group, part in frame.groupby("key", sort=False):
            key: tuple = group  # type: ignore[assignment]  # the groups are the tuples of `_keys`
            med = part.groupby("x")["t"].median().sort_index()
            table.series[key] = (np.log(med.index.to_numpy(float)), np.log(np.maximum.accumulate(med.to_numpy())))
        return table

    def predict(self, rows: pd.DataFrame) -> np.ndarray:
        """ms of each row: interpolated in its series, extrapolated past its ends, the law where it has none."""
        law = predict(rows, self.laws, self.hardware)
        out = law.copy()
        x = np.log(np.maximum(_x(rows).astype(float), 1.0))
        frame = pd.DataFrame({"key": _keys(rows), "i": np.arange(len(rows))})
        for group, part in frame.groupby("key", sort=False):
            key: tuple = group  # type: ignore[assignment]  # the groups are the tuples of `_keys`
            if key not in self.series:
                continue
            idx = part["i"].to_numpy()
            xs = self.series[key][0]
            ends = (self._law_at(rows.iloc[idx[:1]], xs[0]), self._law_at(rows.iloc[idx[:1]], xs[-1]))
            out[idx] = self._combine(key, x[idx], law[idx], ends)
        return out

    def op_seconds(self, key: tuple, x, law: Callable):
        """Seconds of series `key` at x (a number or an array; `law(x)`: the law's seconds, for extrapolation)."""
        xs, _ = self.series[key]
        lx = np.log(np.maximum(np.asarray(x, dtype=np.float64), 1.0))
        ends = (law(float(np.exp(xs[0]))) * 1e3, law(float(np.exp(xs[-1]))) * 1e3)
        seconds = self._combine(key, lx, np.asarray(law(x), dtype=np.float64) * 1e3, ends) * 1e-3
        return seconds if isinstance(x, np.ndarray) else float(seconds)

    def _combine(self, key: tuple, lx: np.ndarray, law_ms: np.ndarray, ends: tuple[float, float]) -> np.ndarray:
        """The series' ms at log x: interpolated inside, extrapolated outside (`extrapolate`)."""
        xs, ys = self.series[key]
        inside = np.exp(np.interp(lx, xs, ys))
        if self.extrapolate == "loglog":
            if len(xs) == 1:
                return inside
            lo_slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
            hi_slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            out = np.where(lx < xs[0], np.exp(ys[0] + lo_slope * (lx - xs[0])), inside)
            return np.where(lx > xs[-1], np.exp(ys[-1] + hi_slope * (lx - xs[-1])), out)
        out = np.where(lx < xs[0], law_ms * (np.exp(ys[0]) / ends[0]), inside)
        return np.where(lx > xs[-1], law_ms * (np.exp(ys[-1]) / ends[1]), out)

    def _law_at(self, rows: pd.DataFrame, lx: float) -> float:
        """The law's ms for the first of `rows`' shape at x = exp(lx) (the series' end)."""
        row = rows.iloc[:1].copy()
        column = "message_bytes" if row["family"].iloc[0] in ("allreduce", "send_recv") else "tokens"
        row[column] = row[column].astype(float) * 0.0 + float(np.round(np.exp(lx)))
        if column == "tokens":
            row[column] = row[column].astype(np.int64)
        return float(predict(row, self.laws, self.hardware)[0])


def load_table(path: Path | str, hardware: HardwareSpec, where: str = "gpu_profile") -> MeasuredTable:
    """The measured table of `hardware` from a Vidur-format directory (its extrapolation: the shipped laws)."""
    rows = rows_for_hardware(read_profiles(path, where), hardware.name, f"{where}: {path}")
    return MeasuredTable.from_rows(rows, hardware, shipped_laws())
