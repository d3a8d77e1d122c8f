"""Command-line flags generated from the settings declaration (`engine.core.settings`), as vLLM's `EngineArgs`
generates its CLI: one flag per setting a side reads, spelled as vLLM spells it (`--max-num-batched-tokens`,
`--enable-prefix-caching` / `--no-enable-prefix-caching`), earlier kvplan spellings kept as aliases
(`--no-prefix-caching`, `--eviction`), each value checked by the setting itself, so a bad value gets the message
the core and an experiment file give (`argument --block-size: must be an integer >= 1 and <= 256, got 0`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from functools import cache

from kvplan.engine.core.settings import SETTINGS, Needs, Setting, check_needs, for_side
from kvplan.errors import ConfigError

GIVEN = "_settings_given"  # the namespace attribute: setting name -> the flag that set it, as typed


@cache
def recording(action: type[argparse.Action]) -> type[argparse.Action]:
    """`action` that also records which flag set its setting (GIVEN), and refuses a second spelling of the same
    setting (`--kv-dtype fp8 --kv-cache-dtype int8`: one of them would be dropped without a word). The same
    flag twice keeps argparse's rule, the last one wins; `--x` and `--no-x` are one flag."""

    class Recording(action):  # type: ignore[valid-type, misc]
        def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                     option_string: str | None = None) -> None:
            given = namespace.__dict__.setdefault(GIVEN, {})
            spelled = (option_string or "").replace("--no-", "--", 1) \
                if option_string in self.option_strings and len(self.option_strings) > 1 else option_string
            earlier = given.get(self.dest)
            if earlier is not None and earlier[0] != spelled:
                raise argparse.ArgumentError(self, f"{option_string} and {earlier[1]} are two spellings of "
                                                   f"{self.dest}; allowed: one of them")
            given[self.dest] = (spelled, option_string)
            super().__call__(parser, namespace, values, option_string)

    Recording.__name__ = f"Recording{action.__name__}"
    return Recording


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
            parser.add_argument(s.flag, dest=s.name, action=recording(argparse.BooleanOptionalAction),
                                default=default, help=_help(s, default))
            for alias in s.aliases:  # `--no-prefix-caching`: the earlier spelling of `--no-enable-prefix-caching`
                parser.add_argument(alias, dest=s.name, action=recording(argparse._StoreFalseAction
                                    if alias.startswith("--no-") else argparse._StoreTrueAction),
                                    help=argparse.SUPPRESS)
            continue
        metavar = "{" + ",".join(s.choices) + "}" if s.kind == "choice" else s.name.upper()
        shape = dict(dest=s.name, type=flag_type(s), metavar=metavar, action=recording(argparse._StoreAction),
                     nargs="+" if s.name in multiple else None,
                     default=[default] if s.name in multiple else default)
        parser.add_argument(s.flag, **shape, help=_help(s, default))
        for alias in s.aliases:  # its own action, so that an error names the spelling that was typed
            parser.add_argument(alias, **shape, help=argparse.SUPPRESS)


def settings_from_args(args: argparse.Namespace, side: str) -> dict:
    """The settings `side` reads, as parsed (those a command added flags for)."""
    return {s.name: getattr(args, s.name) for s in for_side(side) if hasattr(args, s.name)}


def given_flags(args: argparse.Namespace) -> dict[str, str]:
    """Setting name -> the flag that set it, as typed, for the settings flags of this command line."""
    return {name: typed for name, (_, typed) in getattr(args, GIVEN, {}).items()}


def check_flag_needs(args: argparse.Namespace, settings: dict, needs: dict[str, Needs] | None = None) -> None:
    """Refuse a setting's flag typed for a component `settings` (as the command will use them) do not configure:
    `--kv-offloading-eviction fifo` without a CPU tier (`engine.core.settings.check_needs`), named as typed.
    `needs`: a command's own flags' (`--length-penalty` without `--beam-width`; given when not None)."""
    given = given_flags(args) if needs is None else {name: "--" + name.replace("_", "-") for name in needs
                                                     if settings.get(name) is not None}

    def spell(name: str) -> str:
        return given.get(name) or (SETTINGS[name].flag if name in SETTINGS else "--" + name.replace("_", "-"))

    try:
        check_needs(settings, given, spell, needs)
    except ConfigError as exc:
        flag, _, rest = str(exc).partition(": ")
        raise ConfigError(f"argument {flag}: {rest}") from None

