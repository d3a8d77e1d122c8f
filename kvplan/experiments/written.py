"""What an experiment file wrote, as it wrote it: a setting under its current or an earlier name (one setting
spelled twice is an error naming both paths, where a mapping would silently keep one of the two), and options
of a component (`engine.core.needs`) that must apply at some point of the experiment."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING

from kvplan.engine.core.settings import KEY_ALIASES, NEEDS, Field, canonical, check_needs
from kvplan.experiments.fields import SchemaError, check_mapping

if TYPE_CHECKING:
    from kvplan.experiments.schema import Experiment


def parse_engine(doc: object, fields: dict[str, Field]) -> tuple[dict, dict[str, str]]:
    """The `engine:` section, every setting checked under the spelling the user wrote (an earlier name,
    `kv_dtype: int8`, is `kv_cache_dtype: int8` and its errors say `engine.kv_dtype`), defaults filled in; and the
    key paths as written, by current key path. Two spellings of one setting is an error naming both."""
    doc = {} if doc is None else doc
    written = spellings(check_mapping(doc, "engine", [*fields, *KEY_ALIASES]), "engine.")
    values = {name: field.check(doc[written[name].removeprefix("engine.")] if name in written else field.default,
                                written.get(name, f"engine.{name}")) for name, field in fields.items()}
    return values, {f"engine.{name}": where for name, where in written.items()}


def spellings(doc: dict, prefix: str, seen: dict[str, str] | None = None) -> dict[str, str]:
    """Each key of `doc` by its setting's current name -> its path as written (`prefix` + key); one setting
    spelled twice (`kv_dtype` and `kv_cache_dtype`, in `doc` or in `seen`, an earlier section's result) is an
    error naming both paths: one of the two values (or lists) would otherwise be dropped without a word."""
    seen = {} if seen is None else seen
    out: dict[str, str] = {}
    for key in doc:
        name = sweep_key(key) if prefix.startswith("sweep.") else canonical(key) if isinstance(key, str) else key
        where = f"{prefix}{key}"
        earlier = out.get(name) or seen.get(name)
        if earlier is not None:
            raise SchemaError(f"{where}: sets {name}, which {earlier} already sets; allowed: one of the two")
        out[name] = where
    return out


def sweep_key(key: object) -> object:
    """A sweep key with an earlier setting name under its current one (`engine.kv_dtype` -> `engine.kv_cache_dtype`)."""
    if isinstance(key, str) and key.startswith("engine."):
        return "engine." + canonical(key.removeprefix("engine."))
    return key


def engine_points(exp: Experiment) -> Iterator[dict]:
    """The engine settings of every point, in `points.expand`'s order (the grid's cross product, then each zipped
    row) - without building the rest of each point."""
    grid = [dict(zip(exp.sweep_grid, row, strict=True)) for row in itertools.product(*exp.sweep_grid.values())]
    rows = len(next(iter(exp.sweep_zip.values()))) if exp.sweep_zip else 1
    for values in ({**g, **{k: v[i] for k, v in exp.sweep_zip.items()}} for g in grid for i in range(rows)):
        yield {**exp.base["engine"], **{k.removeprefix("engine."): v for k, v in values.items()
                                        if k.startswith("engine.")}}


def check_components(exp: Experiment, fields: dict[str, Field]) -> None:
    """Each value the file gives an option of a component (`engine.core.settings.Needs`: a tier's eviction
    policy, sinks of a window) must apply at some point: some point with that value configures the component.
    A grid crossing a tier's size with its policy has points without the tier, where the policy has no effect
    (the baseline); a value that applies at no point is refused, named as written (a sweep's by its index)."""
    given = [name for name in NEEDS if f"engine.{name}" in exp.written]
    applies: dict[tuple[str, str], bool] = {}
    for values in engine_points(exp) if given else ():
        for name in given:
            key = (name, repr(values[name]))
            # a sweep's default value is the option left out (sinks [0, 4, 4] beside windows [0, 1024, 2048])
            left_out = exp.written[f"engine.{name}"].startswith("sweep.") and values[name] == fields[name].default
            applies[key] = applies.get(key, False) or left_out or NEEDS[name].met(values)
    for name, value in (key for key, met in applies.items() if not met):
        where = exp.written[f"engine.{name}"]
        swept = exp.sweep_grid.get(f"engine.{name}") or exp.sweep_zip.get(f"engine.{name}")
        if swept is not None:
            where += f"[{list(map(repr, swept)).index(value)}]"
        spelled = {**exp.written, f"engine.{name}": where}
        check_needs({}, [name], lambda n, s=spelled: s.get(f"engine.{n}", f"engine.{n}"))
