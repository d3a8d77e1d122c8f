"""What one simulation is: `SimSpec`, the model, device, cost model and deployment plus every serving setting the
simulator reads, each declared once in `engine.core.settings` and checked there.

Settings vLLM derives when they are left unset (`max_num_batched_tokens`, `max_num_seqs`, `block_size`,
`gpu_memory_utilization`) are filled in on construction with what the `vllm_version` would run on this hardware
and entry point (`sim.vllm_defaults`, `engine.core.vllm_versions`); `filled_defaults` names the ones filled that
way, so that --explain and the notes can say so."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvplan.engine.core.setting_classes import SETTING, check_side, side_fields
from kvplan.engine.core.settings import SETTINGS
from kvplan.engine.core.vllm_versions import VERSIONS
from kvplan.sim.pd_spec import Disaggregation

COST_MODELS = ("analytic", "calibrated", "recorded")
# Settings left unset that take what the simulated vLLM would run: its batch defaults for the hardware and entry
# point (sim.vllm_defaults) and its release's defaults (engine.core.vllm_versions).
VLLM_FILLED = ("max_num_batched_tokens", "max_num_seqs", "block_size", "gpu_memory_utilization")


@dataclass(slots=True)
@side_fields("sim")
class SimSpec:
    """One simulation: the model, device, cost model and deployment, and every serving setting the simulator
    reads (engine.core.settings)."""

    # What a simulation is besides the serving settings: the model, the device, the cost model, the deployment and
    # the output.
    model: str = "llama-3-8b"
    hardware: str = "h100-sxm"
    cost: str = "analytic"
    profile: str | None = None  # calibrated: the profile YAML; recorded: a replay's steps.jsonl
    # analytic: a Vidur-format per-op profile directory of this GPU; its measured table then prices the ops it
    # covers (sim.gpu.table), the laws the rest
    gpu_profile: str | None = None
    replicas: int = 1
    router: str = "round_robin"
    sample_interval_s: float | None = None  # default: see `sample_interval`
    fast_path: bool = True
    record_tokens: bool = False  # keep every token time (ServingResult.token_times); step by step
    cost_options: dict[str, Any] = field(default_factory=dict)  # AnalyticCost efficiency / overhead overrides
    filled_defaults: tuple[str, ...] = ()  # the settings vLLM's own defaults filled in (set on construction)
    # prefill and decode pools instead of `replicas` co-located ones (sim.pd_spec; None: co-located)
    disaggregation: Disaggregation | None = None
    # Every `sim` setting of engine.core.settings, with its side default (checked there on import).
    block_size: int | None = SETTING
    num_blocks: int | None = SETTING
    num_cpu_blocks: int = SETTING
    enable_prefix_caching: bool = SETTING
    eviction_policy: str = SETTING
    kv_offloading_blocks: int = SETTING
    kv_offloading_size: float | None = SETTING
    kv_offloading_eviction: str = SETTING
    kv_disk_blocks: int = SETTING
    kv_shared_blocks: int = SETTING
    kv_shared_eviction: str = SETTING
    kv_offloading_write_through: bool = SETTING
    kv_offloading_layerwise: bool = SETTING
    allocator: str = SETTING
    max_model_len: int | None = SETTING
    sink_tokens: int = SETTING
    window_tokens: int = SETTING
    watermark: float = SETTING
    max_num_batched_tokens: int | None = SETTING
    max_num_seqs: int | None = SETTING
    long_prefill_token_threshold: int = SETTING
    enable_chunked_prefill: bool = SETTING
    policy: str = SETTING
    preemption_mode: str = SETTING
    victim_policy: str = SETTING
    schedule: str = SETTING
    scheduler_reserve_full_isl: bool = SETTING
    vllm_version: str = SETTING
    cache_aware_admission_window: int = SETTING
    cache_aware_admission_threshold: float = SETTING
    speculative_config: str | None = SETTING
    kv_cache_dtype: str = SETTING
    gpu_memory_utilization: float | None = SETTING
    quantization: str = SETTING
    tensor_parallel_size: int = SETTING
    pipeline_parallel_size: int = SETTING
    enable_expert_parallel: bool = SETTING
    entry_point: str = SETTING
    api_server_latency_ms: float | None = SETTING
    enable_lora: bool = SETTING
    max_loras: int = SETTING
    max_lora_rank: int = SETTING
    max_cpu_loras: int | None = SETTING

    def __post_init__(self) -> None:
        check_side(self, "sim")
        if self.enable_lora:  # vLLM's CPU-cache rule, as the engine commands check it
            from kvplan.engine.core.lora import max_cpu_loras_of

            max_cpu_loras_of(self.max_loras, self.max_cpu_loras)
        unset = tuple(name for name in VLLM_FILLED if getattr(self, name) is None)
        if not unset:
            return
        defaults = batch_table(self)
        if defaults is None:  # not a GPU of the datasheet table: kvplan's own engine's defaults
            for name in unset:
                setattr(self, name, SETTINGS[name].default)
            return
        from kvplan.sim.vllm_defaults import vllm_batch_defaults

        # the max_model_len adjustments wait for the trace (sim.run.build_configs); the table's values now
        chosen = vllm_batch_defaults(*defaults, max_model_len=None, max_num_batched_tokens=self.max_num_batched_tokens,
                                     max_num_seqs=self.max_num_seqs)
        self.max_num_batched_tokens, self.max_num_seqs = chosen.max_num_batched_tokens, chosen.max_num_seqs
        release = VERSIONS[self.vllm_version]
        if self.block_size is None:
            self.block_size = release.block_size
        if self.gpu_memory_utilization is None:
            self.gpu_memory_utilization = release.gpu_memory_utilization
        self.filled_defaults = unset

    @property
    def kv_block_size(self) -> int:
        """`block_size`: set on construction, by the user or the vllm_version's default."""
        assert self.block_size is not None
        return self.block_size

    @property
    def memory_utilization(self) -> float:
        """`gpu_memory_utilization`: set on construction, by the user or the vllm_version's default."""
        assert self.gpu_memory_utilization is not None
        return self.gpu_memory_utilization

    @property
    def batch(self) -> tuple[int, int]:
        """(max_num_batched_tokens, max_num_seqs): set on construction, from the user or vLLM's rule."""
        assert self.max_num_batched_tokens is not None and self.max_num_seqs is not None
        return self.max_num_batched_tokens, self.max_num_seqs


def batch_table(spec: SimSpec) -> tuple[float, str, str] | None:
    """(device memory, device name, entry point) for vLLM's default rule, or None when the hardware is no GPU of
    the datasheet table (a profiled CPU, a label): the simulated engine is then kvplan's own."""
    from kvplan.sim.specs.hardware import HARDWARE

    hardware = HARDWARE.get(spec.hardware)
    return None if hardware is None else (hardware.memory_bytes, hardware.name, spec.entry_point)
