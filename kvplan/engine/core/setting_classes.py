"""Classes made of settings: the core's config dataclasses and the sides' option classes take their fields'
defaults and checks from the registry (`engine.core.settings.SETTINGS`), by name - never by position."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import field, fields, make_dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from kvplan.engine.core.settings import SETTINGS, check_needs, for_side

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class _SettingField:
    def __repr__(self) -> str:
        return "SETTING"


# The default of a settings field in a class body (`block_size: int = SETTING`): `config_fields` / `side_fields`
# replace it by the setting's default before @dataclass reads it. Typed Any so that it stands for any field's type.
SETTING: Any = _SettingField()
T = TypeVar("T")
D = TypeVar("D", bound="DataclassInstance")


def _declare(cls: type, settings: list[tuple[str, str, object]], what: str) -> None:
    """Check that `cls`'s SETTING fields are exactly `settings` ((name, annotation, default) in declaration order)
    and give each its default."""
    declared = [(name, annotation) for name, annotation in inspect.get_annotations(cls).items()
                if cls.__dict__.get(name) is SETTING]
    wanted = [(name, annotation) for name, annotation, _ in settings]
    if declared != wanted:
        raise TypeError(f"{cls.__name__} must declare {what} as `name: type = SETTING` fields, in this order: "
                        f"{', '.join(f'{n}: {a}' for n, a in wanted)}; it declares "
                        f"{', '.join(f'{n}: {a}' for n, a in declared) or 'none'}")
    for name, _, default in settings:
        setattr(cls, name, default)


def config_fields(config: str) -> Callable[[type[T]], type[T]]:
    """Check a core config class's fields against the `config` settings of the core (apply before @dataclass): each
    is declared `name: type = SETTING`, in declaration order, and gets the setting's default."""

    def add(cls: type[T]) -> type[T]:
        # (None is the core's value only where the setting is nullable: elsewhere it means a side's derived value)
        _declare(cls, [(s.name, s.annotation if s.nullable else s.annotation.replace(" | None", ""), s.default)
                       for s in SETTINGS.values() if s.config == config and "core" in s.sides],
                 f"the {config} settings of the core")
        return cls

    return add


def side_fields(side: str) -> Callable[[type[T]], type[T]]:
    """Check a side's options class (`SimSpec`) against every setting `side` uses (apply before @dataclass): each
    is declared `name: type = SETTING`, in declaration order, with the side's type (None allowed where `unset` or
    `nullable` gives it a meaning), and gets the side's default. `check_side` checks the values."""

    def add(cls: type[T]) -> type[T]:
        _declare(cls, [(s.name, s.annotation, s.default_on(side)) for s in for_side(side)], f"the {side} settings")
        return cls

    return add


def check_settings(obj: object, config: str, prefix: str) -> None:
    """Check (and canonicalise) every setting field of `obj` in place; a problem raises after `prefix.name`."""
    for s in SETTINGS.values():
        if s.config == config and "core" in s.sides:
            object.__setattr__(obj, s.name, s.check(getattr(obj, s.name), f"{prefix}.{s.name}"))


def check_side(obj: object, side: str) -> None:
    """Check (and canonicalise) in place every setting `side` uses, as that side takes it; a problem raises after
    the setting's name."""
    for s in for_side(side):
        object.__setattr__(obj, s.name, s.side_field(side).check(getattr(obj, s.name), s.name))


def options_class(name: str, side: str, extra: tuple = (), doc: str = "", namespace: dict | None = None) -> type:
    """A dataclass of every setting `side` uses (with its side default), after `extra` (name, type, field)
    fields of its own; the values are checked on construction."""
    knobs = [(s.name, s.annotation, field(default=s.default_on(side))) for s in for_side(side)]

    def __post_init__(self: object) -> None:
        check_side(self, side)
        # an option set away from its default for a component these options do not configure has no effect
        values = {s.name: getattr(self, s.name) for s in for_side(side)}
        check_needs(values, [s.name for s in for_side(side) if values[s.name] != s.default_on(side)])

    cls = make_dataclass(name, [*extra, *knobs], slots=True, namespace={"__post_init__": __post_init__,
                                                                   **(namespace or {})})
    cls.__doc__ = doc
    return cls


def core_config(cls: type[D], source: object, **derived: object) -> D:
    """A core config (`CacheConfig`, `SchedulerConfig`) from any object holding its settings (`EngineOptions`,
    `SimSpec`), by name - never by position; `derived` are the values the side worked out itself (num_blocks from
    memory, max_model_len from the model). A setting the side does not hold keeps the core's default."""
    names = [f.name for f in fields(cls)]
    return cls(**{n: getattr(source, n) for n in names if n not in derived and hasattr(source, n)}, **derived)
