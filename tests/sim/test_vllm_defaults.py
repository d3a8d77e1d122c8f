"""vLLM's per-GPU defaults for max_num_batched_tokens / max_num_seqs (sim.vllm_defaults): the rule as vLLM's source
states it, checked against vLLM's own `EngineArgs.get_batch_defaults` (device memory and name mocked; the CPU runs
it) where vLLM is installed, and applied by the simulator when the user sets neither."""

from __future__ import annotations

import pytest

from kvplan.sim.spec import SimSpec
from kvplan.sim.specs.hardware import GIB, HARDWARE
from kvplan.sim.vllm_defaults import ENTRY_POINTS, explain, table_defaults, vllm_batch_defaults

# (memory bytes as the platform reports it, device name): an 80 GB H100, a 24 GB L4, an 80 GB A100 (excluded by
# name), a 180 GB B200, a 141 GB H200
DEVICES = [(79.2 * GIB, "NVIDIA H100 80GB HBM3"), (22.0 * GIB, "NVIDIA L4"), (79.2 * GIB, "NVIDIA A100-SXM4-80GB"),
           (178.4 * GIB, "NVIDIA B200"), (139.8 * GIB, "NVIDIA H200")]


@pytest.mark.parametrize(("entry", "memory", "name", "tokens", "seqs"), [
    # vLLM 0.34 arg_utils.get_batch_defaults, read by hand: the two memory classes of the issue
    ("openai_server", 79.2 * GIB, "NVIDIA H100 80GB HBM3", 8192, 1024),
    ("openai_server", 22.0 * GIB, "NVIDIA L4", 2048, 256),
    ("llm", 79.2 * GIB, "NVIDIA H100 80GB HBM3", 16384, 1024),
    ("llm", 22.0 * GIB, "NVIDIA L4", 8192, 256),
    ("openai_server", 79.2 * GIB, "NVIDIA A100-SXM4-80GB", 2048, 256),
    ("openai_server", 178.4 * GIB, "NVIDIA B200", 16384, 1024),
    ("engine", 79.2 * GIB, "NVIDIA H100 80GB HBM3", 2048, 128),
])
def test_table_as_vllm_source_states_it(entry, memory, name, tokens, seqs) -> None:
    got = table_defaults(memory, name, entry)
    assert (got.max_num_batched_tokens, got.max_num_seqs) == (tokens, seqs)


def test_adjustments_for_unset_values() -> None:
    # without chunked prefill a prompt must fit one step: the budget rises to max_model_len
    off = vllm_batch_defaults(22 * GIB, "l4", "openai_server", max_model_len=8192, enable_chunked_prefill=False)
    assert off.max_num_batched_tokens == 8192
    # never more than max_num_seqs x max_model_len, and max_num_seqs never above the budget
    tiny = vllm_batch_defaults(22 * GIB, "l4", "openai_server", max_model_len=4, max_num_seqs=100)
    assert (tiny.max_num_batched_tokens, tiny.max_num_seqs) == (400, 100)
    capped = vllm_batch_defaults(22 * GIB, "l4", "openai_server", max_model_len=4096, max_num_batched_tokens=64)
    assert (capped.max_num_batched_tokens, capped.max_num_seqs) == (64, 64)
    # a value the user gave is kept as given
    given = vllm_batch_defaults(22 * GIB, "l4", "openai_server", max_model_len=8192, enable_chunked_prefill=False,
                                max_num_batched_tokens=512)
    assert given.max_num_batched_tokens == 512


class _Platform:
    """What `get_batch_defaults` asks of vLLM's `current_platform`, answered for one GPU."""

    def __init__(self, memory: float, name: str) -> None:
        self.memory, self.name = memory, name

    def get_device_total_memory(self, device_id: int = 0) -> int:
        return int(self.memory)

    def get_device_name(self, device_id: int = 0) -> str:
        return self.name

    def is_device_capability(self, capability, device_id: int = 0) -> bool:
        return False

    def is_tpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return False


@pytest.mark.parametrize(("memory", "name"), DEVICES)
def test_matches_vllms_own_function(monkeypatch, memory, name) -> None:
    arg_utils = pytest.importorskip("vllm.engine.arg_utils", reason="vLLM is not installed here (scripts/"
                                    "vllm_parity.sh builds an environment with it)")
    from vllm.usage.usage_lib import UsageContext

    monkeypatch.setattr(arg_utils, "current_platform", _Platform(memory, name))
    tokens, seqs = arg_utils.EngineArgs.get_batch_defaults(world_size=1)
    for entry, context in ENTRY_POINTS.items():
        ours = table_defaults(memory, name, entry)
        want_tokens = tokens.get(UsageContext[context], arg_utils.SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS)
        want_seqs = seqs.get(UsageContext[context], arg_utils.SchedulerConfig.DEFAULT_MAX_NUM_SEQS)
        assert (ours.max_num_batched_tokens, ours.max_num_seqs) == (want_tokens, want_seqs), (name, entry)


def test_simulator_uses_them_unless_set() -> None:
    h100, l4 = SimSpec(hardware="h100-sxm"), SimSpec(hardware="l4")
    assert (h100.max_num_batched_tokens, h100.max_num_seqs) == (8192, 1024)
    assert (l4.max_num_batched_tokens, l4.max_num_seqs) == (2048, 256)
    assert h100.filled_defaults == ("max_num_batched_tokens", "max_num_seqs", "block_size", "gpu_memory_utilization")
    assert (h100.block_size, h100.gpu_memory_utilization) == (64, 1.0)  # vLLM 0.34's
    old = SimSpec(hardware="h100-sxm", vllm_version="0.33")
    assert (old.block_size, old.gpu_memory_utilization) == (16, 0.92)
    mixed = SimSpec(hardware="h100-sxm", max_num_seqs=64, block_size=32, gpu_memory_utilization=0.8)
    assert (mixed.max_num_batched_tokens, mixed.max_num_seqs, mixed.filled_defaults) == (
        8192, 64, ("max_num_batched_tokens",))
    offline = SimSpec(hardware="h100-sxm", entry_point="llm")
    assert offline.max_num_batched_tokens == 16384
    # a profiled CPU is kvplan's own engine: its registry defaults, nothing said about vLLM
    cpu = SimSpec(hardware="cpu-local", model="smollm2-135m")
    assert (cpu.max_num_batched_tokens, cpu.max_num_seqs, cpu.block_size, cpu.gpu_memory_utilization) == (
        2048, 256, 16, 0.9)
    assert len(explain(cpu)) == 1 and explain(cpu)[0].startswith("vLLM 0.34.0 followed")  # only the release


def test_explain_names_the_rule_and_the_source() -> None:
    release, batch, block, memory = explain(SimSpec(hardware="h100-sxm"))
    assert "vLLM 0.34.0" in release and "8192" in batch and "1024" in batch and ">= 70 GiB" in batch
    assert "arg_utils.py" in batch and "get_batch_defaults" in batch
    assert block.startswith("block_size 64: vLLM 0.34.0's default") and "gpu_memory_utilization 1" in memory
    assert "2048" in explain(SimSpec(hardware="l4"))[1]
    assert len(explain(SimSpec(hardware="h100-sxm", max_num_batched_tokens=2048, max_num_seqs=256, block_size=16,
                               gpu_memory_utilization=0.9))) == 1


def test_every_datasheet_gpu_has_a_tier() -> None:
    for hardware in HARDWARE.values():
        got = table_defaults(hardware.memory_bytes, hardware.name, "openai_server")
        assert got.max_num_batched_tokens in (2048, 8192, 16384)


def test_budget_follows_max_model_len_without_chunked_prefill() -> None:
    from kvplan.engine.core.config import SchedulerConfig
    from kvplan.sim.run import batch_settings

    spec = SimSpec(hardware="l4", enable_chunked_prefill=False)
    assert batch_settings(spec, 6000) == {"max_num_batched_tokens": 6000, "max_num_seqs": 256}
    assert batch_settings(SimSpec(hardware="l4", enable_chunked_prefill=False, max_num_batched_tokens=512,
                                  max_num_seqs=8), 6000) == {}
    assert SchedulerConfig(**batch_settings(spec, 6000)).max_num_batched_tokens == 6000


def test_run_explain_says_which_values_are_vllms(capsys, tmp_path) -> None:
    import json

    from kvplan.cli import main

    path = tmp_path / "gpus.yaml"  # an A100-40GB (< 70 GiB) and an H100 (80 GiB), prefix caching on and off
    path.write_text("name: gpus\nworkload: {trace: sample:chat}\nsweep: {grid: {hardware: [a100-40gb, h100-sxm], "
                    "engine.enable_prefix_caching: [true, false]}}\n")
    assert main(["run", str(path), "--explain", "--json"]) == 0
    derived = json.loads(capsys.readouterr().out)["derived"]
    # one line for each GPU's defaults, naming its points
    assert any(line.startswith("points 0, 1: max_num_batched_tokens 2048 and max_num_seqs 256") for line in derived)
    assert any(line.startswith("points 2, 3: max_num_batched_tokens 8192 and max_num_seqs 1024") for line in derived)
    assert any(line.startswith("entry_point openai_server: latencies as a client") for line in derived)
