"""Multi-LoRA in the simulator: the shared core's max_loras admission and adapter slots, the adapters' memory taken
from the KV cache, their kernels and loads priced, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest

from kvplan.errors import UserError
from kvplan.sim.lora import reserved_bytes
from kvplan.sim.run import build_cost, simulate
from kvplan.sim.spec import SimSpec
from kvplan.sim.specs.models import get_model
from kvplan.traces import Trace
from kvplan.traces.transforms import assign_adapters


def adapters_trace(arrivals, adapters, prompt=64, output=40) -> Trace:
    names = sorted({a for a in adapters if a})
    n = len(arrivals)
    trace = Trace.build(arrivals, [prompt] * n, [output] * n)
    return trace.with_columns(lora=np.array([names.index(a) + 1 if a else 0 for a in adapters], dtype=np.int64),
                              lora_names=tuple(names))


def run(trace: Trace, **kw):
    return simulate(trace, SimSpec(model="llama-3-8b", hardware="h100-sxm", entry_point="engine", **kw))


def test_a_third_adapter_waits_for_a_slot_while_base_requests_pass_it():
    # adapters a and b run; c arrives next and waits (max_loras 2); a base request behind it is admitted at once
    trace = adapters_trace([0.0, 0.001, 0.002, 0.003], ["a", "b", "c", None])
    result = run(trace, enable_lora=True, max_loras=2, max_cpu_loras=3).requests.set_index("request")
    assert result.loc[2, "first_scheduled_s"] >= min(result.loc[0, "finish_s"], result.loc[1, "finish_s"])
    assert result.loc[3, "first_scheduled_s"] < result.loc[0, "finish_s"]
    wide = run(trace, enable_lora=True, max_loras=3, max_cpu_loras=3).requests.set_index("request")
    assert wide.loc[2, "first_scheduled_s"] < wide.loc[0, "finish_s"]


def test_the_stacked_buffers_come_out_of_the_kv_cache():
    plain = build_cost(SimSpec(model="llama-3-8b", hardware="h100-sxm"))[1]
    spec = SimSpec(model="llama-3-8b", hardware="h100-sxm", enable_lora=True, max_loras=8, max_lora_rank=64)
    with_lora = build_cost(spec)[1]
    block_bytes = get_model("llama-3-8b").kv_bytes_per_token() * spec.kv_block_size
    assert plain - with_lora == pytest.approx(reserved_bytes(get_model("llama-3-8b"), 8, 64) / block_bytes, abs=1)


def test_adapter_loads_follow_the_lru_slots_and_are_priced():
    # one request at a time cycling over 3 adapters: 2 slots and a CPU cache of 2 reload from disk every time
    trace = adapters_trace([float(i) for i in range(9)], ["a", "b", "c"] * 3)
    small = run(trace, enable_lora=True, max_loras=2, max_cpu_loras=2)
    big = run(trace, enable_lora=True, max_loras=2, max_cpu_loras=3)
    assert small.info["lora"] == {"disk_loads": 9, "gpu_loads": 9}
    assert big.info["lora"] == {"disk_loads": 3, "gpu_loads": 9}
    assert small.requests["e2el_ms"].sum() > big.requests["e2el_ms"].sum()


def test_lora_rows_cost_more_than_base_rows():
    base = run(adapters_trace([0.0], [None]), enable_lora=True)
    lora = run(adapters_trace([0.0], ["a"]), enable_lora=True)
    assert lora.requests["e2el_ms"].iloc[0] > base.requests["e2el_ms"].iloc[0]


def test_adapters_across_sessions_keep_a_session_on_one_adapter():
    trace = Trace.build([0, 1, 2, 3], [10] * 4, [5] * 4, session_id=[7, 7, 8, 8])
    out = assign_adapters(trace, 50, 0.0, seed=3)
    assert out.lora[0] == out.lora[1] and out.lora[2] == out.lora[3]
    assert out.lora_names == tuple(f"lora-{i}" for i in range(1, 51))
    skewed = assign_adapters(Trace.build(list(range(4000)), [10] * 4000, [5] * 4000), 16, 1.2, seed=0)
    counts = np.bincount(skewed.lora, minlength=17)[1:]
    assert counts[0] > 3 * counts[7]  # Zipf: 8^1.2 = 12x the draws of the eighth adapter


def test_a_trace_naming_adapters_needs_enable_lora():
    with pytest.raises(UserError, match="names LoRA adapter 'a'; allowed: --enable-lora"):
        run(adapters_trace([0.0], ["a"]))
