"""What vLLM itself picks for `max_num_batched_tokens` and `max_num_seqs` when the user sets neither: by the
device's memory, its name, the entry point (vLLM's "usage context") and the replica's GPU count.

Source: vLLM 0.34.0 and 0.33.0 (one table; the releases of `engine.core.vllm_versions`), `vllm/engine/arg_utils.py`:
`EngineArgs.get_batch_defaults` holds the table, `EngineArgs._set_default_max_num_seqs_and_batched_tokens_args`
applies it. The rule, as that code has it (GiB = 2**30 bytes, the device's total memory as the platform reports it):

| device                                   | OpenAI server (`vllm serve`) | LLM class (offline) |
|------------------------------------------|------------------------------|---------------------|
| >= 160 GiB (B200, B300, MI300X)          | 16384 tokens / 1024 seqs     | 16384 / 1024        |
| >= 70 GiB, not an A100, not a GB10       | 8192 / 1024                  | 16384 / 1024        |
| any other GPU (A100, L40S, L4, RTX 4090) | 2048 / 256                   | 8192 / 256          |
| the CPU platform (world size W)          | 2048 W / 128 W               | 4096 W / 256 W      |

Any other usage context (an engine built directly, `ENGINE_CONTEXT`) takes `SchedulerConfig`'s class defaults,
2048 tokens / 128 sequences. Then, for a value the user left unset: without chunked prefill the token budget is
raised to `max_model_len` (a prompt must fit one step); the budget never exceeds `max_num_seqs * max_model_len`;
and `max_num_seqs` never exceeds the token budget. (`--performance-mode throughput`, which doubles both, and the
TPU and batched data-parallel MoE tables are not modelled: kvplan prices neither.)

tests/sim/test_vllm_defaults.py checks this module against vLLM's own `get_batch_defaults`, called on the CPU with
the device memory and name mocked, for an 80 GB and a 24 GB GPU (and the other tiers), when vLLM is installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvplan.engine.core.vllm_versions import NAMES, VERSIONS

if TYPE_CHECKING:
    from kvplan.sim.spec import SimSpec

GIB = 1 << 30
# kvplan's name of each entry point -> vLLM's UsageContext member
ENTRY_POINTS = {"openai_server": "OPENAI_API_SERVER", "llm": "LLM_CLASS", "engine": "ENGINE_CONTEXT"}


@dataclass(slots=True, frozen=True)
class _Tier:
    """One row of vLLM's table: from `min_gib` of device memory (A100s and GB10s excluded where `excludes`)."""

    min_gib: int
    excludes: bool
    tokens: dict[str, int]  # UsageContext name -> max_num_batched_tokens
    seqs: dict[str, int]  # UsageContext name -> max_num_seqs
    label: str


_TIERS = (  # the first that matches wins, as vLLM's if/elif/else
    _Tier(160, False, {"OPENAI_API_SERVER": 16384, "LLM_CLASS": 16384}, {"OPENAI_API_SERVER": 1024, "LLM_CLASS": 1024},
          ">= 160 GiB"),
    _Tier(70, True, {"OPENAI_API_SERVER": 8192, "LLM_CLASS": 16384}, {"OPENAI_API_SERVER": 1024, "LLM_CLASS": 1024},
          ">= 70 GiB (not an A100 or GB10)"),
    _Tier(0, False, {"OPENAI_API_SERVER": 2048, "LLM_CLASS": 8192}, {"OPENAI_API_SERVER": 256, "LLM_CLASS": 256},
          "< 70 GiB, or an A100"),
)
# SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS / DEFAULT_MAX_NUM_SEQS: any context the table does not name
_CLASS_DEFAULTS = (2048, 128)
_CPU = {"OPENAI_API_SERVER": (2048, 128), "LLM_CLASS": (4096, 256)}  # per GPU of the world size


@dataclass(slots=True, frozen=True)
class BatchDefaults:
    """The two values and why: `rule` says which row of vLLM's table gave them."""

    max_num_batched_tokens: int
    max_num_seqs: int
    rule: str


def table_defaults(memory_bytes: float, device_name: str, entry_point: str, *, cpu: bool = False,
                   world_size: int = 1) -> BatchDefaults:
    """vLLM's `get_batch_defaults` for one device and entry point (`ENTRY_POINTS` keys), before the adjustments."""
    context = ENTRY_POINTS[entry_point]
    if cpu:
        tokens, seqs = _CPU.get(context, _CLASS_DEFAULTS)
        scale = world_size if context in _CPU else 1
        return BatchDefaults(tokens * scale, seqs * scale, f"the CPU platform, world size {world_size}")
    name = device_name.lower()
    tier = next(t for t in _TIERS
                if memory_bytes >= t.min_gib * GIB and not (t.excludes and ("a100" in name or "gb10" in name)))
    if context not in tier.tokens:
        return BatchDefaults(*_CLASS_DEFAULTS, "SchedulerConfig's class defaults (no row for this entry point)")
    return BatchDefaults(tier.tokens[context], tier.seqs[context], f"a GPU of {memory_bytes / GIB:.0f} GiB: "
                         f"{tier.label}")


def vllm_batch_defaults(memory_bytes: float, device_name: str, entry_point: str, *, max_model_len: int | None,
                        enable_chunked_prefill: bool = True, max_num_batched_tokens: int | None = None,
                        max_num_seqs: int | None = None, cpu: bool = False, world_size: int = 1) -> BatchDefaults:
    """What vLLM runs with: the user's values where given, its defaults (with its adjustments) where not
    (`_set_default_max_num_seqs_and_batched_tokens_args`). `max_model_len` None skips the adjustments that need it."""
    table = table_defaults(memory_bytes, device_name, entry_point, cpu=cpu, world_size=world_size)
    tokens = table.max_num_batched_tokens if max_num_batched_tokens is None else max_num_batched_tokens
    seqs = table.max_num_seqs if max_num_seqs is None else max_num_seqs
    if max_num_batched_tokens is None and max_model_len is not None:
        if not enable_chunked_prefill:
            tokens = max(max_model_len, tokens)
        tokens = min(seqs * max_model_len, tokens)
    if max_num_seqs is None:
        seqs = min(seqs, tokens)
    return BatchDefaults(tokens, seqs, table.rule)


def describe(defaults: BatchDefaults, entry_point: str, which: tuple[str, ...]) -> str:
    """One line for --explain and the notes: which values came from vLLM's rule, and the rule."""
    values = {"max_num_batched_tokens": defaults.max_num_batched_tokens, "max_num_seqs": defaults.max_num_seqs}
    given = " and ".join(f"{name} {values[name]}" for name in which)
    return (f"{given}: vLLM's default (the same in {' and '.join(NAMES)}) for the {entry_point} entry point on "
            f"{defaults.rule} (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults); set them to override")


def explain(spec: SimSpec) -> list[str]:
    """The --explain lines of a spec: the vLLM release followed, and each setting its defaults filled in."""
    release = VERSIONS[spec.vllm_version]
    lines = [f"vLLM {release.release} followed (vllm_version {spec.vllm_version}: {release.notes})"]
    batch = tuple(name for name in spec.filled_defaults if name in ("max_num_batched_tokens", "max_num_seqs"))
    if batch:
        defaults = BatchDefaults(int(spec.max_num_batched_tokens or 0), int(spec.max_num_seqs or 0),
                                 _rule_of(spec))
        line = describe(defaults, spec.entry_point, batch)
        if "max_num_batched_tokens" in batch and not spec.enable_chunked_prefill:
            line += "; without chunked prefill the budget is raised to max_model_len, as vLLM does"
        lines.append(line)
    if "block_size" in spec.filled_defaults:
        lines.append(f"block_size {spec.block_size}: vLLM {release.release}'s default (CacheConfig.DEFAULT_BLOCK_SIZE)"
                     "; set it to override")
    if "gpu_memory_utilization" in spec.filled_defaults:
        lines.append(f"gpu_memory_utilization {spec.gpu_memory_utilization:g}: vLLM {release.release}'s default "
                     f"({release.gpu_memory_utilization_why}); set it to override")
    return lines


def _rule_of(spec: SimSpec) -> str:
    from kvplan.sim.specs.hardware import get_hardware

    hardware = get_hardware(spec.hardware)
    return table_defaults(hardware.memory_bytes, hardware.name, spec.entry_point).rule + f" ({hardware.name})"
