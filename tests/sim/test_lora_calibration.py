"""The measured LoRA cost (calibration.lora): the fit recovers known per-slot and per-row x rank seconds, the
profile's `lora` section round-trips and is checked in one line, and the simulator prices a LoRA step with it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from kvplan.calibration.lora import LoraSample, fit_lora
from kvplan.errors import UserError
from kvplan.sim.cost.calibrated import CalibratedCost, load_profile, save_profile
from kvplan.sim.lora import calibrated_lora_cost, lora_serving
from kvplan.sim.specs.models import get_model

PER_SLOT, PER_ROW_RANK, RANK = 2e-3, 3e-6, 8


def synthetic_samples() -> list[LoraSample]:
    samples = []
    for design, base, shapes in (("decode16", 0.05, [(16, 1), (16, 4), (8, 2), (8, 4)]),
                                 ("prefill4x96", 0.3, [(96, 1), (384, 4), (192, 2), (288, 3)])):
        for k in range(3):  # base steps of the design, a little noisy around their median
            samples.append(LoraSample(design[:6], design, 0, 0, base * (1 + 0.01 * (k - 1)), base))
        for rows, active in shapes:
            extra = PER_SLOT * active + PER_ROW_RANK * rows * RANK
            samples.append(LoraSample(design[:6], design, rows, active, base + extra, base))
    return samples


def test_the_fit_recovers_known_seconds_per_slot_and_per_row_rank():
    fit = fit_lora(synthetic_samples(), RANK)
    assert fit.seconds_per_slot == pytest.approx(PER_SLOT, rel=1e-6)
    assert fit.seconds_per_row_rank == pytest.approx(PER_ROW_RANK, rel=1e-6)
    assert fit.fit["median_abs_error_pct"] < 1e-6 and fit.fit["extra_r2"] == pytest.approx(1.0)
    assert fit.fit["designs"] == 8 and fit.fit["steps"] == 8


def test_too_few_designs_are_refused_in_one_line():
    with pytest.raises(UserError, match=r"LoRA calibration: 1 designs .* allowed: at least 3"):
        fit_lora([LoraSample("decode", "d", 4, 1, 0.06, 0.05)], RANK)


def profile(tmp_path: Path, lora: object) -> Path:
    cost = CalibratedCost({"step": 0.01, "prefill_tokens": 1e-4}, meta={"model": "tiny-llama", "block_size": 16,
                                                                         "lora": lora})
    path = tmp_path / "p.yaml"
    save_profile(cost, path)
    return path


def test_the_lora_section_round_trips_and_scales_with_the_machine(tmp_path):
    section = fit_lora(synthetic_samples(), RANK).section()
    loaded = load_profile(profile(tmp_path, section))
    assert loaded.meta["lora"] == section
    slower = loaded.scaled(2.0).meta["lora"]
    assert slower["seconds_per_slot"] == pytest.approx(2 * PER_SLOT)
    assert slower["seconds_per_row_rank"] == pytest.approx(2 * PER_ROW_RANK)


@pytest.mark.parametrize(("section", "where"), [
    ({"rank": 8, "seconds_per_slot": -1.0, "seconds_per_row_rank": 0.0}, "lora.seconds_per_slot"),
    ({"rank": 0, "seconds_per_slot": 0.0, "seconds_per_row_rank": 0.0}, "lora.rank"),
    ({"rank": 8, "seconds_per_slot": 0.0}, "lora"),
    ({"rank": 8, "seconds_per_slot": 0.0, "seconds_per_row_rank": 0.0, "extra": 1}, "lora"),
    ("fast", "lora"),
])
def test_a_bad_lora_section_is_refused_in_one_line(tmp_path, section, where):
    with pytest.raises(UserError, match=rf"p\.yaml: {where}: got .*; allowed: \{{rank:") as info:
        load_profile(profile(tmp_path, section))
    assert "\n" not in str(info.value)


def test_the_simulator_prices_a_lora_step_with_the_measured_section(tmp_path):
    section = {"rank": 8, "seconds_per_slot": PER_SLOT, "seconds_per_row_rank": PER_ROW_RANK}
    model = get_model("tiny-llama")
    measured = calibrated_lora_cost(model, 16, 1e-4, 1e9, 1e9, section)
    # by hand: 3 adapters, 40 rows at the padded max_lora_rank 16
    assert measured.step_seconds(40, 3) == pytest.approx(3 * PER_SLOT + 40 * 16 * PER_ROW_RANK)
    assert measured.step_seconds(0, 0) == 0.0
    fallback = calibrated_lora_cost(model, 16, 1e-4, 1e9, 1e9)
    assert fallback.measured is None and fallback.step_seconds(40, 3) != measured.step_seconds(40, 3)
    cost = load_profile(profile(tmp_path, section))
    # the replica's scheduler config: only its LoRA settings are read
    config = SimpleNamespace(enable_lora=True, max_loras=4, max_cpu_loras=None, max_lora_rank=16)
    serving = lora_serving(config, cost)
    assert serving is not None and serving.cost is not None
    assert serving.cost.measured == (PER_SLOT, PER_ROW_RANK)
