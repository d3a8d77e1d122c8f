"""Every serving setting, declared once.

A `Setting` is a name (vLLM's spelling where vLLM has the knob), a kind, a default, what is allowed, a help line
and the sides that use it: `core` (the scheduler and the KV manager: a field of `CacheConfig` or
`SchedulerConfig`), `engine` (the live engine: `EngineOptions`, `LLM(**settings)`, the engine commands' flags)
and `sim` (the simulator: `SimSpec`, `kvplan simulate`'s flags, an experiment's `engine:` section). Everything
else is derived from `SETTINGS`: the defaults and checks of the config dataclasses' and `SimSpec`'s fields,
`EngineOptions`, the YAML schema and every command's flags. A bad value gets the same message on every side, after
a prefix naming where it was written (`cache.block_size:`, `engine.block_size:`, `argument --block-size:`).

The config dataclasses and `SimSpec` declare each of their settings as a typed field, `block_size: int = SETTING`,
so that a type checker sees them; `setting_classes.config_fields` / `side_fields` fill in the default from here
and refuse, on import, a class whose fields are not exactly its settings, in their order, with their types.

Adding a knob is one `Setting` here, its field in the classes of the sides that use it, and its use in the core;
`tests/core/test_settings.py` fails when a side that claims a setting never reads it.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvplan.engine.core.eviction import EVICTION_POLICIES
from kvplan.engine.core.needs import ON, Needs, check_needs  # noqa: F401 (check_needs: the sides')
from kvplan.engine.core.speculative import speculative_problem
from kvplan.engine.core.victims import VICTIM_POLICIES
from kvplan.engine.core.vllm_versions import NAMES as VLLM_VERSIONS
from kvplan.engine.core.vllm_versions import NEWEST as NEWEST_VLLM
from kvplan.engine.core.vllm_versions import VERSIONS
from kvplan.errors import ConfigError, listed, short_repr
from kvplan.limits import MAX_BLOCKS, MAX_TOKENS

SIDES = ("core", "engine", "sim")
ALL = frozenset(SIDES)
ALLOCATORS = ("paged", "max", "pow2", "oracle")
PREEMPTION_MODES = ("recompute", "swap")
QUEUE_POLICIES = ("fcfs", "priority")
SCHEDULES = ("mixed", "prefill_first")
MODEL_DTYPES = ("bfloat16", "float16", "float32")
# vLLM's cache dtype names (`auto`: the model's dtype); the engine stores fp8 as float8_e4m3fn, int8 with scales.
KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "float32", "fp8", "fp8_e4m3", "int8")
# vLLM's --quantization names the simulator prices (sim.specs.quantization holds their bytes and GEMM kinds); none:
# the checkpoint's own weights (vLLM's default, None: what the checkpoint's quantization_config says)
QUANTIZATIONS = ("none", "fp8", "awq", "gptq")
POSITION_MODES = ("original", "shifted")
_UNITS = {"": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30}


def _show(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def describe_range(noun: str, minimum: float | None, maximum: float | None, above: float | None = None) -> str:
    """'an integer >= 1 and <= 256': how every message states a number's bounds (settings and plain flags)."""
    bounds = [f">= {_show(minimum)}" if minimum is not None else "", f"> {_show(above)}" if above is not None else "",
              f"<= {_show(maximum)}" if maximum is not None else ""]
    return " ".join([noun, " and ".join(b for b in bounds if b)]).strip()


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True, slots=True)
class Field:
    """One checked scalar: its kind ('int', 'float', 'bool', 'str', 'choice', 'bytes'), default and bounds.

    `problem(value)` says what is wrong with a value (None: nothing); `check(value, path)` raises it as a
    `ConfigError` after the path and returns the value in its canonical form (16.0 -> 16, '64MiB' -> 67108864,
    a value alias -> its name)."""

    kind: str
    default: object = None
    choices: tuple[str, ...] = ()
    minimum: float | None = None  # inclusive
    maximum: float | None = None  # inclusive
    above: float | None = None  # exclusive lower bound
    nullable: bool = False
    help: str = ""
    values: tuple[tuple[str, str], ...] = ()  # accepted aliases of choices: (alias, choice)
    why: str = ""  # why the bounds are where they are, when it is not obvious
    derived: bool = False  # None means "derived" (left out, not written): not listed among the allowed values
    # a string's own grammar (a JSON setting): what is wrong with a value, or None
    checker: Callable[[Any], str | None] | None = None

    def allowed(self) -> str:
        if self.kind == "choice":
            text = listed(self.choices)
        elif self.kind == "bool":
            text = "true or false"
        elif self.kind == "str":
            text = "a string"
        elif self.kind == "bytes":
            text = (f"a size in bytes >= 1 and <= this machine's memory ({physical_memory()}), with an optional unit "
                    "(KiB, MiB, GiB, KB, MB, GB), e.g. 64MiB")
        else:
            noun = "an integer" if self.kind == "int" else "a finite number"
            text = describe_range(noun, self.minimum, self.maximum, self.above)
        text = f"{text} ({self.why})" if self.why else text
        return f"{text} or null" if self.nullable and not self.derived else text

    def check(self, value: object, path: str) -> object:
        value, problem = self.parse(value)
        if problem is not None:
            raise ConfigError(f"{path}: {problem}")
        return value

    def parse(self, value: object) -> tuple[object, str | None]:
        """(the canonical value, None) or (value, what is wrong with it)."""
        if value is None:
            return (None, None) if self.nullable else (None, f"must be set; allowed: {self.allowed()}")
        if self.kind == "choice":
            value = dict(self.values).get(value, value) if isinstance(value, str) else value
            if value not in self.choices:
                from kvplan.engine.core.names import did_you_mean

                hint = did_you_mean(value, self.choices)
                return value, f"unknown value {short_repr(value)}; {hint}allowed: {self.allowed()}"
            return value, None
        if self.kind == "bool":
            return value, None if isinstance(value, bool) else f"must be true or false, got {short_repr(value)}"
        if self.kind == "str":
            if self.checker is not None and isinstance(value, dict):  # a JSON setting written as a YAML mapping
                value = json.dumps(value)
            ok = isinstance(value, str) and value
            if ok and self.checker is not None:
                return value, self.checker(value)
            return value, None if ok else f"must be a non-empty string, got {short_repr(value)}"
        if self.kind == "bytes":
            return self._bytes(value)
        value, problem = self._number(value)
        if problem is None and self.checker is not None:  # a number's own rule beyond its range (LoRA ranks)
            return value, self.checker(value)
        return value, problem

    def _number(self, value: object) -> tuple[object, str | None]:
        # bool is an int in Python; `block_size: true` is a mistake, not 1.
        if (not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value)
                or (self.kind == "int" and not float(value).is_integer())
                or (self.minimum is not None and value < self.minimum)
                or (self.above is not None and value <= self.above)
                or (self.maximum is not None and value > self.maximum)):
            return value, f"must be {self.allowed()}, got {short_repr(value)}"
        return (int(value) if self.kind == "int" else float(value)), None

    def _bytes(self, value: object) -> tuple[object, str | None]:
        size = None
        if isinstance(value, int) and not isinstance(value, bool):
            size = value
        elif isinstance(value, str):
            match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", value)
            if match and match.group(2).lower() in _UNITS:
                # '1e400' reads as inf and int(inf) is an OverflowError: capped, then refused below
                size = int(min(float(match.group(1)) * _UNITS[match.group(2).lower()], 2.0**63))
        # The KV cache and swap space live in this machine's memory (CPU engine): more than it has cannot be made.
        if size is None or not 1 <= size <= physical_memory():
            return value, f"must be {self.allowed()}, got {short_repr(value)}"
        return size, None

    def parse_text(self, text: str) -> tuple[object, str | None]:
        """A command-line word as this field's value (numbers from their spelling; 'null' for a nullable field)."""
        if self.nullable and text == "null":
            return None, None
        if self.kind in ("int", "float"):
            number: int | float | None
            try:
                number = int(text)
            except ValueError:
                try:
                    number = float(text)
                except ValueError:
                    number = None
            # '2.5' for an integer is the value 2.5, quoted as the core and YAML quote it; '1e3' and 'nan' are no
            # integer's spelling: say what you mean
            spelled = self.kind == "int" and isinstance(number, float) and (not math.isfinite(number)
                                                                            or number.is_integer())
            if number is None or spelled:
                return text, f"must be {self.allowed()}, got {short_repr(text)}"
            return self.parse(number)
        if self.kind == "bool":
            if text.lower() not in ("true", "false"):
                return text, f"must be true or false, got {short_repr(text)}"
            return text.lower() == "true", None
        return self.parse(text)


@dataclass(frozen=True, slots=True)
class Setting(Field):
    """A serving setting: a checked field with a name, where it applies and how it is spelled.

    `config` names the core dataclass that holds it (`cache`, `scheduler`) or None for a setting only the engine
    or the simulator reads. `unset`, when given, says what None means on the engine and simulator sides (derived
    from memory or the model); the core, which has no memory or model, then uses `default`. `flag` is vLLM's
    spelling; `aliases` are earlier kvplan flags and `keys` earlier names of the keyword or YAML key, kept so that
    users' scripts and experiment files keep working. `needs`, when given, is the component the setting
    configures (`check_needs` refuses it where nothing configures that component). `vllm` is vLLM's name of the
    knob (its `EngineArgs` field; the flag is its spelling with dashes), empty where the knob is kvplan's own;
    `unit` is what a number counts (tokens, blocks, GiB, ...), empty for a switch or a choice. Both are shown in
    the generated reference (`kvplan.reference`). `since` is the first vLLM release with the knob: with an older
    `vllm_version` it is refused (`needs.check_needs`)."""

    name: str = ""
    config: str | None = None
    sides: frozenset[str] = ALL
    flag: str = ""
    aliases: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    unset: str = ""
    unset_sides: frozenset[str] = frozenset({"engine", "sim"})  # the sides where None means `unset`
    needs: Needs | None = None
    vllm: str = ""
    unit: str = ""
    since: str = ""  # the first vllm_version that has the knob (engine.core.vllm_versions); "": every one

    def derived_on(self, side: str) -> bool:
        """Whether None on `side` means a value that side derives (`unset`) rather than the default."""
        return bool(self.unset) and side in self.unset_sides

    @property
    def side_default(self) -> object:
        """The default on the engine side (`default_on` names the side)."""
        return self.default_on("engine")

    def default_on(self, side: str) -> object:
        """The default on the engine or the simulator side: None where that side derives the value."""
        return None if self.derived_on(side) else self.default

    @property
    def annotation(self) -> str:
        kind = {"int": "int", "float": "float", "bool": "bool", "bytes": "int"}.get(self.kind, "str")
        return f"{kind} | None" if self.unset or self.nullable else kind

    def side_field(self, side: str = "engine") -> Field:
        """The field as the engine or the simulator takes it (None allowed where `unset` gives it a meaning)."""
        derived = self.derived_on(side)
        return Field(self.kind, self.default_on(side), self.choices, self.minimum, self.maximum, self.above,
                     self.nullable or derived, self.help, self.values, self.why, derived=derived,
                     checker=self.checker)


def _s(name: str, kind: str, default: object, help: str, flag: str = "", vllm: bool | str = True,
       **kw: Any) -> Setting:
    """A `Setting`; `kw` are its other fields by name, `flag` defaults to the name's spelling (`--block-size`).
    `vllm`: True where the name is vLLM's, False where only kvplan has the knob, else vLLM's other name."""
    vllm_name = name if vllm is True else vllm or ""
    return Setting(kind, default, name=name, help=help, flag=flag or "--" + name.replace("_", "-"), vllm=vllm_name,
                   **kw)


CORE_SIM, ENGINE, ENGINE_SIM = frozenset({"core", "sim"}), frozenset({"engine"}), frozenset({"engine", "sim"})
SIM = frozenset({"sim"})


def _spec_problem(text: str) -> str | None:
    return speculative_problem(text)[1]
MAX_PARALLEL = 64  # GPUs of one replica: 8 nodes of 8 (the largest single-model deployments published)

PER_BLOCK = "one object per KV block: more would exhaust memory"
VLLM_BATCH_DEFAULT = ("simulator: what vLLM picks for the hardware's memory and the entry point (sim.vllm_defaults: "
                      "8192 tokens / 1024 sequences for the OpenAI server on a >= 70 GiB GPU, 2048 / 256 below); "
                      "engine: 2048 / 256")
ENTRY_POINTS = ("openai_server", "llm", "engine")  # vLLM's usage contexts OPENAI_API_SERVER, LLM_CLASS, ENGINE_CONTEXT
MAX_OFFLOAD_GIB = 1 << 20  # a PiB of host memory: past any machine (the engine checks its own memory)
# The components a setting may configure (`Needs`): what turns each on.
WINDOW = Needs("a sliding window", (("window_tokens", ON),))
CPU_TIER = Needs("a CPU prefix tier", (("kv_offloading_blocks", ON), ("kv_offloading_size", ON)))
LOWER_TIER = Needs("a prefix tier below the GPU", (*CPU_TIER.any_of, ("kv_disk_blocks", ON), ("kv_shared_blocks", ON)))
SHARED_TIER = Needs("a cluster-shared prefix tier", (("kv_shared_blocks", ON),))
SWAP = Needs("swapping preempted requests out", (("preemption_mode", "swap"),))
CACHE_AWARE = Needs("cache-aware admission", (("cache_aware_admission_window", ON),))
LORA = Needs("LoRA adapters", (("enable_lora", ON),))
CORE_ENGINE = frozenset({"core", "engine"})
# vLLM's MaxLoRARanks (config/lora.py): the ranks its kernels are built for
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank_problem(rank: int) -> str | None:
    """What is wrong with a max_lora_rank: vLLM accepts only the ranks its kernels are built for."""
    allowed = ", ".join(map(str, LORA_RANKS))
    return None if rank in LORA_RANKS else f"{rank} is not a rank vLLM serves; allowed: {allowed}"


def _by_version(field: str, unit: str = "") -> str:
    """'0.33: 16, 0.34: 64': a default that depends on vllm_version, as the reference shows it."""
    return ", ".join(f"{name}: {getattr(VERSIONS[name], field):g}{unit}" for name in VLLM_VERSIONS)


VERSION_DEFAULT = "simulator, on a GPU: vLLM's default of the vllm_version ({}); otherwise kvplan's engine's {}"
SETTINGS: dict[str, Setting] = {s.name: s for s in (
    # --- the KV cache (CacheConfig) ---
    _s("block_size", "int", 16, "tokens per KV block", config="cache", minimum=1, maximum=256, unit="tokens",
       unset=VERSION_DEFAULT.format(_by_version("block_size"), 16), unset_sides=SIM),
    _s("num_blocks", "int", 1024, "KV blocks on the device", config="cache", minimum=1, maximum=MAX_BLOCKS,
       why=PER_BLOCK,
       aliases=("--num-gpu-blocks-override",), keys=("num_gpu_blocks_override",),
       unset="what the KV memory holds (engine: --kv-cache-memory; simulator: the profile's, else the analytic "
             "estimate for the hardware)", vllm="num_gpu_blocks_override", unit="blocks"),
    _s("num_cpu_blocks", "int", 0, "CPU blocks that hold swapped-out KV (the engine sizes them from swap_space)",
       config="cache", sides=CORE_SIM, minimum=0, maximum=MAX_BLOCKS, why=PER_BLOCK, aliases=("--cpu-blocks",),
       needs=SWAP, vllm=False, unit="blocks"),
    _s("enable_prefix_caching", "bool", True, "reuse cached KV blocks of shared prompt prefixes", config="cache",
       aliases=("--no-prefix-caching",)),
    _s("eviction_policy", "choice", "lru", "which cached free block is reused first", config="cache",
       choices=tuple(sorted(EVICTION_POLICIES)), aliases=("--eviction",), vllm=False),
    _s("kv_offloading_blocks", "int", 0, "CPU prefix-cache tier in blocks (vLLM's KV offloading, LMCache's "
       "local_cpu): prefix blocks the GPU evicts are kept there and copied back on a hit (live engine: pinned host "
       "memory, copied on a side CUDA stream); 0: no CPU tier", config="cache", minimum=0, maximum=MAX_BLOCKS,
       why=PER_BLOCK, vllm=False, unit="blocks"),
    _s("kv_offloading_size", "float", None, "the CPU prefix tier as GiB of host memory (vLLM's name: the sum over "
       "a replica's TP ranks), converted to whole blocks of the model's KV bytes per block; instead of "
       "kv_offloading_blocks (both: the same number of blocks)",
       sides=ENGINE_SIM, nullable=True, above=0, maximum=MAX_OFFLOAD_GIB, why="GiB", unit="GiB"),
    _s("kv_offloading_backend", "choice", "native", "what keeps the CPU prefix tier (vLLM's name): native, "
       "vLLM's own CPU offloading, the one kvplan has (its tier stores a block when the GPU evicts it)",
       sides=ENGINE, choices=("native",),
       why="lmcache is not modelled", needs=CPU_TIER),
    _s("kv_offloading_eviction", "choice", "lru", "which block the CPU prefix tier drops (or demotes to disk) first",
       config="cache", choices=tuple(sorted(EVICTION_POLICIES)), needs=CPU_TIER, vllm=False),
    _s("kv_disk_blocks", "int", 0, "local-disk prefix-cache tier in blocks below the CPU tier (LMCache's "
       "local_disk; simulator-only: the live engine refuses any value but 0): blocks the CPU tier evicts land "
       "there; 0: no disk tier", config="cache", sides=CORE_SIM, minimum=0, maximum=MAX_BLOCKS, why=PER_BLOCK,
       vllm=False, unit="blocks"),
    _s("kv_shared_blocks", "int", 0, "cluster-shared prefix-cache tier in blocks below the local tiers (Mooncake "
       "Store, LMCache's remote backend; simulator-only): one store for every replica, which publish the blocks "
       "their local tiers drop and fetch any replica's blocks by key over the network; 0: no shared tier",
       config="cache", sides=CORE_SIM, minimum=0, maximum=MAX_BLOCKS, why=PER_BLOCK, vllm=False, unit="blocks"),
    _s("kv_shared_eviction", "choice", "lru", "which block the cluster-shared prefix tier drops first (Mooncake "
       "Store: LRU)", config="cache", sides=CORE_SIM, choices=tuple(sorted(EVICTION_POLICIES)),
       needs=SHARED_TIER, vllm=False),
    _s("kv_offloading_write_through", "bool", False, "store every block in every lower prefix tier as soon as it "
       "is computed (LMCache's default) instead of only when the tier above evicts it (write-back)",
       config="cache", sides=CORE_SIM, needs=LOWER_TIER, vllm=False),
    _s("kv_offloading_layerwise", "bool", False, "load promoted prefix blocks layer by layer while the prefill "
       "computes (LMCache's layer-wise connector): a step costs max(copy, compute) plus one layer's copy "
       "instead of their sum", sides=SIM, needs=LOWER_TIER, vllm=False),
    _s("allocator", "choice", "paged", "paged blocks, or a contiguous reservation baseline of the vLLM paper "
       "(reserve the model's max length, the next power of two of the need, or exactly the need)", config="cache",
       sides=CORE_SIM, choices=ALLOCATORS, vllm=False),
    _s("max_model_len", "int", 4096, "the longest context (prompt + output) a request may have; longer requests "
       "are rejected and counted", config="cache", minimum=1, maximum=MAX_TOKENS,
       unset="engine: the model's context; simulator: the longest request of the trace", unit="tokens"),
    _s("sink_tokens", "int", 0, "attention-sink tokens kept beside the window (StreamingLLM)", config="cache",
       minimum=0, maximum=MAX_TOKENS, needs=WINDOW, vllm=False, unit="tokens"),
    _s("window_tokens", "int", 0, "sliding window of recent tokens each request keeps (0: full attention)",
       config="cache", minimum=0, maximum=MAX_TOKENS, vllm=False, unit="tokens"),
    _s("watermark", "float", 0.0, "fraction of blocks admission keeps free (vLLM V0's 0.01; V1 has none)",
       config="cache", minimum=0, maximum=0.5, vllm=False, unit="fraction of blocks"),
    # --- continuous batching (SchedulerConfig) ---
    _s("max_num_batched_tokens", "int", 2048, "tokens one step may compute", config="scheduler", minimum=1,
       maximum=MAX_TOKENS, unset=VLLM_BATCH_DEFAULT, unset_sides=SIM, unit="tokens"),
    _s("max_num_seqs", "int", 256, "sequences one step may run", config="scheduler", minimum=1,
       maximum=1_000_000, unset=VLLM_BATCH_DEFAULT, unset_sides=SIM, unit="sequences"),
    _s("long_prefill_token_threshold", "int", 0, "a prompt computes at most this many tokens per step, so long "
       "prefills share steps with short ones (0: no cap; vLLM's knob of the same name)", config="scheduler",
       minimum=0, maximum=MAX_TOKENS, unit="tokens"),
    _s("enable_chunked_prefill", "bool", True, "split long prompts across steps", config="scheduler",
       aliases=("--no-chunked-prefill",)),
    _s("policy", "choice", "fcfs", "waiting-queue order: first come first served, or by request priority",
       config="scheduler", choices=QUEUE_POLICIES, flag="--scheduling-policy", aliases=("--policy",),
       vllm="scheduling_policy"),
    _s("preemption_mode", "choice", "recompute", "what preemption does with a victim's KV", config="scheduler",
       choices=PREEMPTION_MODES, aliases=("--preemption",)),
    _s("victim_policy", "choice", "newest", "which running request is preempted", config="scheduler",
       choices=tuple(sorted(VICTIM_POLICIES)), aliases=("--victim",), vllm=False),
    _s("schedule", "choice", "mixed", "mixed: decodes first, prefill chunks fill the budget (vLLM V1); "
       "prefill_first: prefill-only steps whenever one fits (vLLM V0)", config="scheduler", choices=SCHEDULES,
       vllm=False),
    _s("scheduler_reserve_full_isl", "bool", True, "admit a waiting request only when its whole prompt fits in "
       "the free KV blocks (vLLM's default); off: a first chunk that fits is enough (vLLM <= 0.10)",
       config="scheduler"),
    _s("vllm_version", "choice", NEWEST_VLLM, "the vLLM release whose scheduler and defaults are followed "
       "(engine.core.vllm_versions says what differs)", config="scheduler", choices=VLLM_VERSIONS, vllm=False),
    _s("cache_aware_admission_window", "int", 0, "cache-aware admission: within the first N waiting requests, "
       "those with a deeper cached prefix are admitted first (ties by arrival), once KV usage reaches the "
       "threshold; needs prefix caching and the fcfs policy (0: arrival order)", config="scheduler", minimum=0,
       maximum=1_000_000, since="0.34", unit="requests"),
    _s("cache_aware_admission_threshold", "float", 0.5, "KV cache usage from which cache-aware admission reorders "
       "(0: every step)", config="scheduler", minimum=0, maximum=1, needs=CACHE_AWARE, since="0.34",
       unit="fraction of blocks"),
    _s("speculative_config", "str", None, "speculative decoding as vLLM spells it, a JSON object: "
       "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4, "
       "\"prompt_lookup_min\": 1}' (prompt lookup) or '{\"method\": \"draft_model\", \"model\": DIR, "
       "\"num_speculative_tokens\": 3}' (a small model with the target's vocabulary); the keys acceptance (k + 1 "
       "probabilities of accepting 0..k drafts) and acceptance_rate are the simulator's, the live engine ignores "
       "them (null: off; in YAML also a mapping)", config="scheduler", nullable=True, checker=_spec_problem),
    # --- the device and the model (the engine and the simulator) ---
    _s("kv_cache_dtype", "choice", "auto", "KV cache dtype (auto: the model's; fp8 and int8 hold ~2x the blocks "
       "in the same memory)", sides=ENGINE_SIM, choices=KV_CACHE_DTYPES, values=(("float8", "fp8"),),
       aliases=("--kv-dtype",), keys=("kv_dtype",)),
    _s("gpu_memory_utilization", "float", 0.9, "fraction of device memory the engine may use (weights + KV)",
       sides=ENGINE_SIM, above=0, maximum=1, unit="fraction of memory",
       unset=VERSION_DEFAULT.format(_by_version("gpu_memory_utilization"), 0.9), unset_sides=SIM),
    _s("kv_cache_memory", "bytes", 64 << 20, "bytes of KV cache, used when num_blocks is not given",
       sides=ENGINE, aliases=("--kv-cache-memory-bytes",),
       unset="on CUDA what gpu_memory_utilization leaves after the weights and a profiled step (vLLM's rule); "
             "on CPU 64 MiB", vllm="kv_cache_memory_bytes", unit="bytes"),
    _s("swap_space", "bytes", 64 << 20, "bytes of CPU swap space (preemption_mode: swap)", sides=ENGINE,
       needs=SWAP, unit="bytes"),
    _s("dtype", "choice", "bfloat16", "model weights and activations", sides=ENGINE, choices=MODEL_DTYPES),
    _s("quantization", "choice", "none", "weight quantization, as vLLM runs it: none, the checkpoint's own "
       "weights (its quantization_config, if any); fp8, every layer's linear weights in 1 byte and their GEMMs at the "
       "FP8 tensor-core rate (W8A8, dynamic per-token activation scales; embeddings and LM head stay in the model "
       "dtype); awq / gptq, the model's 4-bit group-128 checkpoint, weight-only GEMMs through the Marlin kernels. A "
       "checkpoint that declares one keeps it (naming another is refused)", sides=SIM, choices=QUANTIZATIONS),
    # --- the deployment shape of one replica (the simulator's cost model; the live engine runs one device) ---
    _s("tensor_parallel_size", "int", 1, "GPUs one replica's layers are split across (weights and KV heads "
       "sharded; two all-reduces per layer)", sides=SIM, minimum=1, maximum=MAX_PARALLEL,
       why="GPUs of one replica", unit="GPUs"),
    _s("pipeline_parallel_size", "int", 1, "pipeline stages one replica's layers are split into (each stage on "
       "its own tensor-parallel group; activations sent between stages)", sides=SIM, minimum=1,
       maximum=MAX_PARALLEL, why="GPUs of one replica", unit="stages"),
    _s("enable_expert_parallel", "bool", False, "MoE models: place whole experts on the tensor-parallel ranks "
       "(an all-to-all dispatch and combine per MoE layer) instead of sharding every expert", sides=SIM),
    _s("entry_point", "choice", "openai_server", "how the simulated vLLM is run: openai_server (`vllm serve`: "
       "latencies as its clients see them, the API server's work on every request and token included, and "
       "vLLM's server defaults), llm (the offline LLM class) or engine (the engine core alone); the engine-internal "
       "times are reported beside the client's either way", sides=SIM, choices=ENTRY_POINTS, vllm=False),
    _s("api_server_latency_ms", "float", None, "with entry_point openai_server: what a client waits per request that "
       "occupies no API-server time (HTTP transport both ways, the server's and the client's stacks); `kvplan "
       "validate --endpoint` fits it for a real server", sides=SIM, minimum=0, maximum=60_000, why="milliseconds",
       unset="vLLM PR #54628's client-minus-server TTFT of `vllm serve` less the measured API-server work "
             "(sim.frontend)", unset_sides=SIM, vllm=False, unit="ms"),
    _s("position_mode", "choice", "original", "with a window: retained tokens keep their positions (original), or "
       "take their positions within the cache (shifted, StreamingLLM; RoPE models, torch/cpu attention)",
       sides=ENGINE, choices=POSITION_MODES, needs=WINDOW, vllm=False),
    # --- LoRA (vLLM's LoRAConfig; the adapters themselves: the engine commands' --lora-modules) ---
    _s("enable_lora", "bool", False, "serve LoRA adapters on the base model (a request names its adapter; "
       "--lora-modules gives them; the simulator: the trace's `lora` column names them)", config="scheduler"),
    _s("max_loras", "int", 1, "adapters the running requests may use at once (the adapter slots on the device): a "
       "waiting request whose adapter would exceed it is skipped, keeping its place, until one finishes",
       config="scheduler", minimum=1, maximum=4096,
       why="adapter slots, each holding its weights on the device", needs=LORA, unit="adapters"),
    _s("max_lora_rank", "int", 16, "the largest adapter rank served (an adapter of higher rank is refused); "
       f"vLLM's ranks: {', '.join(map(str, LORA_RANKS))}; the simulator prices every adapter's kernels at it (vLLM's "
       "stacked buffers are this wide)", config="scheduler", minimum=1, maximum=LORA_RANKS[-1], needs=LORA,
       unit="rank", checker=lora_rank_problem),
    _s("max_cpu_loras", "int", None, "adapters kept in CPU memory (least recently used dropped first; a dropped "
       "one is read from disk again); at least max_loras (null: max_loras, vLLM's)", config="scheduler", minimum=1,
       maximum=1_000_000, nullable=True, needs=LORA, unit="adapters"),
)}
# The replica's deployment shape: the simulator prices it, the live engine (one device) refuses anything but 1.
SHAPE_SETTINGS = ("tensor_parallel_size", "pipeline_parallel_size", "enable_expert_parallel")
# Simulator-only settings (the lower prefix tiers, weight quantization): the engine commands take the flag (so that
# --help says so) and refuse all but the default.
SIM_ONLY_TIERS = {
    "kv_disk_blocks": "the disk prefix tier is simulator-only (kvplan simulate --kv-disk-blocks prices it; the "
                      "live engine's tier is --kv-offloading-blocks)",
    "kv_shared_blocks": "the cluster-shared prefix tier is simulator-only (kvplan simulate --kv-shared-blocks "
                        "prices it; the live engine's tier is --kv-offloading-blocks)",
    "kv_offloading_write_through": "write-through is simulator-only (the live engine's CPU tier is written back: "
                                   "a block is copied out when the GPU evicts it)",
    "quantization": "weight quantization is simulator-only (kvplan simulate --quantization prices it; the live "
                    "engine runs the model's own weights in --dtype)",
}
KEY_ALIASES = {key: s.name for s in SETTINGS.values() for key in s.keys}
NEEDS = {s.name: s.needs for s in SETTINGS.values() if s.needs is not None}


def for_side(side: str) -> tuple[Setting, ...]:
    return tuple(s for s in SETTINGS.values() if side in s.sides)


def canonical(name: str) -> str:
    """A setting's name from its current or an earlier spelling (`kv_dtype` -> `kv_cache_dtype`)."""
    return KEY_ALIASES.get(name, name)
