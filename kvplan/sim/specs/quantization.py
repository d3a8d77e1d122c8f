"""Weight quantization: the bytes each method stores per weight and how its GEMMs run, one table for both the
`quantization` setting (vLLM's `--quantization`) and a checkpoint's HF `quantization_config`.

A method quantizes the layers' linear weights (attention projections, MLP, experts; mxfp4: the routed experts
only); the embedding table and the LM head stay in the model dtype, as vLLM keeps them. Bytes per weight:
- fp8 (W8A8): 1 byte; its per-tensor or per-channel scales (DeepSeek-V3: one fp32 per 128 x 128 block, 1/4096 of
  a byte per weight) are left out. Its GEMMs run on the FP8 tensor cores (`HardwareSpec.fp8_flops`) with the
  activations quantized per token on the fly (vLLM's dynamic scaling). The GEMM law's efficiencies, fitted on
  Vidur's BF16 profiles (`sim.gpu.laws`, docs/gpu_fidelity.md), are applied to the FP8 peak unchanged: no FP8
  profile was available to fit them, so a compute-bound FP8 GEMM is priced at exactly the datasheet ratio
  (1979 / 989 on an H100) faster than a BF16 one. The activation-quantization pass is not priced on its own: the
  GEMM law counts the activations at the model dtype's width in and out, which stands for that pass's read of
  the BF16 input in place of the GEMM's 1-byte read.
- awq / gptq (4-bit, group 128, weight-only): 0.5 byte plus one fp16 scale per group of 128 (2 / 128 byte) and,
  for AWQ's asymmetric groups, a 4-bit zero point per group (0.5 / 128 byte): gptq 0.515625, awq 0.51953125
  bytes per weight (vLLM runs symmetric GPTQ through gptq_marlin, which keeps no zeros). Their GEMMs are Marlin's
  (vLLM's awq_marlin / gptq_marlin): the weights dequantized in registers and multiplied on the BF16/FP16 tensor
  cores, so the compute runs at the BF16 rate and the weight bytes at these widths. Marlin's README (Frantar and
  Alistarh 2024, github.com/IST-DASLab/marlin, "Benchmarks": an A10 at group size 128) measures the ideal speedup
  over FP16, 3.87x = 16 / 4.125 bits, the byte ratio alone, at batch sizes up to 16-32, and its ideal is the
  roofline max(bytes / bandwidth, FLOPs / peak) with the same FLOP rate as FP16: the BF16 GEMM law's own
  efficiencies therefore carry over with no extra constant (its measurement sets that constant to 1). One thing
  differs: Marlin pads the batch to 16 rows (`MARLIN_TILE_ROWS`) where the law's fitted cuBLAS tile is 128; with
  128 rows of FLOPs a one-row int4 decode would price compute bound at the BF16 rate, below the ideal speedup the
  README measures at every batch size up to 16.
- mxfp4 (gpt-oss checkpoints only; no `--quantization` spelling): the routed experts in 4-bit values with one
  8-bit scale per 32 (4.25 bits: 0.53125 bytes), weight-only.
`--quantization` on a built-in model means that model's checkpoint in the method (`awq`: its AWQ int4 checkpoint);
a model whose checkpoint declares a method keeps it, and naming another is refused, as vLLM refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvplan.engine.core.settings import QUANTIZATIONS
from kvplan.errors import UserError
from kvplan.sim.specs.arch import ModelSpec
from kvplan.sim.specs.hardware import HARDWARE, HardwareSpec

SCALE_BYTES = 2  # one fp16 scale per group (AWQ, GPTQ)
# Marlin computes the batch in blocks of 16 rows (its m16n8k16 tensor-core tiles; marlin_cuda_kernel.cu predicates
# "batchsizes that are not multiples of 16"): a decode of a few rows pays 16 rows of FLOPs, not the law's 128
MARLIN_TILE_ROWS = 16


def int_weight_bytes(bits: int, group_size: int, zero_points: bool) -> float:
    """Bytes per weight of an integer group-quantized checkpoint: the packed values, and per group of
    `group_size` an fp16 scale and (asymmetric groups) a zero point of `bits` bits; a group size of -1 (one scale
    per output channel) adds a negligible 2 bytes per row, left out."""
    per_group = SCALE_BYTES + (bits / 8 if zero_points else 0.0)
    return bits / 8 + (per_group / group_size if group_size > 0 else 0.0)


@dataclass(slots=True, frozen=True)
class Quantization:
    """One method: bytes per quantized weight, whether its GEMMs run on the FP8 tensor cores (W8A8) or dequantize
    to the model dtype (weight-only), and whether it quantizes the routed experts alone (mxfp4)."""

    name: str
    weight_bytes: float
    fp8_gemm: bool = False
    experts_only: bool = False
    tile_rows: int | None = None  # rows its GEMM kernel pads M to; None: the GEMM law's fitted tile (cuBLAS-class)


METHODS: dict[str, Quantization] = {q.name: q for q in (
    Quantization("fp8", 1.0, fp8_gemm=True),
    Quantization("awq", int_weight_bytes(4, 128, zero_points=True), tile_rows=MARLIN_TILE_ROWS),
    Quantization("gptq", int_weight_bytes(4, 128, zero_points=False), tile_rows=MARLIN_TILE_ROWS),
    Quantization("mxfp4", 0.53125, experts_only=True),
)}
assert set(QUANTIZATIONS) - {"none"} <= set(METHODS), "every --quantization choice needs its bytes here"
FP8_GPUS = tuple(name for name, hw in HARDWARE.items() if hw.fp8_flops > 0)


def with_method(model: ModelSpec, method: Quantization) -> ModelSpec:
    """`model` with its linear weights stored in `method` (the routed experts only, for mxfp4)."""
    if method.experts_only:
        return replace(model, quantization=method.name, expert_dtype_bytes=method.weight_bytes)
    return replace(model, quantization=method.name, weight_dtype_bytes=method.weight_bytes, expert_dtype_bytes=None)


def quantized(model: ModelSpec, name: str, hardware: HardwareSpec) -> ModelSpec:
    """The model as the `quantization` setting `name` runs it on `hardware`: unchanged for none or the checkpoint's
    own method; refused (one line, naming the setting) for another method than the checkpoint's, and for fp8 on
    a GPU without FP8 tensor cores."""
    if name == "none" or name == model.quantization:
        return model
    if model.quantization is not None:
        own = model.quantization if model.quantization in QUANTIZATIONS else ""
        allowed = f"none or {own}" if own else "none"
        raise UserError(f"--quantization: {name} differs from the {model.quantization} quantization of "
                        f"{model.name}'s checkpoint; allowed: {allowed} (the checkpoint's own)")
    method = METHODS[name]
    if method.fp8_gemm and hardware.fp8_flops <= 0:
        raise UserError(f"--quantization: fp8 needs FP8 tensor cores, which {hardware.name} lacks; allowed on: "
                        f"{', '.join(FP8_GPUS)}; on {hardware.name}: none, awq or gptq")
    return with_method(model, method)


def gemm_tile_rows(model: ModelSpec) -> int | None:
    """Rows the model's layer GEMM kernels pad the batch to (None: the GEMM law's fitted tile)."""
    method = METHODS.get(model.quantization or "")
    return None if method is None else method.tile_rows


def gemm_peak(model: ModelSpec, hardware: HardwareSpec) -> float:
    """FLOP/s the model's layer GEMMs run at: the FP8 tensor cores for an fp8 model on a GPU that has them, else
    the BF16 rate (weight-only kernels dequantize to it; vLLM runs an fp8 checkpoint on Ampere that way, through
    its FP8 Marlin kernel)."""
    method = METHODS.get(model.quantization or "")
    if method is not None and method.fp8_gemm and hardware.fp8_flops > 0:
        return hardware.fp8_flops
    return hardware.peak_flops
