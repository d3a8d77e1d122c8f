"""Command-line flags generated from the settings declaration (`engine.core.settings`), as vLLM's `EngineArgs`
generates its CLI: one flag per setting a side reads, spelled as vLLM spells it (`--max-num-batched-tokens`,
`--enable-prefix-caching` / `--no-enable-prefix-caching`), earlier kvplan spellings kept as aliases
(`--no-prefix-caching`, `--eviction`), each value checked by the setting itself, so a bad value gets the message
the core and an experiment file give (`argument --block-size: must be an integer >= 1 and <= 256, got 0`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable

from kvplan.engine.core.settings import Setting, for_side


def flag_type(setting: Setting) -> Callable[[str], object]:
    """The argparse `type` of a setting's flag: the setting's own parse of the word."""
    field = setting.side_field()

    def parse(text: str) -> object:
        value, problem = field.parse_text(text)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = setting.name  # argparse names the type in some messages
    return parse


def _help(setting: Setting, default: object) -> str:
    shown = setting.unset if default is None and setting.unset else default
    return f"{setting.help} (default: {shown})".replace("%", "%%")


def add_setting_flags(parser: argparse.ArgumentParser, side: str, *, names: Iterable[str] | None = None,
                      defaults: dict | None = None, multiple: Iterable[str] = ()) -> None:
    """One flag per setting `side` reads (or only `names`); `defaults` overrides a default where a command has a
    reason of its own (say it there); `multiple` takes several values (`--block-size 16 32` runs one each)."""
    wanted = None if names is None else set(names)
    defaults, multiple = defaults or {}, set(multiple)
    for s in for_side(side):
        if wanted is not None and s.name not in wanted:
            continue
        default = defaults.get(s.name, s.default_on(side))
        if s.kind == "bool":
            parser.add_argument(s.flag, dest=s.name, action=argparse.BooleanOptionalAction, default=default,
                                help=_help(s, default))
            for alias in s.aliases:  # `--no-prefix-caching`: the earlier spelling of `--no-enable-prefix-caching`
                parser.add_argument(alias, dest=s.name, action="store_false" if alias.startswith("--no-")
                                    else "store_true", help=argparse.SUPPRESS)
            continue
        metavar = "{" + ",".join(s.choices) + "}" if s.kind == "choice" else s.name.upper()
        shape = dict(dest=s.name, type=flag_type(s), metavar=metavar, nargs="+" if s.name in multiple else None,
                     default=[default] if s.name in multiple else default)
        parser.add_argument(s.flag, **shape, help=_help(s, default))
        for alias in s.aliases:  # its own action, so that an error names the spelling that was typed
            parser.add_argument(alias, **shape, help=argparse.SUPPRESS)


def settings_from_args(args: argparse.Namespace, side: str) -> dict:
    """The settings `side` reads, as parsed (those a command added flags for)."""
    return {s.name: getattr(args, s.name) for s in for_side(side) if hasattr(args, s.name)}

