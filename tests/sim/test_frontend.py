"""The API server in front of the engine (sim.frontend): where it sits in time, its queue, the client's and the
engine's columns side by side, and the fit of its latency from a server's /metrics (endpoint.frontend_fit)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvplan.endpoint import scrape, servers
from kvplan.endpoint.frontend_fit import engine_mean_ttft_s, fit_latency
from kvplan.errors import UserError
from kvplan.results.summary import SUMMARY_KEYS
from kvplan.sim.frontend import FrontendCost, frontend_for
from kvplan.sim.run import simulate
from kvplan.sim.spec import SimSpec
from kvplan.traces import Trace

DATA = Path(__file__).parent / "data"


def _fifo(arrival, service, latency):
    """The queue written the obvious way: one server, first come first served."""
    done, free = [], -np.inf
    for a, s in zip(arrival, service, strict=True):
        free = max(a + latency, free) + s
        done.append(free)
    return np.array(done)


def test_inbound_queue_is_one_server_first_come_first_served() -> None:
    rng = np.random.default_rng(7)
    arrival = np.sort(rng.uniform(0, 1.0, 400))
    prompts = rng.integers(1, 4000, 400)
    cost = FrontendCost(request_s=1e-3, prompt_token_s=1e-6, output_token_s=0.0, latency_s=2e-3)
    engine, background = cost.engine_arrivals(arrival, prompts, np.zeros(400))
    assert background == 0.0
    np.testing.assert_allclose(engine, _fifo(arrival, cost.inbound_s(prompts), 2e-3), rtol=0, atol=1e-12)
    assert np.all(np.diff(engine) >= 0)  # the engine sees them in the clients' order
    # near saturation (400 requests of ~3 ms each in 1 s) a queue forms: later requests wait longer
    waits = engine - arrival - 2e-3 - cost.inbound_s(prompts)
    assert waits[-50:].mean() > waits[:50].mean() > -1e-12


def test_each_replica_has_its_own_api_server() -> None:
    rng = np.random.default_rng(11)
    arrival = np.sort(rng.uniform(0, 1.0, 300))
    prompts = rng.integers(1, 4000, 300)
    cost = FrontendCost(request_s=2e-3, prompt_token_s=1e-6, output_token_s=0.0, latency_s=0.0)
    three, _ = cost.engine_arrivals(arrival, prompts, np.zeros(300), servers=3)
    by_hand = np.empty(300)
    for k in range(3):  # dealt in turn, each its own queue
        by_hand[k::3] = _fifo(arrival[k::3], cost.inbound_s(prompts[k::3]), 0.0)
    np.testing.assert_allclose(three, np.maximum.accumulate(by_hand))
    one, _ = cost.engine_arrivals(arrival, prompts, np.zeros(300))
    assert (three - arrival).mean() < (one - arrival).mean()  # 300 requests of ~4 ms in 1 s: one server queues


def test_outbound_work_slows_the_inbound_queue() -> None:
    arrival = np.linspace(0, 10, 101)
    quiet = FrontendCost(request_s=1e-3, prompt_token_s=0, output_token_s=0, latency_s=0)
    busy = FrontendCost(request_s=1e-3, prompt_token_s=0, output_token_s=1e-3, latency_s=0)
    outputs = np.full(101, 50)  # 5050 tokens over 10 s at 1 ms each: half the event loop sends tokens
    _, share = busy.engine_arrivals(arrival, np.ones(101), outputs)
    assert share == pytest.approx(0.505)
    slow = busy.engine_arrivals(arrival, np.ones(101), outputs)[0] - arrival
    fast = quiet.engine_arrivals(arrival, np.ones(101), outputs)[0] - arrival
    np.testing.assert_allclose(slow, fast / (1 - 0.505))


def _trace(n: int = 60, rate: float = 4.0) -> Trace:
    rng = np.random.default_rng(3)
    return Trace.build(np.arange(n) / rate, rng.integers(64, 900, n), rng.integers(8, 120, n))


def test_a_client_sees_the_engine_plus_the_api_server() -> None:
    trace = _trace()
    spec = SimSpec(model="llama-3-8b", hardware="h100-sxm", num_blocks=4000)
    result = simulate(trace, spec)
    table, cost = result.requests, FrontendCost()
    front = result.info["frontend"]
    assert front["constants"]["latency_s"] == cost.latency_s and 0 < front["utilization"] < 1
    # the clients' arrivals are the trace's; the engine saw each after the latency, the queue and the work
    np.testing.assert_allclose(table["arrival_s"], trace.arrival_s[table["request"]])
    lag = table["engine_arrival_s"] - table["arrival_s"]
    assert np.all(lag >= cost.latency_s + cost.inbound_s(table["prompt_tokens"].to_numpy()) - 1e-12)
    # every token is delivered the same delay after the engine emitted it
    delivery = cost.delivery_s(front["mean_batch"])
    np.testing.assert_allclose(table["first_token_s"] - table["first_token_engine_s"], delivery)
    np.testing.assert_allclose(table["finish_s"] - table["finish_engine_s"], delivery)
    added = table["ttft_ms"] - table["ttft_engine_ms"]
    np.testing.assert_allclose(added, (lag + delivery) * 1e3)
    np.testing.assert_allclose(table["e2el_ms"] - table["e2el_engine_ms"], added)
    s = result.summary
    assert set(SUMMARY_KEYS) == set(s)
    assert s["mean_ttft_ms"] - s["mean_ttft_engine_ms"] == pytest.approx(float(added.mean()))
    assert s["mean_ttft_ms"] > s["mean_ttft_engine_ms"] + cost.latency_s * 1e3


def test_engine_entry_point_reports_engine_times() -> None:
    trace = _trace()
    engine = simulate(trace, SimSpec(model="llama-3-8b", hardware="h100-sxm", num_blocks=4000,
                                     entry_point="engine"))
    assert "frontend" not in engine.info
    np.testing.assert_array_equal(engine.requests["ttft_ms"], engine.requests["ttft_engine_ms"])
    assert engine.summary["mean_e2el_ms"] == engine.summary["mean_e2el_engine_ms"]
    # the API server adds to what a client measures; a larger fitted latency adds that much more
    served = simulate(trace, SimSpec(model="llama-3-8b", hardware="h100-sxm", num_blocks=4000))
    slower = simulate(trace, SimSpec(model="llama-3-8b", hardware="h100-sxm", num_blocks=4000,
                                     api_server_latency_ms=50.0))
    assert served.summary["mean_ttft_ms"] > engine.summary["mean_ttft_ms"]
    gain = slower.summary["mean_ttft_ms"] - served.summary["mean_ttft_ms"]
    assert gain == pytest.approx((0.05 - FrontendCost().latency_s) * 1e3, rel=0.02)


def test_a_latency_needs_an_api_server() -> None:
    assert frontend_for("openai_server", 20.0) == FrontendCost(latency_s=0.02)
    assert frontend_for("openai_server") == FrontendCost()
    with pytest.raises(UserError, match="--api-server-latency-ms: 10 given with entry_point llm, which has no API"):
        frontend_for("llm", 10.0)
    assert frontend_for("engine") is None
    with pytest.raises(ValueError, match=r"FrontendCost\.latency_s: -1\.0"):
        FrontendCost(latency_s=-1.0)


def _counters(name: str) -> dict[str, float]:
    return servers.counters(servers.ADAPTERS["vllm"], scrape.parse((DATA / name).read_text()))


def test_latency_fitted_from_a_servers_histograms() -> None:
    delta = scrape.difference(_counters("vllm_metrics_before.txt"), _counters("vllm_metrics_after.txt"))
    engine, source = engine_mean_ttft_s(delta)
    assert engine == pytest.approx(0.050) and source.startswith("engine core")
    # four clients measured 70 ms on average for 500-token prompts: 20 ms of front end, less its priced work
    base = FrontendCost(request_s=1e-3, prompt_token_s=2e-6, output_token_s=0.0, latency_s=0.0)
    fit = fit_latency(np.array([65.0, 70.0, 72.0, 73.0]), np.full(4, 500), delta, base)
    assert fit is not None and fit.requests == 4
    assert fit.added_ttft_ms == pytest.approx(20.0) and fit.work_ms == pytest.approx(2.0)
    assert fit.latency_s == pytest.approx(0.018)
    # only the API server's own stamp: fitted against it
    only_api = {k: v for k, v in delta.items() if not k.startswith(("queue", "prefill"))}
    assert engine_mean_ttft_s(only_api) == (pytest.approx(0.053), "API server (time_to_first_token)")
    assert fit_latency(np.array([70.0]), np.array([500]), {}) is None


def test_host_overhead_prices_steps_and_scales() -> None:
    from kvplan.sim.gpu.host_overhead import HOST, HostOverhead

    running = np.array([1, 64, 256])
    got = HOST.engine_step_s(running, admitted=np.array([0, 2, 0]))
    np.testing.assert_allclose(got, HOST.step_s + HOST.step_per_seq_s * running + HOST.admit_per_request_s
                               * np.array([0, 2, 0]))
    assert np.all(np.diff(HOST.engine_step_s(running)) > 0)  # more sequences, more scheduler time
    slower = HOST.scaled(1.5)
    assert slower.api_output_token_s == pytest.approx(1.5 * HOST.api_output_token_s)
    assert isinstance(slower, HostOverhead)
    with pytest.raises(ValueError, match="slowdown must be > 0"):
        HOST.scaled(0.0)
    # the API server's defaults are these measured constants
    assert FrontendCost().output_token_s == HOST.api_output_token_s


def test_a_saturated_api_server_is_said() -> None:
    from kvplan.sim.frontend import saturation_note

    assert saturation_note(None) is None and saturation_note({"utilization": 0.4}) is None
    note = saturation_note({"utilization": 1.3})
    assert note is not None and "130% busy" in note and "lower bound" in note
