"""A simulation runs with the collector's young and middle thresholds raised, and leaves them as it found them."""

from __future__ import annotations

import gc

import pytest

from kvplan.sim.collector import MIDDLE, YOUNG
from kvplan.sim.spec import SimSpec
from tests.sim.helpers import build, random_trace


@pytest.fixture
def thresholds():
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


def _thresholds_while_running(fail: bool = False) -> list[tuple[int, int, int]]:
    cluster = build(random_trace(3, 30), SimSpec(num_blocks=64, block_size=16))
    seen: list[tuple[int, int, int]] = []

    def sample(replica) -> None:
        seen.append(gc.get_threshold())
        if fail:
            raise RuntimeError("a bug in a sample hook")

    cluster.replicas[0].on_sample = sample
    cluster.run()
    return seen


@pytest.mark.usefixtures("thresholds")
@pytest.mark.parametrize("before", [(700, 10, 10), (50_000, 5, 7), (0, 10, 10)])
def test_raised_while_a_cluster_runs_and_restored_after(before):
    gc.set_threshold(*before)
    seen = _thresholds_while_running()
    young, middle, old = before
    assert seen and set(seen) == {(young and max(young, YOUNG), max(middle, MIDDLE), old)}  # 0 (off) stays off
    assert gc.get_threshold() == before


@pytest.mark.usefixtures("thresholds")
def test_restored_when_the_run_raises():
    gc.set_threshold(700, 10, 10)
    with pytest.raises(RuntimeError, match="a bug in a sample hook"):
        _thresholds_while_running(fail=True)
    assert gc.get_threshold() == (700, 10, 10)
