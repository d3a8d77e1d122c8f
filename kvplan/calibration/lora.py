"""LoRA calibration: what the live engine's adapters add to a step, measured and fitted (`kvplan calibrate
--lora-rank R`), for the profile's `lora` section that `sim.lora` prices LoRA steps with.

The engine applies LoRA in plain torch (engine.lora): in every wrapped linear layer of every layer, for each
device slot with rows in the step, a gather of those rows, two small GEMMs and an index_add_. On a CPU the per-slot
work is a fixed op overhead that dwarfs the FLOPs, so the extra step time is fitted as

    extra = seconds_per_slot × active adapters + seconds_per_row_rank × adapter rows × max_lora_rank

(non-negative least squares over the designs' median extras). The extra of a step is its time minus the median
time of the same design run with no adapter (the base model), measured in the same engine just before, so that a
drift of the machine hits both. Designs: decode batches and prefill steps (one or several prompts) with 0 to
max_loras active adapters, every row or half of the rows with an adapter.

The adapters are seeded random PEFT adapters on every linear layer (q, k, v, o, gate, up, down): the cost does not
depend on what an adapter learned. `write_adapters` also serves scripts/lora_validation.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvplan.errors import UserError

MODULES = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
DECODE_BATCHES = (4, 16)
DECODE_CONTEXT = 64
DECODE_STEPS = 6
PREFILLS = ((1, 96), (4, 32), (4, 96))  # (prompts, tokens each) scheduled together in one step


def module_shapes(model: str) -> dict[str, tuple[int, int]]:
    """(in, out) features of each targeted linear layer of `model` (its sim spec, which follows its config)."""
    from kvplan.sim.specs.models import get_model

    m = get_model(model)
    q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    return {"q_proj": (m.hidden_size, q), "k_proj": (m.hidden_size, kv), "v_proj": (m.hidden_size, kv),
            "o_proj": (q, m.hidden_size), "gate_proj": (m.hidden_size, m.intermediate_size),
            "up_proj": (m.hidden_size, m.intermediate_size), "down_proj": (m.intermediate_size, m.hidden_size)}


def write_adapters(model: str, out: Path, count: int, rank: int) -> dict[str, str]:
    """`count` seeded random rank-`rank` PEFT adapters for `model` under `out` (lora-1 .. lora-N): name -> path."""
    import torch

    from kvplan.engine.lora import write_peft_adapter
    from kvplan.sim.specs.models import get_model

    layers, shapes = get_model(model).num_layers, module_shapes(model)
    adapters = {}
    for k in range(1, count + 1):
        g = torch.Generator().manual_seed(k)
        weights = {f"model.layers.{layer}.{MODULES[name]}.{name}":
                   (torch.randn(rank, n_in, generator=g) * 0.02, torch.randn(n_out, rank, generator=g) * 0.02)
                   for layer in range(layers) for name, (n_in, n_out) in shapes.items()}
        adapters[f"lora-{k}"] = str(write_peft_adapter(out / f"lora-{k}", weights, rank=rank, alpha=2.0 * rank))
    return adapters


@dataclass(slots=True)
class LoraSample:
    """One measured step of a design: its adapter rows and distinct adapters, its time and its design's base
    (no-adapter) median time."""

    kind: str  # decode | prefill
    design: str
    rows: int
    active: int
    seconds: float
    base_seconds: float = 0.0


@dataclass(slots=True)
class LoraFit:
    rank: int
    seconds_per_slot: float
    seconds_per_row_rank: float
    fit: dict

    def extra(self, rows: np.ndarray | int, active: np.ndarray | int) -> np.ndarray | float:
        return self.seconds_per_slot * active + self.seconds_per_row_rank * rows * self.rank

    def section(self) -> dict:
        """The profile's `lora` section (sim.cost.calibrated checks it, sim.lora prices with it)."""
        return {"rank": self.rank, "seconds_per_slot": self.seconds_per_slot,
                "seconds_per_row_rank": self.seconds_per_row_rank, "fit": self.fit}


def fit_lora(samples: list[LoraSample], rank: int) -> LoraFit:
    """Fit the per-slot and per-row×rank seconds on the samples with adapters (see the module); the fit's quality
    is stated on the whole step time (base median + fitted extra against the measured step), per step kind."""
    from kvplan.sim.cost.fit import nnls

    with_lora = [s for s in samples if s.active]
    designs = sorted({(s.design, s.rows, s.active) for s in with_lora})
    if len(designs) < 3:
        raise UserError(f"LoRA calibration: {len(designs)} designs with adapters measured; allowed: at least 3 "
                        "(more --lora-slots)")
    x, y = [], []
    for design, rows, active in designs:
        group = [s for s in with_lora if (s.design, s.rows, s.active) == (design, rows, active)]
        x.append((active, rows * rank))
        y.append(float(np.median([s.seconds - s.base_seconds for s in group])))
    coef = nnls(np.array(x, dtype=np.float64), np.array(y))
    result = LoraFit(rank, float(coef[0]), float(coef[1]), {})
    measured = np.array([s.seconds for s in with_lora])
    rows_ = np.array([s.rows for s in with_lora])
    active_ = np.array([s.active for s in with_lora])
    base = np.array([s.base_seconds for s in with_lora])
    predicted = base + result.extra(rows_, active_)
    signed = (predicted - measured) / measured * 100
    error = np.abs(signed)
    extra_measured = np.array(y)
    extra_predicted = np.array(x, dtype=np.float64) @ coef
    spread = float(np.sum((extra_measured - extra_measured.mean()) ** 2))
    r2 = 1.0 - float(np.sum((extra_measured - extra_predicted) ** 2)) / spread if spread > 0 else 0.0
    result.fit = {"steps": len(with_lora), "base_steps": len(samples) - len(with_lora), "designs": len(designs),
                  "extra_r2": round(r2, 5),  # of the designs' median extras
                  # the step time (base median + fitted extra) against each measured LoRA step
                  "median_abs_error_pct": round(float(np.median(error)), 3),
                  "p90_abs_error_pct": round(float(np.percentile(error, 90)), 3),
                  "bias_pct": round(float(np.median(signed)), 3),
                  **{f"{kind}_median_abs_error_pct": round(float(np.median(error[mask])), 3)
                     for kind in ("decode", "prefill")
                     if (mask := np.array([s.kind == kind for s in with_lora])).any()},
                  "lora_share_pct": round(float(np.median((measured - base) / measured * 100)), 2),
                  "method": "non-negative least squares of the designs' median extra step time (against the same "
                            "design without adapters) on active adapters and adapter rows x rank"}
    return result


class LoraDriver:
    """Runs the designs on an engine with adapters lora-1..lora-N loaded (see the module), timing each step."""

    def __init__(self, llm, adapters: int, seed: int, temperature: float) -> None:
        self.llm, self.adapters, self.temperature = llm, adapters, temperature
        self.rng = np.random.default_rng(seed)
        self.samples: list[LoraSample] = []

    def _add(self, count: int, tokens: int, max_tokens: int, active: int, half: bool) -> None:
        from kvplan.engine.sampling import SamplingParams

        vocab = self.llm.loaded.vocab_size
        for i in range(count):
            lora = None if not active or (half and i % 2) else f"lora-{(i // (2 if half else 1)) % active + 1}"
            params = SamplingParams(temperature=self.temperature, max_tokens=max_tokens, ignore_eos=True,
                                    seed=int(self.rng.integers(1 << 30)))
            self.llm.add_request(self.rng.integers(0, vocab, size=tokens).tolist(), params, lora=lora)

    def _step(self, kind: str, design: str, record: bool) -> None:
        from kvplan.sim.lora import lora_rows

        start = time.perf_counter()
        self.llm.step()
        seconds = time.perf_counter() - start
        if record:
            rows, active = lora_rows(self.llm.last_step.output)
            self.samples.append(LoraSample(kind, design, rows, active, seconds))

    def _drain(self) -> None:
        while self.llm.has_unfinished_requests():
            self._step("", "", False)

    def decode(self, batch: int, active: int, half: bool) -> None:
        self._add(batch, DECODE_CONTEXT, DECODE_STEPS + 1, active, half)
        sched = self.llm.scheduler
        while sched.waiting or any(r.num_computed_tokens < r.prompt_len for r in sched.running):
            self._step("", "", False)  # the prompts: the steps below are pure decode
        for _ in range(DECODE_STEPS):
            self._step("decode", f"decode{batch}{'h' if half else ''}", True)
        self._drain()

    def prefill(self, prompts: int, tokens: int, active: int, half: bool) -> None:
        self._add(prompts, tokens, 1, active, half)
        self._step("prefill", f"prefill{prompts}x{tokens}{'h' if half else ''}", True)
        self._drain()

    def run(self, max_loras: int, repeats: int) -> list[LoraSample]:
        """Every design at 0..max_loras active adapters (all rows, and half the rows, with one), the runs of one
        design back to back, so that a drift of the machine (other processes) hits a design's base run and its
        adapter runs alike; a step's base time is the median of its design's no-adapter steps in that pass."""
        self.prefill(2, 32, min(max_loras, 2), False)  # warm-up, not kept: kernels, allocator, the adapters' slots
        self.decode(4, min(max_loras, 4), False)
        self.samples.clear()
        designs: list[tuple[Callable[..., None], tuple[int, ...]]] = [
            *((self.decode, (batch,)) for batch in DECODE_BATCHES), *((self.prefill, shape) for shape in PREFILLS)]
        kept: list[LoraSample] = []
        for _ in range(repeats):
            for run, shape in designs:
                for active in range(max_loras + 1):
                    for half in (False, True) if active and shape[0] > 1 else (False,):
                        run(*shape, min(active, shape[0]), half)
                base = [s.seconds for s in self.samples if not s.active]
                for s in self.samples:
                    s.base_seconds = float(np.median(base)) if base else s.seconds
                kept += self.samples
                self.samples = []
        return kept


def measure_lora(model: str, rank: int, max_loras: int, profile, *, dtype: str, block_size: int, seed: int,
                 temperature: float, repeats: int, work: Path) -> LoraFit:
    """Write max_loras adapters under `work`, run the designs on the live engine and fit. The seconds are stated
    at the speed of `profile` (a CalibratedCost): a speed probe (calibration.probe) before and after the designs
    measures how much slower the machine runs than the profile's coefficients say, and the fitted seconds are
    divided by that factor (recorded as fit.speed_factor) - a shared machine drifts, and the section must add to
    the profile's own step prices, not to another hour's."""
    from kvplan.calibration.probe import speed_probe
    from kvplan.engine.llm import LLM

    def probe():
        return speed_probe(model, profile, block_size=block_size, dtype=dtype, seed=seed, temperature=temperature)

    adapters = write_adapters(model, work, max_loras, rank)
    before = probe()
    llm = LLM(model, block_size=block_size, dtype=dtype, max_num_batched_tokens=512, seed=seed, max_model_len=1024,
              kv_cache_memory=64 << 20, enable_lora=True, max_loras=max_loras, max_cpu_loras=max_loras,
              max_lora_rank=rank, lora_modules=adapters)
    try:
        samples = LoraDriver(llm, max_loras, seed, temperature).run(max_loras, repeats)
    finally:
        llm.close()
    after = probe()
    factor = (before.measured_s + after.measured_s) / (before.predicted_s + after.predicted_s)
    fit = fit_lora(samples, rank)
    fit.seconds_per_slot /= factor
    fit.seconds_per_row_rank /= factor
    fit.fit = {**fit.fit, "speed_factor": round(factor, 4),
               "speed_factors": [round(before.factor, 4), round(after.factor, 4)]}
    return fit
