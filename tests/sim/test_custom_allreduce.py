"""vLLM's custom all-reduce law (sim.gpu.custom_allreduce): its definition, where the step uses it, and its
held-out error on the published points it is fitted on."""

from __future__ import annotations

import numpy as np
import pytest

from kvplan.sim.gpu import custom_allreduce as car
from kvplan.sim.gpu.laws import shipped_laws
from kvplan.sim.specs.hardware import get_hardware

H100, L40S = get_hardware("h100-sxm"), get_hardware("l40s")


def test_the_law_is_its_definition():
    law = car.CustomAllreduce(8e-6, 0.5e-6, 0.1)
    assert law.time(2**20, 4, H100) == pytest.approx(8e-6 + 3 * 0.5e-6 + 2**20 * 0.75 / (450e9 * 0.1))
    one_shot = car.CustomAllreduce(8e-6, 0.0, 0.1, one_shot=True)
    assert one_shot.time(2**20, 4, H100) == pytest.approx(8e-6 + 2**20 * 3 / (450e9 * 0.1))


def test_the_fit_recovers_a_law_it_generated():
    truth = car.CustomAllreduce(7e-6, 1e-6, 0.05)
    points = list(car.PUBLISHED)
    saved = dict(car.PUBLISHED)
    try:
        car.PUBLISHED.update({(n, s): truth.time(s, n, H100) * 1e3 for n, s in points})
        fitted = car.fit(points, H100, one_shot=False)
    finally:
        car.PUBLISHED.clear()
        car.PUBLISHED.update(saved)
    assert (fitted.latency_s, fitted.hop_latency_s, fitted.efficiency) == pytest.approx(
        (truth.latency_s, truth.hop_latency_s, truth.efficiency), rel=1e-6)


def test_held_out_error_on_the_published_points():
    """Fitted on two GPU counts, predicting the third: the form the module ships is within 8% (median)."""
    law, held = car.chosen(H100)
    errors = held[law.one_shot]
    assert float(np.median(np.abs(errors))) <= 0.08
    assert law == car.LAW


def test_the_step_takes_the_faster_on_nvlink_and_nccl_elsewhere():
    nccl = shipped_laws()
    sizes = np.array([16 * 1024, 512 * 1024, 4 * 2**20, 16 * 2**20], dtype=np.int64)
    for n in (2, 4, 8):
        base = nccl.allreduce_time(sizes, n, H100)
        step = car.step_allreduce_time(base, sizes, n, H100)
        assert (step <= base).all() and step[-1] == base[-1]  # 16 MiB is past vLLM's buffer: NCCL
        assert step[0] < base[0]  # a decode message: the custom kernel
        for i, size in enumerate(sizes):  # a single step's plain int gives the stretch's entry bit for bit
            assert car.step_allreduce_time(nccl.allreduce_time(int(size), n, H100), int(size), n, H100) == step[i]
        pcie = nccl.allreduce_time(sizes, n, L40S)
        assert (car.step_allreduce_time(pcie, sizes, n, L40S) == pcie).all()
    assert car.step_allreduce_time(0.0, 1024, 1, H100) == 0.0
