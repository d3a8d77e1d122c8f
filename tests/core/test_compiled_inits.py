"""kvplan.compiled_inits: the `__init__` it writes into the compiled build's copies is the one `dataclasses` would
generate - the same parameters, defaults and resulting fields - and the classes it cannot model keep theirs."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import sys
import types
from copy import deepcopy
from pathlib import Path

import pytest

from kvplan.compiled_inits import add_inits

ROOT = Path(__file__).resolve().parents[2]

SAMPLE = '''
from __future__ import annotations
import enum
from dataclasses import dataclass, field
from typing import ClassVar

class Colour(enum.IntEnum):
    RED = 1

@dataclass(slots=True, eq=False)
class Plain:
    a: int
    b: str = "x"
    c: list[int] = field(default_factory=list)
    d: Colour = Colour.RED
    e: frozenset[int] = frozenset()
    f: dict[str, int] = field(default_factory=lambda: {"k": 1}, repr=False)
    g: float = field(default=2.5, compare=False)
    h: int | None = None
    KIND: ClassVar[str] = "plain"

@dataclass
class Posted:
    a: int
    doubled: int = 0
    def __post_init__(self):
        self.doubled = 2 * self.a

@dataclass(slots=True)
class Empty:
    pass

@dataclass(frozen=True)
class Frozen:
    a: int

@dataclass
class Hidden:
    a: int
    b: int = field(init=False, default=3)

@dataclass
class Child(Plain):
    z: int = 0

@dataclass
class Maybe:
    a: list[int] | None = field(default_factory=list)

@dataclass
class Own:
    a: int
    def __init__(self, a: int = 5):
        self.a = a

class NotAData:
    a: int = 1
'''


def load(source: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    sys.modules[name] = module  # dataclasses looks its module up for string annotations
    try:
        exec(compile(source, name, "exec"), module.__dict__)
    finally:
        del sys.modules[name]
    return module


def values(obj: object) -> dict[str, object]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}  # type: ignore[arg-type]


def test_the_sample_gets_inits_exactly_where_it_can_model_them(monkeypatch: pytest.MonkeyPatch) -> None:
    result = add_inits(SAMPLE)
    assert result.written == ["Plain", "Empty"]
    assert dict(result.left) == {"Posted": "defines __post_init__",
        "Frozen": "@dataclass(frozen=...)", "Hidden": "field b: field() options ['default', 'init']",
        "Child": "has base classes (inherited fields)",
        "Maybe": "field a: a default factory on a type that admits None"}
    before, after = load(SAMPLE, "sample_before"), load(result.source, "sample_after")
    for name in result.written:  # dataclasses' own __init__ is compiled from "<string>"
        assert getattr(before, name).__init__.__code__.co_filename == "<string>"
        assert getattr(after, name).__init__.__code__.co_filename == "sample_after"
    assert after.Own(a=2).a == 2 and after.Own().a == 5  # its own __init__, untouched
    cases: list[tuple[tuple, dict]] = [((1,), {}), ((1, "y", [3]), {"h": 4}), ((), {"a": 7, "f": {}, "g": 1.0})]
    for args, kwargs in cases:
        old, new = before.Plain(*args, **kwargs), after.Plain(*args, **kwargs)
        assert values(old) == values(new)
    one, two = after.Plain(1), after.Plain(1)
    assert one.c is not two.c and one.f is not two.f  # a factory runs once per instance
    assert values(after.Empty()) == {}
    monkeypatch.setitem(sys.modules, "sample_after", after)  # where pickle finds the class
    for copy in (pickle.loads(pickle.dumps(one)), deepcopy(one)):  # rebuilt through the written __init__
        assert type(copy) is after.Plain and values(copy) == values(one) and copy.c is not one.c
    with pytest.raises(TypeError):
        after.Plain()  # the required field stays required


def compiled_modules() -> list[Path]:
    """Every module under kvplan/ that declares a dataclass (a superset of what the build compiles)."""
    return sorted(p for p in (ROOT / "kvplan").rglob("*.py") if "@dataclass" in p.read_text())


@pytest.mark.parametrize("path", compiled_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_written_init_matches_the_dataclass_one(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """For each class the writer gives an `__init__`: the same parameters in order and kind, the same defaults
    (None standing for a factory's "not given"), and the same fields from the required arguments alone."""
    source = path.read_text()
    result = add_inits(source)
    if not result.written:
        return
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    before, after = load(source, name + "_before"), load(result.source, name + "_after")
    monkeypatch.setitem(sys.modules, name + "_after", after)  # where pickle finds the classes
    for cls_name in result.written:
        old_cls, new_cls = getattr(before, cls_name), getattr(after, cls_name)
        old_sig, new_sig = inspect.signature(old_cls.__init__), inspect.signature(new_cls.__init__)
        assert [(p.name, p.kind) for p in old_sig.parameters.values()] == [
            (p.name, p.kind) for p in new_sig.parameters.values()]
        factories = {f.name for f in dataclasses.fields(old_cls) if f.default_factory is not dataclasses.MISSING}
        for p in list(old_sig.parameters.values())[1:]:
            expected = None if p.name in factories else p.default
            assert repr(new_sig.parameters[p.name].default) == repr(expected), (cls_name, p.name)  # NaN too
        required = {p.name: f"<{p.name}>" for p in list(old_sig.parameters.values())[1:] if p.default is p.empty}
        old, new = old_cls(**required), new_cls(**required)
        assert values(old).keys() == values(new).keys()
        for field_name, value in values(old).items():
            if field_name in factories:  # a factory's value may depend on when it ran (a clock)
                assert type(value).__name__ == type(values(new)[field_name]).__name__, (cls_name, field_name)
            else:  # by repr: NaN, and each module's own classes
                assert repr(value) == repr(values(new)[field_name]), (cls_name, field_name)
        assert repr(values(pickle.loads(pickle.dumps(new)))) == repr(values(new))  # rebuilt by __reduce__
