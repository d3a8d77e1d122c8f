"""The model error every answer states: the strict reader of model_error.json, the choice of source from the
SimSpec, a calibrated profile's stored held-out figures (and an older profile's fallback), and the scaled cost
model the band's edges are simulated with."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from kvplan.errors import UserError
from kvplan.sim.cost.calibrated import load_profile, save_profile
from kvplan.sim.cost.features import FEATURE_NAMES, StepFeatures, step_features
from kvplan.sim.cost.recorded import ProfiledItem, ProfiledStep, RecordedCost
from kvplan.sim.cost.scaled import ScaledCost, scaled
from kvplan.sim.gpu import model_error as me
from kvplan.sim.run import analytic_cost
from kvplan.sim.spec import SimSpec
from kvplan.sim.specs.profiles import shipped_profile

FIXTURE = Path(__file__).parent / "data" / "model_error.json"


def with_table(hardware: str) -> SimpleNamespace:
    """A spec whose GPU is priced by a measured per-op profile (sim.gpu.table's SimSpec `gpu_profile`)."""
    return SimpleNamespace(model="llama-3-8b", hardware=hardware, cost="analytic", profile=None,
                           gpu_profile="profiles/a100")


def test_a_gpu_with_a_table_uses_it_and_any_other_the_analytic_entry():
    table = me.model_error_for(with_table("a100-40gb"), FIXTURE)
    assert (table.source, table.hardware, table.band_pct) == (me.MEASURED, "a100-40gb", (-4.0, 6.0))
    assert [f.family for f in table.families] == ["gemm", "allreduce"] and table.families[1].bias_pct is None
    unlisted = me.model_error_for(with_table("l4"), FIXTURE)  # a table the file states no error for
    assert (unlisted.source, unlisted.band_pct, unlisted.scales) == (me.MEASURED, None, None)
    other = me.model_error_for(SimSpec(hardware="h100-sxm"), FIXTURE)
    assert (other.source, other.hardware, other.band_pct) == (me.ANALYTIC, "h100-sxm", (-12.0, 15.0))
    assert me.model_error_for(SimSpec(hardware="a100-40gb"), FIXTURE).source == me.ANALYTIC  # no table given
    # a real step is the modelled one / (1 + error): a model 15% too slow means steps x 1/1.15
    assert other.scales == pytest.approx((1 / 1.15, 1 / 0.88))
    block = json.loads(json.dumps(other.to_json(), allow_nan=False))  # strict JSON
    assert block["families"][1] == {"family": "elementwise", "rows": 60, "median_abs_err_pct": 12.0,
                                    "p90_abs_err_pct": 31.0, "bias_pct": -5.0}
    line = other.one_line()
    assert "analytic, transferred" in line and "-12.0% to +15.0% (p10 to p90)" in line and "gemm 9%" in line


def test_the_shipped_file_is_the_default(monkeypatch):
    monkeypatch.setattr(me, "MODEL_ERROR_FILE", FIXTURE)
    assert me.model_error_for(with_table("a100-40gb")).source == me.MEASURED
    monkeypatch.setattr(me, "MODEL_ERROR_FILE", FIXTURE.with_name("absent.json"))
    missing = me.model_error_for(SimSpec(hardware="a100-40gb"))
    assert missing.source == me.UNKNOWN and missing.band_pct is None and missing.scales is None
    assert "absent.json" in missing.one_line()


def test_a_recorded_cost_has_no_model_in_its_steps():
    error = me.model_error_for(SimSpec(cost="recorded", profile="steps.jsonl"), FIXTURE)
    assert error.source == me.RECORDED and error.band_pct == (0.0, 0.0) and error.scales is None


def bad(doc: dict, edit) -> dict:
    doc = copy.deepcopy(doc)
    edit(doc)
    return doc


GOOD = json.loads(FIXTURE.read_text())
BAD = [
    (bad(GOOD, lambda d: d["sources"].pop("analytic")), "no \"analytic\" entry"),
    (bad(GOOD, lambda d: d.update(extra=1)), "exactly generated_by and sources"),
    (bad(GOOD, lambda d: d["sources"]["a100-40gb"].update(kind="analytic, transferred")), "a100-40gb.kind"),
    (bad(GOOD, lambda d: d["sources"]["analytic"]["families"][0].update(family="conv")), "families[0].family"),
    (bad(GOOD, lambda d: d["sources"]["analytic"]["families"].append(
        dict(GOOD["sources"]["analytic"]["families"][0]))), "families[2].family"),
    (bad(GOOD, lambda d: d["sources"]["analytic"]["families"][1].update(rows=0)), "families[1].rows"),
    (bad(GOOD, lambda d: d["sources"]["analytic"]["families"][1].update(p90_abs_err_pct=-1)), "p90_abs_err_pct"),
    (bad(GOOD, lambda d: d["sources"]["analytic"]["families"][1].pop("bias_pct")), "families[1]: keys"),
    (bad(GOOD, lambda d: d["sources"]["analytic"].update(step_band_pct=[3.0, 5.0])), "step_band_pct"),
    (bad(GOOD, lambda d: d["sources"]["analytic"].update(step_band_pct=[-120.0, 5.0])), "step_band_pct"),
    (bad(GOOD, lambda d: d["sources"]["analytic"].update(basis="")), "analytic.basis"),
]


@pytest.mark.parametrize(("doc", "where"), BAD)
def test_a_malformed_file_is_a_bug_when_shipped_and_a_user_error_when_given(tmp_path, doc, where):
    path = tmp_path / "model_error.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="a bug") as shipped:
        me.load_model_errors(path)
    assert not isinstance(shipped.value, UserError) and where in str(shipped.value)
    with pytest.raises(UserError, match=r"allowed") as given:
        me.load_model_errors(path, user_supplied=True)
    assert str(path) in str(given.value) and where in str(given.value)


def test_non_finite_numbers_are_refused(tmp_path):
    path = tmp_path / "model_error.json"
    path.write_text(FIXTURE.read_text().replace('"median_abs_err_pct": 9.0', '"median_abs_err_pct": NaN'))
    with pytest.raises(UserError, match="NaN"):
        me.load_model_errors(path, user_supplied=True)


def test_the_band_is_the_10th_to_90th_percentile_of_the_held_out_errors():
    errors = np.array([-0.5, -0.2, 0.0, 0.1, 0.25, 1.0, 0.05, -0.1, 0.3, -0.05, 0.15])  # predicted / measured - 1
    ranked = np.sort(errors)  # 11 values: the 10th percentile is the 2nd, the 90th the 10th (linear method)
    assert me.step_band_pct(errors) == pytest.approx([ranked[1] * 100, ranked[9] * 100], abs=1e-3)
    assert me.step_band_pct(np.full(9, 0.2))[0] == 0.0  # a model only ever too slow: the band still holds 0
    row = me.family_error("decode", errors)
    assert row["rows"] == 11 and row["bias_pct"] == pytest.approx(errors.mean() * 100, abs=1e-3)
    assert row["median_abs_err_pct"] == pytest.approx(np.median(np.abs(errors)) * 100, abs=1e-3)


def test_an_older_profile_states_its_held_out_p90_as_the_band():
    """cpu-local's shipped profiles predate the stored band: at most 10% of their held-out steps are off by more
    than the p90 |error| y on either side, so [-y, y] holds the 10th-90th percentile."""
    path = shipped_profile("llama-100m", "cpu-local")
    fit = load_profile(path).meta["fit"]
    assert "step_band_pct" not in fit
    error = me.model_error_for(SimSpec(model="llama-100m", hardware="cpu-local"), FIXTURE)
    y = fit["heldout_p90_abs_error_pct"]
    assert error.source == me.ENGINE_PROFILE and error.families[0].bias_pct is None
    assert error.band_pct == (-y, y)
    assert "bias not recorded" in error.basis


def priced_steps(count: int, rng: np.random.Generator, noise: float) -> list[ProfiledStep]:
    """Random prefill, decode and mixed steps whose durations are a linear price times lognormal noise."""
    steps = []
    for i in range(count):
        items = [ProfiledItem(f"p{j}", int(rng.integers(1, 300)), int(rng.integers(0, 500)), False, True)
                 for j in range(int(rng.integers(0, 3)))]
        items += [ProfiledItem(f"d{j}", 1, int(rng.integers(10, 900)), True, True)
                  for j in range(int(rng.integers(0 if items else 1, 24)))]
        f = step_features(items, 16)
        price = 2e-3 + 3e-4 * f.prefill_tokens + 1e-4 * f.decode_requests + 4e-7 * f.decode_context
        steps.append(ProfiledStep(i, 16, items, 0, 0, price * float(np.exp(rng.normal(0, noise)))))
    return steps


def test_calibration_stores_the_held_out_error_a_profile_states(tmp_path):
    from kvplan.calibration.fitting import calibrate_steps

    cal = calibrate_steps(priced_steps(400, np.random.default_rng(3), 0.1), 16, seed=1)
    fit = cal.cost.meta["fit"]
    held = (cal.predicted[cal.holdout] - cal.measured[cal.holdout]) / cal.measured[cal.holdout]
    assert fit["step_band_pct"] == me.step_band_pct(held) and fit["step_band_pct"][0] < 0 < fit["step_band_pct"][1]
    assert fit["heldout_bias_pct"] == pytest.approx(np.mean(held) * 100, abs=1e-3)
    kinds = {row["family"]: row["rows"] for row in fit["heldout_families"]}
    assert kinds["all"] == fit["heldout_steps"] == sum(v for k, v in kinds.items() if k != "all")
    path = tmp_path / "p.yaml"
    cal.cost.meta.update(model="llama-100m", device="my-box")
    save_profile(cal.cost, path)
    error = me.model_error_for(SimSpec(model="llama-100m", hardware="h100-sxm", cost="calibrated",
                                       profile=str(path)), FIXTURE)
    assert error.source == me.ENGINE_PROFILE and error.band_pct == tuple(fit["step_band_pct"])
    assert {f.family for f in error.families} == set(kinds) and "my-box" in error.basis
    doc = yaml.safe_load(path.read_text())
    doc["fit"]["heldout_families"][0]["rows"] = 0
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(UserError, match=r"p.yaml: fit.heldout_families\[0\].rows"):
        me.model_error_for(SimSpec(cost="calibrated", profile=str(path)), FIXTURE)


def features(rng: np.random.Generator, n: int) -> list[StepFeatures]:
    items = [[ProfiledItem("p", int(rng.integers(1, 500)), int(rng.integers(0, 900)), False, True),
              *(ProfiledItem(f"d{j}", 1, int(rng.integers(10, 3000)), True, True)
                for j in range(int(rng.integers(0, 30))))] for _ in range(n)]
    return [step_features(i, 16) for i in items]


def test_a_scaled_cost_multiplies_the_step_and_keeps_ints_and_arrays_identical():
    cost, _ = analytic_cost(SimSpec(hardware="h100-sxm", block_size=16))
    slow = ScaledCost(cost, 1.15)
    singles = features(np.random.default_rng(5), 12)
    stacked = StepFeatures(*(np.array([getattr(f, name) for f in singles], dtype=np.int64) for name in FEATURE_NAMES))
    one_by_one = [slow.step_times(f) for f in singles]
    assert slow.step_times(stacked).tolist() == one_by_one  # bit-identical
    assert one_by_one == [cost.step_times(f) * 1.15 for f in singles]
    assert slow.transfer_time(3, 2, 1) == cost.transfer_time(3, 2, 1)  # links are not the step model
    assert slow.hardware is cost.hardware and slow.bytes_per_block == cost.bytes_per_block
    assert scaled(cost, 1.0) is cost
    with pytest.raises(ValueError, match="recorded"):
        ScaledCost(RecordedCost([ProfiledStep(0, 16, [], 0, 0, 0.1, 0.0, 0.1)]), 1.1)
    with pytest.raises(ValueError, match="finite number > 0"):
        ScaledCost(cost, 0.0)
