"""Options of a component: a setting that means something only when another setting configures a component
(a CPU tier's eviction policy, sinks beside a window, swap space for swapping). `Needs` declares it on the setting
(`engine.core.settings`), and `check_needs` is the one check every side runs - the live engine's options on
construction, the command lines' flags, experiment files and `--configs` lists - so that an option for a
component that is not there is refused, naming it as the user wrote it, instead of having no effect."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from kvplan.errors import ConfigError


def kind(name: str) -> str:
    """A setting's kind ('' for a command's own flag, which `Needs` may name too)."""
    from kvplan.engine.core.settings import SETTINGS  # the declarations import this module

    return SETTINGS[name].kind if name in SETTINGS else ""


ON: Final = "on"  # a `Needs` condition: any value but the setting's off value (0, false, null)


@dataclass(frozen=True, slots=True)
class Needs:
    """The component a setting configures, and what configures it: the setting means something only when one
    of `any_of` holds ((setting, value) pairs, ON: any value but 0 / false / null). Anything else is an option
    for a component that is not there, which would otherwise be accepted and have no effect."""

    component: str  # "a CPU prefix tier": how a message names it
    any_of: tuple[tuple[str, object], ...]

    def met(self, values: Mapping[str, object]) -> bool:
        """Whether `values` (name -> value; a list: the values a command runs one by one) configure it; a
        condition on a setting `values` lacks (another side's) does not count."""
        def holds(name: str, wanted: object) -> bool:
            value = values.get(name)
            return any((v not in (None, 0, False) if wanted == ON else v == wanted)
                       for v in (value if isinstance(value, list) else [value]))

        return any(name in values and holds(name, wanted) for name, wanted in self.any_of)

    def condition(self, spell: Callable[[str], str]) -> str:
        """'engine.kv_offloading_blocks > 0 or engine.kv_offloading_size > 0', each setting as `spell` spells it."""
        def one(name: str, wanted: object) -> str:
            spelled = spell(name)
            flag = spelled.startswith("--")  # a flag takes its value after a space; a key after a colon
            if wanted != ON:
                return f"{spelled}{' ' if flag else ': '}{wanted}"
            if kind(name) == "bool":
                return spelled if flag else f"{spelled}: true"
            return f"{spelled} > 0"

        return " or ".join(one(name, wanted) for name, wanted in self.any_of)


def check_needs(values: Mapping[str, object], given: Iterable[str], spell: Callable[[str], str] = str,
                needs: Mapping[str, Needs] | None = None) -> None:
    """Refuse the first of `given` (settings the user set) whose component `values` do not configure, or which
    the `vllm_version` in `values` does not have (`Setting.since`), naming it and what would configure it as
    `spell` spells them (a flag, a key path). `needs`: the declarations' own
    (`NEEDS`), or a command's for its flags. One check for every side: the engine's options on construction,
    the command lines' flags, experiment files and `--configs` lists."""
    from kvplan.engine.core.settings import NEEDS, SETTINGS  # the declarations import this module
    from kvplan.engine.core.vllm_versions import NEWEST, since

    declared = NEEDS if needs is None else needs
    version = values.get("vllm_version", NEWEST)
    for name in given:
        first = SETTINGS[name].since if name in SETTINGS else ""
        newer = since(first) if first else ()
        versions = version if isinstance(version, list) else [version]  # a list: the values a command runs
        if newer and not any(v in newer for v in versions):  # (as `Needs.met`: one release that has it will do)
            raise ConfigError(f"{spell(name)}: vLLM {versions[0]} has no {name} (added in {first}); allowed: "
                              f"{spell('vllm_version')} {' or '.join(newer)}, or leave it out")
        need = declared.get(name)
        if need is not None and not need.met(values):
            raise ConfigError(f"{spell(name)}: needs {need.component} (none configured); allowed: "
                              f"{need.condition(spell)}, or leave it out")
