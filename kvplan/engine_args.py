"""Engine options on the command line (`kvplan serve`, `replay`, `validate`) and in YAML config lists, both from
the settings declaration (`engine.core.settings`)."""

from __future__ import annotations

import argparse
from dataclasses import asdict, replace
from pathlib import Path

from kvplan.engine.core.settings import (  # noqa: F401 (MODEL_DTYPES: commands')
    MODEL_DTYPES,
    SETTINGS,
    SIM_ONLY_TIERS,
    canonical,
    check_needs,
)
from kvplan.engine.options import EngineOptions, check_sim_only
from kvplan.errors import ConfigError, UserError, listed
from kvplan.output import safe_name
from kvplan.settings_cli import add_setting_flags, check_flag_needs, settings_from_args
from kvplan.traces.specs import read_yaml


def parse_bytes(text: str) -> int:
    """'64MiB', '512m', '1e8', '1GB' -> bytes (a size setting's parse: at least 1 byte, at most this machine's
    memory)."""
    value, problem = SETTINGS["kv_cache_memory"].parse(str(text))
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """Every setting the live engine reads, as a flag (kvplan.settings_cli), and the simulator-only tiers' flags,
    which it refuses (their help says so)."""
    add_setting_flags(p, "engine")
    add_setting_flags(p, "sim", names=SIM_ONLY_TIERS)


def add_lora_modules(p: argparse.ArgumentParser) -> None:
    """vLLM's `--lora-modules name=path [name=path ...]`: the adapters an engine command serves. Not a setting
    (settings hold one scalar each): the commands that run an engine take it here, in one place."""
    p.add_argument("--lora-modules", nargs="+", metavar="NAME=PATH", default=None,
                   help="LoRA adapters (PEFT directories: adapter_config.json + adapter_model.safetensors) a request "
                        "may name, as vLLM's serve takes them; needs --enable-lora")


def lora_modules_from_args(args: argparse.Namespace) -> dict[str, str]:
    """{name: path} of `--lora-modules`, refused without --enable-lora (before any model loads)."""
    out: dict[str, str] = {}
    for spec in args.lora_modules or []:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UserError(f"argument --lora-modules: {spec!r} is not name=path; allowed: name=path, e.g. "
                            "sql=/adapters/sql")
        if name in out:
            raise UserError(f"argument --lora-modules: adapter name {name!r} is given twice; allowed: distinct names")
        out[name] = path
    if out and not getattr(args, "enable_lora", False):
        raise UserError("argument --lora-modules: needs LoRA on; allowed: --enable-lora, or leave it out")
    if getattr(args, "enable_lora", False):  # the checks across LoRA settings, before the model loads
        from kvplan.engine.core.lora import check_max_lora_rank, max_cpu_loras_of

        try:
            check_max_lora_rank(args.max_lora_rank)
            max_cpu_loras_of(args.max_loras, args.max_cpu_loras)
        except ConfigError as exc:
            key, _, rest = str(exc).partition(": ")
            raise ConfigError(f"argument {SETTINGS[key].flag}: {rest}") from None
    return out


def options_from_args(args: argparse.Namespace) -> EngineOptions:
    for name in SIM_ONLY_TIERS:
        check_sim_only(name, getattr(args, name), "argument " + SETTINGS[name].flag)
    settings = settings_from_args(args, "engine")
    check_flag_needs(args, settings)
    return EngineOptions(**settings)


_RESERVED = ("validation.json", "report.md", "manifest.json")  # what `validate` writes beside the config folders


def load_configs(path: str | Path, base: EngineOptions) -> list[tuple[str, EngineOptions]]:
    """A YAML list of named configurations, each overriding `base`:

        - name: block16-prefix
          block_size: 16
          enable_prefix_caching: true
    """
    path = Path(path)
    doc = read_yaml(path, "--configs")
    if not isinstance(doc, list) or not doc:
        raise UserError(f"{path}: not a list of configurations; allowed: a non-empty YAML list of mappings, each "
                        "with a name")
    allowed = ("name", *EngineOptions.option_names())
    out, names = [], set()
    for i, entry in enumerate(doc):
        where = f"{path}: [{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise UserError(f"{where}: not a configuration; allowed: a mapping with a non-empty string `name` and "
                            "engine options")
        safe_name(entry["name"], f"{where}.name")  # each configuration's runs go to OUT/<name>/
        if entry["name"] in _RESERVED:
            raise UserError(f"{where}.name: {entry['name']!r} is a file of the result set; allowed: another name")
        if entry["name"] in names:
            raise UserError(f"{where}.name: {entry['name']!r} is used twice; allowed: unique names")
        names.add(entry["name"])
        changes, written = {}, {}
        for key, value in entry.items():
            if key == "name":
                continue
            name = canonical(key)
            if name in written:  # `kv_dtype` and `kv_cache_dtype`: one of the two would be dropped
                raise UserError(f"{where}.{key}: sets {name}, which {where}.{written[name]} already sets; allowed: "
                                "one of the two")
            written[name] = key
            if name in SIM_ONLY_TIERS:
                check_sim_only(name, value, f"{where}.{key}")
                continue
            if name not in allowed:
                raise UserError(f"{where}.{key}: unknown option; allowed: {listed(allowed)}")
            changes[name] = _value(f"{where}.{key}", name, value)
        merged = {**asdict(base), **changes}
        spelled = {n: f"{where}.{key}" for n, key in written.items()}
        check_needs(merged, [n for n in written if n in changes], lambda n, s=spelled, w=where: s.get(n, f"{w}.{n}"))
        out.append((entry["name"], replace(base, **changes)))
    return out


def _value(where: str, key: str, value: object) -> object:
    """One --configs value, checked by its setting (the message its flag and the core give)."""
    return SETTINGS[key].side_field().check(value, where)
