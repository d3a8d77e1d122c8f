"""Published GPU attention-kernel timings, kept as data, and the attention model's error on them.

Prefill: Shah et al., "FlashAttention-3: Fast and Accurate Attention with Asynchrony and Low-precision"
(arXiv:2407.08608, NeurIPS 2024), Fig. 5, "Attention forward speed (FP16/BF16) on H100 80GB SXM5", the causal
panels (d, e, f: head dim 64, 128, 256), the FlashAttention-3 bars, TFLOP/s as labelled on each bar (read from a
text transcription of the figure). Setup stated in the paper: batch × sequence length = 16k tokens, hidden
dimension 2048 (heads = 2048 / head_dim), FLOPs counted as 4 × batch × seqlen² × heads × head_dim / 2 (causal).

    seqlen            512  1k   2k   4k   8k   16k
    head dim 64       197  265  371  420  460  473
    head dim 128      292  423  521  579  602  616
    head dim 256      286  427  537  612  628  642

Decode: microsoft/onnxruntime pull request #21414 "[CUDA] Page Attention" (2024-08-27 comment, "batch decode,
H100 SMX", nvbench), the "GPU Time" column of the page_size=16 tables, fp16 K/V, head_size 128, one layer:

    Llama-3-70B (64 query heads, 8 KV heads), 64 sequences, seq_len 32 / 64 / 128 / 256 / 512:
        15.060, 17.903, 25.363, 39.474, 61.917 µs
    Llama-3-8B  (32 query heads, 8 KV heads), 1 sequence,   seq_len 32 / 64 / 128 / 256 / 512:
        14.860, 15.405, 17.045, 20.314, 20.794 µs

Each point is priced by `AttentionCost` itself, on a one-layer model of the point's shape and the datasheet
`h100-sxm`, so `point_errors(hardware)` is the model's error on what it was fitted to (in sample) when the
hardware is h100-sxm, and a transfer check on any other spec (the times scale with its peaks). `fit_constants()`
re-derives the constants `sim.gpu.attention` carries (a weighted linear least squares: the law is linear in
1/e, K0/e, 1/eta, r/eta and the kernel floor), so a test can check that the code holds what the data gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvplan.sim.cost.features import StepFeatures
from kvplan.sim.gpu import attention
from kvplan.sim.gpu.attention import AttentionCost
from kvplan.sim.specs.arch import ModelSpec
from kvplan.sim.specs.hardware import HardwareSpec, get_hardware

FA3 = "Shah et al. 2024, FlashAttention-3 (arXiv:2407.08608), Fig. 5 causal, H100 SXM5, FA3 bars"
ORT = "microsoft/onnxruntime PR #21414, batch decode H100 SXM, page_size=16, nvbench GPU Time"
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
FA3_CAUSAL_TFLOPS: dict[int, tuple[int, ...]] = {
    64: (197, 265, 371, 420, 460, 473),
    128: (292, 423, 521, 579, 602, 616),
    256: (286, 427, 537, 612, 628, 642),
}
ORT_DECODE_US: dict[tuple[int, int, int], tuple[float, ...]] = {  # (sequences, query heads, KV heads) -> µs
    (64, 64, 8): (15.060, 17.903, 25.363, 39.474, 61.917),
    (1, 32, 8): (14.860, 15.405, 17.045, 20.314, 20.794),
}
ORT_SEQLENS = (32, 64, 128, 256, 512)
ORT_BLOCK = 16


@dataclass(frozen=True, slots=True)
class Point:
    """One published kernel timing: `batch` sequences of one layer, `chunk` new tokens each after `start` cached
    ones (prefill) or one token attending `context` (decode)."""

    kind: str  # "prefill" or "decode"
    source: str
    batch: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tokens: int  # prefill: the chunk (no prefix); decode: the context
    block_size: int
    seconds: float

    def model(self) -> ModelSpec:
        hidden = self.num_heads * self.head_dim
        return ModelSpec(f"{self.kind}-point", 1, hidden, self.num_heads, self.num_kv_heads, self.head_dim,
                         4 * hidden, 32000)

    def features(self) -> StepFeatures[int]:
        n, b = self.tokens, self.batch
        blocks = b * -(-n // self.block_size)
        if self.kind == "prefill":
            return StepFeatures(b, b * n, b * n * n, 0, 0, 0, blocks, b, 1)
        return StepFeatures(b, 0, 0, b, b * n, n, blocks, b, int(b >= 2))


def _prefill_points() -> list[Point]:
    points = []
    for dim, speeds in FA3_CAUSAL_TFLOPS.items():
        heads = 2048 // dim
        for seqlen, tflops in zip(SEQLENS, speeds, strict=True):
            batch = 16384 // seqlen
            flops = 4 * batch * seqlen * seqlen * heads * dim / 2
            points.append(Point("prefill", FA3, batch, heads, heads, dim, seqlen, ORT_BLOCK, flops / (tflops * 1e12)))
    return points


def _decode_points() -> list[Point]:
    return [Point("decode", ORT, seqs, heads, kv_heads, 128, n, ORT_BLOCK, us * 1e-6)
            for (seqs, heads, kv_heads), times in ORT_DECODE_US.items()
            for n, us in zip(ORT_SEQLENS, times, strict=True)]


PREFILL_POINTS: tuple[Point, ...] = tuple(_prefill_points())
DECODE_POINTS: tuple[Point, ...] = tuple(_decode_points())
POINTS: tuple[Point, ...] = PREFILL_POINTS + DECODE_POINTS
# The fit leaves out the one-request decodes: a lone request with 8 KV heads runs too few thread blocks to pull the
# GPU's bandwidth (a regime the law does not model); they stay in `point_errors`, where they show it.
FITTED: tuple[Point, ...] = tuple(p for p in POINTS if p.kind == "prefill" or p.batch > 1)


def predict(point: Point, hardware: HardwareSpec) -> float:
    """The model's seconds for `point` on `hardware`, with the shipped constants."""
    return float(AttentionCost(point.model(), hardware, point.block_size).time(point.features()))


def point_errors(hardware: HardwareSpec | None = None) -> list[dict]:
    """Per published point: its shape, measured and predicted seconds, and the signed error in % (predicted over
    measured, minus 1). The points were measured on an H100 SXM; another spec answers what the model would
    say there, which is a transfer question, not a validation."""
    hardware = hardware or get_hardware("h100-sxm")
    rows = []
    for p in POINTS:
        predicted = predict(p, hardware)
        rows.append({"kind": p.kind, "source": p.source, "batch": p.batch, "num_heads": p.num_heads,
                     "num_kv_heads": p.num_kv_heads, "head_dim": p.head_dim, "tokens": p.tokens,
                     "block_size": p.block_size, "measured_s": p.seconds, "predicted_s": predicted,
                     "error_pct": 100.0 * (predicted / p.seconds - 1.0)})
    return rows


def error_summary(rows: Sequence[dict]) -> dict:
    """The `attention` family's figures in the fidelity tables' form: rows, median and p90 |error| %, bias
    (mean signed error %) and median signed error %."""
    err = np.array([r["error_pct"] for r in rows])
    return {"family": "attention", "rows": int(err.size), "median_abs_err_pct": float(np.median(np.abs(err))),
            "p90_abs_err_pct": float(np.percentile(np.abs(err), 90)), "bias_pct": float(err.mean()),
            "median_err_pct": float(np.median(err))}


@dataclass(frozen=True, slots=True)
class Constants:
    prefill_law: dict[int, tuple[float, float]]
    decode_eta: float
    request_tokens: float
    kernel_s: float


def fit_constants(gather_tokens: float = attention.GATHER_TOKENS) -> Constants:
    """The constants of `sim.gpu.attention` from the FITTED published points on h100-sxm: weighted least squares
    on relative residuals. Columns: the kernel floor; per head dim 1/e and K0/e (prefill points); 1/eta and r/eta
    (decode points, the block overhead g held at `gather_tokens`). r < 0 (a request cheaper than nothing) is
    clamped to 0 and the rest refitted."""
    hw = get_hardware("h100-sxm")
    dims = sorted(FA3_CAUSAL_TFLOPS)

    def design(with_requests: bool) -> np.ndarray:
        rows = []
        for p in FITTED:
            m = p.model()
            row = np.zeros(2 + 2 * len(dims) + 1)
            row[0] = 1.0  # one layer: one kernel floor
            f = p.features()
            if p.kind == "prefill":  # compute-bound (test_attention checks which side binds)
                i = 1 + 2 * dims.index(p.head_dim)
                row[i] = m.prefill_pair_flops * (f.prefill_attention2 / 2.0) / hw.peak_flops
                row[i + 1] = m.prefill_pair_flops * f.prefill_tokens / hw.peak_flops
            else:  # bound by the KV read
                token_bytes = m.kv_bytes_per_token()
                row[-2] = token_bytes * f.blocks_touched * (p.block_size + gather_tokens) / hw.hbm_bandwidth
                row[-1] = token_bytes * f.decode_requests / hw.hbm_bandwidth if with_requests else 0.0
            rows.append(row / p.seconds)
        return np.array(rows)

    coef = np.linalg.lstsq(design(True), np.ones(len(FITTED)), rcond=None)[0]
    if coef[-1] < 0:
        coef = np.linalg.lstsq(design(False), np.ones(len(FITTED)), rcond=None)[0]
        coef[-1] = 0.0
    law = {d: (1.0 / coef[1 + 2 * i], coef[2 + 2 * i] / coef[1 + 2 * i]) for i, d in enumerate(dims)}
    return Constants(law, 1.0 / coef[-2], coef[-1] / coef[-2], coef[0])

