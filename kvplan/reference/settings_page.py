"""reference/settings.md: every serving setting of the registry (`engine.core.settings.SETTINGS`), as declared.

One overview table (name, vLLM's name, kind, default, unit, sides) and one section per setting with what it
does, what it accepts, where it is written (flag, experiment key, Python keyword) and which commands take it.
Nothing here is typed twice: a setting added to the registry appears on the next build.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from kvplan.engine.core import settings as registry
from kvplan.engine.core.settings import Setting
from kvplan.reference.cells import allowed, code, prose, size, table, value
from kvplan.reference.cli_page import commands

# What each side is (the registry's docstring says it at length); the page explains its `sides` column with it.
SIDE_MEANING = {
    "core": "the scheduler and the KV manager both sides share (a field of `CacheConfig` or `SchedulerConfig`)",
    "engine": "the live engine (`EngineOptions`, `LLM(**settings)`, the engine commands' flags)",
    "sim": "the simulator (`SimSpec`, `kvplan simulate`'s flags, an experiment file's `engine:` section)",
}


def default_text(s: Setting) -> str:
    shown = size(s.default) if s.kind == "bytes" and isinstance(s.default, int) else value(s.default)
    text = code(shown)
    derived = [side for side in registry.SIDES if s.derived_on(side) and side in s.sides]
    if derived:
        text += f" (core); derived on {' and '.join(derived)}"
    return text


def vllm_text(s: Setting, short: bool = False) -> str:
    """vLLM's name of the knob ('same' in the overview where it is the setting's), or 'kvplan only'."""
    if not s.vllm:
        return "kvplan only"
    return "same" if short and s.vllm == s.name else code(s.vllm)


def flag_commands(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Option string -> the commands that take it (`kvplan simulate`, ...), in the CLI's order."""
    taken: dict[str, list[str]] = {}
    for prog, sub, _, _ in commands(parser):
        for action in sub._actions:
            for option in action.option_strings:
                taken.setdefault(option, []).append(prog)
    return taken


def section(s: Setting, taken: Mapping[str, list[str]]) -> list[str]:
    flags = [s.flag, *([f"--no-{s.flag[2:]}"] if s.kind == "bool" else [])]
    written = [f"flag {' / '.join(code(f) for f in flags)}"]
    if s.aliases:
        written.append(f"earlier spellings {', '.join(code(a) for a in s.aliases)}")
    if "sim" in s.sides:
        written.append(f"experiment key {code('engine.' + s.name)}"
                       + (f" (earlier {', '.join(code('engine.' + k) for k in s.keys)})" if s.keys else ""))
    if "engine" in s.sides:
        written.append(f"Python {code(f'LLM({s.name}=...)')}")
    lines = [f"### {s.name}", "", prose(f"{s.help[:1].upper()}{s.help[1:]}."), "",
             f"- **Kind:** {s.kind}" + (f" · **unit:** {s.unit}" if s.unit else "") + f" · **default:** "
             f"{default_text(s)}",
             f"- **Allowed:** {prose(allowed(s.side_field('sim') if 'sim' in s.sides else s))}",
             f"- **vLLM:** {vllm_text(s)}",
             f"- **Sides:** {', '.join(side for side in registry.SIDES if side in s.sides)}",
             f"- **Written as:** {'; '.join(written)}"]
    if s.unset:
        lines.append(f"- **When not set** ({' and '.join(sorted(s.unset_sides & s.sides))}): {prose(s.unset)}")
    if s.needs is not None:
        spell = (lambda name: name) if "sim" not in s.sides else (lambda name: "engine." + name)
        lines.append(f"- **Only with:** {s.needs.component} ({s.needs.condition(spell)})")
    if s.name in registry.SIM_ONLY_TIERS:
        lines.append(f"- **Live engine:** {prose(registry.SIM_ONLY_TIERS[s.name])}")
    if taken.get(s.flag):
        lines.append(f"- **Commands:** {', '.join(code(c) for c in taken[s.flag])}")
    return [*lines, ""]


def settings_page(settings: Mapping[str, Setting] | None = None,
                  parser: argparse.ArgumentParser | None = None) -> str:
    """The page for `settings` (default: the registry as it is now) and the commands of `parser` (default: the
    `kvplan` parser)."""
    from kvplan.cli import build_parser

    settings = registry.SETTINGS if settings is None else settings
    taken = flag_commands(build_parser() if parser is None else parser)
    rows = [[f"[{code(s.name)}](#{s.name})", vllm_text(s, short=True), s.kind,
             "derived" if any(s.derived_on(side) for side in s.sides) else default_text(s), s.unit,
             ", ".join(side for side in registry.SIDES if side in s.sides)] for s in settings.values()]
    lines = ["# Settings", "",
             f"Every serving setting kvplan has ({len(settings)}), generated from the settings registry "
             "(`kvplan/engine/core/settings.py`) when the docs are built. A setting has one name everywhere: "
             "vLLM's where vLLM has the knob, as the flag (`--block-size`), as the key of an experiment file's "
             "`engine:` section (`engine.block_size`) and as the live engine's keyword (`LLM(block_size=16)`). "
             "A bad value gets the same message on every side.", "",
             "The **sides** say who reads a setting:", "",
             *(f"- **{side}**: {meaning}" for side, meaning in SIDE_MEANING.items()), "",
             "A *derived* default is worked out from the memory, the model or the trace when the setting is left "
             "out (the setting's section says how, and the value the core, which has neither, uses). *same*: "
             "vLLM's name is the setting's.", "",
             *table(["setting", "vLLM name", "kind", "default", "unit", "sides"], rows), "",
             "## Each setting", ""]
    for s in settings.values():
        lines += section(s, taken)
    return "\n".join(lines).rstrip("\n") + "\n"
