"""Typed YAML sections. A field (`engine.core.settings.Field`, the kind every setting is) checks one value and,
when it is wrong, says where (the key path), what it got and what is allowed, with a did-you-mean for names
(`engine.core.names`).

    engine.eviction_policy: unknown value 'lur'; did you mean 'lru'? allowed: fifo, lfu, lru, s3fifo
"""

from __future__ import annotations

from collections.abc import Iterable

from kvplan.engine.core.names import did_you_mean
from kvplan.engine.core.settings import Field
from kvplan.errors import ConfigError
from kvplan.traces.schema import listed, short_repr


class SchemaError(ConfigError):
    """A value in an experiment file is not allowed; the message starts with the key path. (A `Field` raises its
    parent, `ConfigError`, with the same shape: both are caught as `ConfigError`.)"""


def check_mapping(value: object, path: str, allowed: Iterable[str]) -> dict:
    """A mapping whose keys are all in `allowed` (an unknown key gets a did-you-mean)."""
    allowed = list(allowed)
    if not isinstance(value, dict):
        where = path or "the experiment"
        raise SchemaError(f"{where}: must be a mapping with keys {listed(allowed)}, got {short_repr(value)}")
    for key in value:
        if key not in allowed:
            where = f"{path}.{key}" if path else str(key)
            raise SchemaError(f"{where}: unknown key; {did_you_mean(key, allowed)}allowed: {listed(allowed)}")
    return value


def check_fields(doc: object, path: str, fields: dict[str, Field]) -> dict:
    """Every field of a section, defaults filled in."""
    doc = {} if doc is None else doc
    check_mapping(doc, path, fields)
    return {name: field.check(doc.get(name, field.default), f"{path}.{name}") for name, field in fields.items()}
