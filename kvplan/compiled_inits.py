"""Explicit `__init__`s for the dataclasses of the compiled build (`scripts/build_compiled_core.sh`).

mypyc compiles a dataclass's declared methods but leaves the ones `dataclasses` generates interpreted: every
`Request(...)`, `SchedulerOutput(...)` or `KVBlock(...)` of a compiled run goes through a Python-level `__init__`
that `dataclasses` wrote with `exec` (mypyc/mypyc#817), a few microseconds each, on every step and every block
of every probe. The build's copy of each compiled module therefore gets, for each plain dataclass in it, the
`__init__` that `dataclasses` would generate, written out as source so that mypyc compiles it like any method
(`dataclasses` keeps an `__init__` the class defines). The checkout's modules stay as they are - the field
declarations are the one declaration, and the pure-Python core keeps the generated `__init__`.

Invariant: a written `__init__` takes the same parameters in the same order, with the same defaults, and leaves
every field as `dataclasses`' would; a copy (pickle, deepcopy) is rebuilt through it from the fields. A field with
a `default_factory` takes None for "not given" (then calls the factory); so a class whose such field's annotation
admits None keeps `dataclasses`' `__init__`, as does any class this module does not model exactly: frozen or
`init=False` or `kw_only` classes, classes with bases or other decorators, with a `__post_init__` or their own
pickling, `InitVar` or `KW_ONLY` annotations, `field()` arguments other than a default, a default factory, repr,
compare, hash and metadata, and a factory that names one of the fields.

    python -m kvplan.compiled_inits FILE.py ...    rewrites each file in place (only ever a build's copies) and
                                                   prints the classes it gave an `__init__` and those it left
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

FIELD_OPTIONS = {"default", "default_factory", "repr", "compare", "hash", "metadata"}


@dataclass(slots=True)
class Written:
    """What `add_inits` did to one source: the classes given an `__init__`, and the dataclasses left as they were
    with the reason."""

    source: str
    written: list[str]
    left: list[tuple[str, str]]


@dataclass(slots=True)
class _Field:
    name: str
    annotation: str
    default: str | None  # source of the default value, None for none
    factory: str | None  # source of the default factory, None for none


def add_inits(source: str) -> Written:
    """`source` with an `__init__` appended to the body of each plain dataclass that has none (module docstring)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    written: list[str] = []
    left: list[tuple[str, str]] = []
    inserts: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef) or not any(_is_dataclass(d) for d in node.decorator_list):
            continue
        fields, reason = _fields(node)
        if fields is None:
            if reason:
                left.append((node.name, reason))
            continue
        indent = " " * node.body[0].col_offset
        inserts.append((node.end_lineno or node.lineno, _init_source(fields, indent)))
        written.append(node.name)
    for line, text in sorted(inserts, reverse=True):  # from the bottom, so earlier line numbers stay valid
        if line == len(lines) and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        lines.insert(line, text)
    return Written("".join(lines), written, left)


def _is_dataclass(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(target, ast.Name) and target.id == "dataclass") or (
        isinstance(target, ast.Attribute) and target.attr == "dataclass")


def _fields(node: ast.ClassDef) -> tuple[list[_Field] | None, str]:
    """The class's fields in order, or (None, why it keeps `dataclasses`' `__init__`; "" when it has its own)."""
    if any(isinstance(s, ast.FunctionDef) and s.name == "__init__" for s in node.body):
        return None, ""
    # (a copy rebuilt through __init__ - see _init_source - would run a __post_init__ a second time)
    own = {s.name for s in node.body if isinstance(s, ast.FunctionDef)} & {
        "__post_init__", "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__"}
    if own:
        return None, f"defines {', '.join(sorted(own))}"
    if node.bases or node.keywords:
        return None, "has base classes (inherited fields)"
    if len(node.decorator_list) != 1:
        return None, "has decorators besides @dataclass"
    decorator = node.decorator_list[0]
    for keyword in decorator.keywords if isinstance(decorator, ast.Call) else []:
        allowed = keyword.arg == "init"  # init=True, frozen=False and kw_only=False change nothing here
        if keyword.arg in ("init", "frozen", "kw_only") and not (
                isinstance(keyword.value, ast.Constant) and keyword.value.value is allowed):
            return None, f"@dataclass({keyword.arg}=...)"
    fields: list[_Field] = []
    for statement in node.body:
        if not isinstance(statement, ast.AnnAssign) or not isinstance(statement.target, ast.Name):
            continue
        annotation = ast.unparse(statement.annotation)
        if annotation.startswith(("ClassVar", "typing.ClassVar")):
            continue
        if "InitVar" in annotation or "KW_ONLY" in annotation:
            return None, f"field {statement.target.id}: {annotation}"
        value = statement.value
        default = factory = None
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "field":
            options = {k.arg: k.value for k in value.keywords}
            if value.args or not set(options) <= FIELD_OPTIONS:
                return None, f"field {statement.target.id}: field() options {sorted(map(str, options))}"
            if "default" in options:
                default = ast.unparse(options["default"])
            if "default_factory" in options:
                factory = ast.unparse(options["default_factory"])
        elif value is not None:
            default = ast.unparse(value)
        fields.append(_Field(statement.target.id, annotation, default, factory))
    names = {f.name for f in fields}
    for f in fields:
        if f.factory is None:
            continue
        if "None" in f.annotation or "Optional" in f.annotation or "Any" in f.annotation:
            return None, f"field {f.name}: a default factory on a type that admits None"
        if names & {n.id for n in ast.walk(ast.parse(f.factory)) if isinstance(n, ast.Name)}:
            return None, f"field {f.name}: its default factory names a field"
    return fields, ""


def _init_source(fields: list[_Field], indent: str) -> str:
    """The `__init__` and `__reduce__` source for `fields`, indented as the class body."""
    parameters = ["self"]
    body = []
    for f in fields:
        if f.factory is not None:
            parameters.append(f"{f.name}: {f.annotation} | None = None")
            body.append(f"self.{f.name} = ({f.factory})() if {f.name} is None else {f.name}")
        else:
            parameters.append(f"{f.name}: {f.annotation}" + ("" if f.default is None else f" = {f.default}"))
            body.append(f"self.{f.name} = {f.name}")
    inner = indent + "    "
    # A compiled class's __new__ runs its compiled __init__, so the default pickling (__new__ without arguments,
    # then the state) would fail on a required field: a copy is rebuilt through the constructor instead.
    values = "".join(f"self.{f.name}, " for f in fields)
    return (f"\n{indent}# written by kvplan.compiled_inits: the __init__ dataclasses would generate, compiled\n"
            f"{indent}def __init__({', '.join(parameters)}) -> None:\n"
            + "".join(f"{inner}{line}\n" for line in body or ["pass"])
            + f"\n{indent}def __reduce__(self) -> tuple[type, tuple[object, ...]]:\n"
            f"{inner}return (type(self), ({values}))\n")


def main(paths: list[str]) -> int:
    for path in map(Path, paths):
        result = add_inits(path.read_text())
        path.write_text(result.source)
        for name in result.written:
            print(f"__init__ written: {path}: {name}")
        for name, reason in result.left:
            print(f"__init__ left to dataclasses: {path}: {name} ({reason})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
