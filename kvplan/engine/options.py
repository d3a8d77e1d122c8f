"""`EngineOptions`: every setting the live engine takes, derived from the one declaration (`engine.core.settings`).

`LLM(model, **settings)` and the engine commands' flags (`kvplan.settings_cli`) take exactly these names; a value is
checked on construction with the message every side gives. None for `num_blocks`, `max_model_len` and
`kv_cache_memory` means what the engine derives (from memory or the model), as each setting's `unset` says.
"""

from __future__ import annotations

from dataclasses import fields

from kvplan.engine.core.setting_classes import options_class
from kvplan.engine.core.settings import SETTINGS, SHAPE_SETTINGS, SIM_ONLY_TIERS, canonical
from kvplan.errors import ConfigError


def _option_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


EngineOptions = options_class(
    "EngineOptions", "engine", doc="Serving settings of the live engine (names follow vLLM's engine arguments).",
    namespace={"option_names": classmethod(_option_names)})


def engine_options(settings: dict) -> EngineOptions:
    """`EngineOptions` from keyword settings, earlier names accepted (`num_gpu_blocks_override` -> `num_blocks`)."""
    out: dict = {}
    for key, value in settings.items():
        name = canonical(key)
        if name in out:
            first = next(k for k in settings if k != key and canonical(k) == name)
            raise ConfigError(f"{key}: sets {name}, which {first} already sets; allowed: one of the two")
        if name in SHAPE_SETTINGS:  # a deployment shape only the simulator prices
            setting = SETTINGS[name]
            if value == setting.default:
                continue
            raise ConfigError(f"{key}: {value!r}: the live engine runs one model instance on one device; allowed: "
                              f"{setting.default!r} (kvplan simulate --{name.replace('_', '-')} prices it)")
        if name in SIM_ONLY_TIERS:
            check_sim_only(name, value, key)
            continue
        out[name] = value
    return EngineOptions(**out)


def check_sim_only(name: str, value: object, where: str) -> None:
    """A simulator-only tier setting given to the live engine: checked as a setting, then refused unless it is
    the default (no tier)."""
    setting = SETTINGS[name]
    value = setting.check(value, where)
    if value != setting.default:
        raise ConfigError(f"{where}: {value!r}: {SIM_ONLY_TIERS[name]}; allowed on the live engine: "
                          f"{setting.default!r}")
