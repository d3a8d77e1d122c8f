"""offered_rate_rps is the load offered in the measurement window: a probe the overload check stopped early
(here in the window's first seconds) reports its configured rate, not the part of it that got simulated."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from kvplan.sim.probe import Probe, offered_rate, run_probe
from kvplan.sim.spec import SimSpec
from kvplan.traces.steady import population
from kvplan.traces.synth import synthesize

ROOT = Path(__file__).resolve().parents[2]
CHAT = yaml.safe_load((ROOT / "traces" / "samples" / "chat.yaml").read_text())


def test_an_early_stopped_probe_reports_the_rate_it_was_offered():
    pop = population(synthesize({**CHAT, "requests": 120}))
    spec = SimSpec(model="llama-3-8b", hardware="a100-40gb", enable_prefix_caching=False)
    for rate in (2.0, 48.0):  # far below and far above one A100's capacity on this workload
        info = run_probe(pop, spec, Probe(rate=rate, duration_s=300, min_requests=100), seed=1).info["probe"]
        w0, w1 = info["window_s"]
        if rate == 48.0:  # stopped a few seconds into the window: most of it never simulated
            assert info["stopped_early"] and info["stopped_s"] < w0 + 0.1 * (w1 - w0)
        else:
            assert info["verdict"] == "stable" and info["offered_rps"] == info["measured_requests"] / (w1 - w0)
        assert info["offered_rps"] == pytest.approx(rate, rel=0.1)  # 240 s of gamma arrivals: a few % of noise


def test_offered_rate_counts_the_scheduled_arrivals_in_the_window():
    arrivals = np.arange(0.0, 100.0, 0.25)  # 4 req/s for 100 s
    assert offered_rate(arrivals, 10.0, 90.0) == 4.0
    assert offered_rate(arrivals[:20], 10.0, 90.0) == 0.0  # none scheduled inside the window: none offered
