"""Typed YAML fields: each checks one value and, when it is wrong, says where (the key path), what it got and
what is allowed, with a did-you-mean for names.

    engine.eviction_policy: unknown value 'lur'; did you mean 'lru'? allowed: fifo, lfu, lru, s3fifo
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from dataclasses import dataclass

from kvplan.traces.schema import short_repr


class SchemaError(ValueError):
    """A value in an experiment file is not allowed; the message starts with the key path."""


def did_you_mean(value: object, allowed: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}? " if close else ""


def check_mapping(value: object, path: str, allowed: Iterable[str]) -> dict:
    """A mapping whose keys are all in `allowed` (an unknown key gets a did-you-mean)."""
    allowed = list(allowed)
    if not isinstance(value, dict):
        where = path or "the experiment"
        raise SchemaError(f"{where}: must be a mapping with keys {', '.join(allowed)}, got {short_repr(value)}")
    for key in value:
        if key not in allowed:
            where = f"{path}.{key}" if path else str(key)
            raise SchemaError(f"{where}: unknown key; {did_you_mean(key, allowed)}allowed: {', '.join(allowed)}")
    return value


@dataclass(frozen=True, slots=True)
class Field:
    """One scalar setting: its kind ('int', 'float', 'bool', 'str', 'choice'), default and bounds."""

    kind: str
    default: object = None
    choices: tuple[str, ...] = ()
    minimum: float | None = None  # inclusive
    maximum: float | None = None  # inclusive
    above: float | None = None  # exclusive lower bound
    nullable: bool = False
    help: str = ""

    def allowed(self) -> str:
        if self.kind == "choice":
            text = ", ".join(self.choices)
        elif self.kind == "bool":
            text = "true or false"
        elif self.kind == "str":
            text = "a string"
        else:
            noun = "an integer" if self.kind == "int" else "a finite number"
            def show(x: float) -> str:
                return str(int(x)) if float(x).is_integer() else f"{x:g}"

            bounds = [f">= {show(self.minimum)}" if self.minimum is not None else "",
                      f"> {show(self.above)}" if self.above is not None else "",
                      f"<= {show(self.maximum)}" if self.maximum is not None else ""]
            text = " ".join([noun, " and ".join(b for b in bounds if b)]).strip()
        return f"{text} or null" if self.nullable else text

    def check(self, value: object, path: str) -> object:
        if value is None:
            if self.nullable:
                return None
            raise SchemaError(f"{path}: must be set; allowed: {self.allowed()}")
        if self.kind == "choice":
            if value not in self.choices:
                raise SchemaError(f"{path}: unknown value {short_repr(value)}; {did_you_mean(value, self.choices)}"
                                  f"allowed: {self.allowed()}")
            return value
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise SchemaError(f"{path}: must be true or false, got {short_repr(value)}")
            return value
        if self.kind == "str":
            if not isinstance(value, str) or not value:
                raise SchemaError(f"{path}: must be a non-empty string, got {short_repr(value)}")
            return value
        return self._number(value, path)

    def _number(self, value: object, path: str) -> int | float:
        # bool is an int in Python; `block_size: true` is a mistake, not 1.
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if ok and self.kind == "int":
            ok = float(value).is_integer()
        ok = ok and (self.minimum is None or value >= self.minimum) and (self.above is None or value > self.above)
        ok = ok and (self.maximum is None or value <= self.maximum)
        if not ok:
            raise SchemaError(f"{path}: must be {self.allowed()}, got {short_repr(value)}")
        return int(value) if self.kind == "int" else float(value)


def check_fields(doc: object, path: str, fields: dict[str, Field]) -> dict:
    """Every field of a section, defaults filled in."""
    doc = {} if doc is None else doc
    check_mapping(doc, path, fields)
    return {name: field.check(doc.get(name, field.default), f"{path}.{name}") for name, field in fields.items()}
