"""Engine options on the command line (`kvplan replay`, `validate`, `calibrate`) and in YAML config lists."""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import replace
from pathlib import Path

from kvplan.arg_types import BLOCK_SIZE, BLOCKS, MAX_TOKENS, POSITIVE_TOKENS, TOKENS, integer
from kvplan.live import SIM_KV_DTYPES, EngineOptions
from kvplan.output import safe_name, short
from kvplan.traces.specs import read_yaml

_UNITS = {"": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30}


def parse_bytes(text: str) -> int:
    """'64MiB', '512m', '1e8', '1GB' -> bytes."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = match and match.group(2).lower()
    if not match or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; allowed: a number of bytes with an optional "
                                         "unit (KiB, MiB, GiB, KB, MB, GB), e.g. 64MiB")
    value = int(float(match.group(1)) * _UNITS[unit])
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a size must be at least 1 byte")
    # The KV cache and swap space live in this machine's memory (CPU engine): more than it has cannot be made.
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if value > physical:
        raise argparse.ArgumentTypeError(f"{text!r} is {value} bytes; allowed: at most this machine's memory, "
                                         f"{physical} bytes")
    return value


# The model dtypes the engine runs (engine.llm.MODEL_DTYPES, repeated: kvplan loads without torch); every --dtype
# flag and `dtype` key takes exactly these.
MODEL_DTYPES = ("bfloat16", "float16", "float32")
# The integer options' allowed ranges, one checker each for the flag and for a --configs entry's key.
_INTEGERS = {"block_size": BLOCK_SIZE, "num_blocks": BLOCKS, "max_num_seqs": integer(1, 1_000_000),
             "max_num_batched_tokens": POSITIVE_TOKENS, "max_model_len": integer(2, MAX_TOKENS),
             "sink_tokens": TOKENS, "window_tokens": TOKENS}
# The string options whose values are a fixed list (the policy names are checked by the core's config).
_CHOICES = {"dtype": MODEL_DTYPES, "kv_cache_dtype": ("auto", *SIM_KV_DTYPES), "position_mode": ("original", "shifted")}


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    d = EngineOptions()
    p.add_argument("--block-size", type=_INTEGERS["block_size"], default=d.block_size)
    p.add_argument("--num-blocks", type=_INTEGERS["num_blocks"], default=None,
                   help="KV blocks (default: what --kv-cache-memory holds)")
    p.add_argument("--kv-cache-memory", type=parse_bytes, default=d.kv_cache_memory, help="KV cache size, e.g. 64MiB")
    p.add_argument("--dtype", default=d.dtype, choices=MODEL_DTYPES, help="model dtype")
    p.add_argument("--kv-cache-dtype", default=d.kv_cache_dtype, choices=_CHOICES["kv_cache_dtype"],
                   help="KV cache dtype: auto (the model's), float16, bfloat16, float32, fp8_e4m3 or int8 "
                        "(quantized: ~2x the blocks for the same --kv-cache-memory)")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--eviction", default=d.eviction_policy, help="lru, fifo, lfu or s3fifo")
    p.add_argument("--preemption", default=d.preemption_mode, help="recompute or swap")
    p.add_argument("--victim", default=d.victim_policy, help="newest, lowest_priority or longest_remaining")
    p.add_argument("--schedule", default=d.schedule, help="mixed or prefill_first")
    p.add_argument("--scheduler-reserve-full-isl", action=argparse.BooleanOptionalAction,
                   default=d.scheduler_reserve_full_isl,
                   help="admit a waiting request only when its whole prompt fits in the free KV blocks (vLLM's "
                        "default); --no-scheduler-reserve-full-isl: a first chunk that fits is enough (vLLM <= 0.10)")
    p.add_argument("--swap-space", type=parse_bytes, default=d.swap_space, help="CPU swap space, e.g. 64MiB")
    p.add_argument("--max-num-seqs", type=_INTEGERS["max_num_seqs"], default=d.max_num_seqs)
    p.add_argument("--max-num-batched-tokens", type=_INTEGERS["max_num_batched_tokens"],
                   default=d.max_num_batched_tokens)
    p.add_argument("--no-chunked-prefill", action="store_true")
    p.add_argument("--max-model-len", type=_INTEGERS["max_model_len"], default=None)
    p.add_argument("--sink-tokens", type=_INTEGERS["sink_tokens"], default=0)
    p.add_argument("--window-tokens", type=_INTEGERS["window_tokens"], default=0)
    p.add_argument("--position-mode", default=d.position_mode, choices=_CHOICES["position_mode"],
                   help="with a window: retained tokens keep their positions (original) or take their positions "
                        "within the cache (shifted, StreamingLLM; RoPE models, torch/cpu attention)")


def options_from_args(args: argparse.Namespace) -> EngineOptions:
    return EngineOptions(
        block_size=args.block_size, num_blocks=args.num_blocks, kv_cache_memory=args.kv_cache_memory,
        dtype=args.dtype, kv_cache_dtype=args.kv_cache_dtype, enable_prefix_caching=not args.no_prefix_caching,
        eviction_policy=args.eviction,
        preemption_mode=args.preemption, victim_policy=args.victim, schedule=args.schedule,
        scheduler_reserve_full_isl=args.scheduler_reserve_full_isl, swap_space=args.swap_space,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, enable_chunked_prefill=not args.no_chunked_prefill,
        max_model_len=args.max_model_len, sink_tokens=args.sink_tokens, window_tokens=args.window_tokens,
        position_mode=args.position_mode)


_SIZES = ("kv_cache_memory", "swap_space")
_RESERVED = ("validation.json", "report.md", "manifest.json")  # what `validate` writes beside the config folders
_TYPES = {"block_size": int, "num_blocks": int, "dtype": str, "kv_cache_dtype": str, "enable_prefix_caching": bool,
          "eviction_policy": str, "preemption_mode": str, "victim_policy": str, "schedule": str,
          "scheduler_reserve_full_isl": bool, "max_num_seqs": int,
          "max_num_batched_tokens": int, "enable_chunked_prefill": bool, "max_model_len": int, "sink_tokens": int,
          "window_tokens": int, "position_mode": str}


def load_configs(path: str | Path, base: EngineOptions) -> list[tuple[str, EngineOptions]]:
    """A YAML list of named configurations, each overriding `base`:

        - name: block16-prefix
          block_size: 16
          enable_prefix_caching: true
    """
    path = Path(path)
    doc = read_yaml(path, "--configs")
    if not isinstance(doc, list) or not doc:
        raise ValueError(f"{path}: a non-empty YAML list of configurations, each a mapping with a name")
    allowed = ("name", *EngineOptions.option_names())
    out, names = [], set()
    for i, entry in enumerate(doc):
        where = f"{path}: [{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise ValueError(f"{where}: a mapping with a string `name` and engine options")
        safe_name(entry["name"], f"{where}.name")  # each configuration's runs go to OUT/<name>/
        if entry["name"] in _RESERVED:
            raise ValueError(f"{where}.name: {entry['name']!r} is a file of the result set; allowed: another name")
        if entry["name"] in names:
            raise ValueError(f"{where}.name: {entry['name']!r} is used twice; allowed: unique names")
        names.add(entry["name"])
        changes = {}
        for key, value in entry.items():
            if key == "name":
                continue
            if key not in allowed:
                raise ValueError(f"{where}.{key}: unknown option; allowed: {', '.join(allowed)}")
            changes[key] = _value(f"{where}.{key}", key, value)
        out.append((entry["name"], replace(base, **changes)))
    return out


def _value(where: str, key: str, value: object) -> object:
    """One --configs value, checked as strictly as its command-line flag (type, range, choices)."""
    if key in _SIZES:
        try:
            return parse_bytes(str(value))
        except argparse.ArgumentTypeError as exc:
            raise ValueError(f"{where}: {exc}") from None
    want = _TYPES[key]
    if value is None and key in ("num_blocks", "max_model_len"):
        return None
    if want is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: must be an integer, got {short(value)}")
        try:
            return _INTEGERS[key](str(value))
        except argparse.ArgumentTypeError as exc:
            raise ValueError(f"{where}: {exc}") from None
    if not isinstance(value, want):
        raise ValueError(f"{where}: must be a {want.__name__}, got {short(value)}")
    if key in _CHOICES and value not in _CHOICES[key]:
        raise ValueError(f"{where}: {short(value)}; allowed: {', '.join(_CHOICES[key])}")
    return value
