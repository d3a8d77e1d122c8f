"""Checking YAML spec fields: every error names the key path and what is allowed (`arrivals.cv: must be > 0`).

Every value quoted in a message goes through `shown`, which is bounded: a YAML alias bomb (a few lines that
expand to billions of nested items) must not turn one error line into gigabytes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NoReturn, TypeGuard

import yaml

from kvplan import limits
from kvplan.errors import UserError
from kvplan.traces.schema import SHOWN_CHARS, TraceFormatError, short_repr

# Specs, profiles and configs are a few KB; a file this large is not one, and reading it would only cost memory.
MAX_FILE_BYTES = 16 * 2**20
shown = short_repr  # every quoted value, bounded (see traces.schema.short_repr)


def shown_key(key: object) -> str:
    """A mapping key for a key path: as written when it is a short printable string, else bounded like `shown`."""
    return key if isinstance(key, str) and key.isprintable() and len(key) <= SHOWN_CHARS else shown(key)


def check_file(path: str | Path, flag: str, allowed: str) -> Path:
    """`path` if it names a regular file, else one line naming `flag` and what is allowed: never an OSError
    without the flag, and never an open() of a FIFO (it would wait for a writer forever)."""
    if not str(path).strip():  # Path("") is the current directory
        raise UserError(f"{flag}: empty path; allowed: {allowed}")
    path = Path(path)
    try:
        is_dir, exists, is_file = path.is_dir(), path.exists(), path.is_file()
    except OSError as exc:  # a name past the system's limit, a component without permission: the stat fails
        shown = short_repr(str(path), 40)
        raise UserError(f"{flag}: {shown} ({len(str(path))} characters): cannot be looked up: "
                        f"{exc.strerror or exc}; allowed: {allowed}") from None
    if is_dir:
        raise UserError(f"{flag}: {path}: is a directory; allowed: {allowed}")
    if not exists:
        raise UserError(f"{flag}: {path}: no such file; allowed: {allowed}")
    if not is_file:
        raise UserError(f"{flag}: {path}: not a regular file; allowed: {allowed}")
    return path


def read_text(path: str | Path, flag: str) -> str:
    """The UTF-8 text of a small input file; every way it cannot be read is one line naming it."""
    path = check_file(path, flag, "a file")
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise UserError(f"{path}: {size} bytes; allowed: at most {MAX_FILE_BYTES} (a spec is a few KB)")
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8-sig")  # a BOM some editors write is not content
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        problem = f"not UTF-8 text (byte 0x{data[exc.start]:02x})"
        raise UserError(f"{path}:{line}: {problem}; allowed: a UTF-8 file") from None


class YamlLimit(yaml.composer.ComposerError):
    """A document past one of the limits.MAX_YAML_* bounds, found while it is composed: nothing has read it yet."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load, bounded, and strict about keys.

    Bounded: every document is checked while it is composed into nodes, before one value is built, so no caller
    (experiments, specs, profiles, --retime) ever walks an alias bomb. Each node's size with every alias expanded
    is known when the node is complete (1 + its children's sizes, an alias adding its target's size, memoized on
    the target), so a document's expanded size is summed as it is read and refused at the alias or node that
    takes it past MAX_YAML_NODES, with its line. An alias to a node that is not complete yet is recursive (a
    value that contains itself: every reader of it would loop), and is refused too. The alias count is bounded
    on the way, and so is the nesting depth as readers see it, aliases expanded: each complete node's height is
    memoized like its size, so a chain of aliases, each one level deeper than the last, is refused where the
    document written is shallow but the value read would nest past MAX_YAML_DEPTH (and recurse past Python's
    stack in whatever walks it).

    Strict: a mapping that repeats a key is an error at the repeat's line: YAML says keys are unique, and
    PyYAML silently keeps the last value (a sweep's second `grid:` would replace the first). A scalar that
    Python cannot build (a 5,000-digit integer, the date 2024-13-45) is an error at its line, not a ValueError.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._expanded = 0  # values in the document so far, aliases expanded
        self._aliases = 0
        self._depth = 0  # mappings and sequences open around the node being composed
        self._sizes: dict[int, tuple[int, int]] = {}  # id(anchored node) -> (expanded size, height), once complete
        self._heights: list[int] = [0]  # per open node: the greatest height among its children so far

    def compose_document(self) -> yaml.Node | None:
        self._expanded = self._aliases = self._depth = 0
        self._sizes, self._heights = {}, [0]
        return super().compose_document()

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            target = self.anchors.get(event.anchor or "")
            if target is not None:  # an undefined alias is PyYAML's error to report
                alias = f"alias *{_cut(event.anchor or '')}"
                self._aliases += 1
                if self._aliases > limits.MAX_YAML_ALIASES:
                    _refuse(f"{alias} is the document's {limits.MAX_YAML_ALIASES + 1}th; allowed: at most "
                            f"{limits.MAX_YAML_ALIASES} aliases", event.start_mark)
                known = self._sizes.get(id(target))
                if known is None:
                    _refuse(f"{alias} refers to a value that contains it (a recursive value); allowed: aliases to "
                            "complete values", event.start_mark)
                size, height = known
                self._grow(size, alias, event.start_mark)
                self._nest(self._depth + height, f"{alias}: ", event.start_mark)
                self._heights[-1] = max(self._heights[-1], height)
            return super().compose_node(parent, index)
        self._depth += 1
        self._nest(self._depth, "", event.start_mark)
        start = self._expanded
        self._grow(1, "this value", event.start_mark)
        self._heights.append(0)
        node = super().compose_node(parent, index)
        height = 1 + self._heights.pop()
        self._heights[-1] = max(self._heights[-1], height)
        self._depth -= 1
        if getattr(event, "anchor", None) is not None:
            self._sizes[id(node)] = (self._expanded - start, height)
        return node

    def _nest(self, depth: int, what: str, mark: Any) -> None:
        if depth > limits.MAX_YAML_DEPTH:
            _refuse(f"{what}nested more than {limits.MAX_YAML_DEPTH} deep with its aliases expanded; allowed: at "
                    f"most {limits.MAX_YAML_DEPTH} levels (a spec nests ~5)", mark)

    def _grow(self, size: int, what: str, mark: Any) -> None:
        self._expanded += size
        if self._expanded > limits.MAX_YAML_NODES:
            _refuse(f"{what} takes the document past {limits.MAX_YAML_NODES} values with its aliases expanded; "
                    f"allowed: at most {limits.MAX_YAML_NODES} (a spec holds a few hundred)", mark)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> object:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as exc:  # int("1" * 5000), date(2024, 13, 45)
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {shown(node.value) if isinstance(node.value, str) else 'this value'} "
                f"({_cut(str(exc))})", node.start_mark) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` merges; its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                repeated = key in seen
            except TypeError:  # an unhashable key: construct_mapping below reports it
                continue
            if repeated:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {shown_key(key)} repeats the key of line {seen[key]}; allowed: each key once",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def _refuse(problem: str, mark: Any) -> NoReturn:
    raise YamlLimit(None, None, problem, mark)


def safe_load(text: str) -> object:
    """`yaml.safe_load`, bounded (MAX_YAML_BYTES, and the composing limits of _UniqueKeyLoader) and with unique
    mapping keys. A limit passed is a YamlLimit (a yaml.YAMLError with the position)."""
    size = len(text.encode("utf-8", "surrogatepass")) if len(text) <= limits.MAX_YAML_BYTES else len(text)
    if size > limits.MAX_YAML_BYTES:
        _refuse(f"{size}{'' if len(text) <= limits.MAX_YAML_BYTES else '+'} bytes of YAML; allowed: at most "
                f"{limits.MAX_YAML_BYTES} (a spec is a few KB)", None)
    return yaml.load(text, Loader=_UniqueKeyLoader)


def read_yaml(path: str | Path, flag: str) -> object:
    """The YAML document at `path` (safe_load); a missing file, a syntax error or a limit passed is one line
    naming it."""
    text = read_text(path, flag)
    path = Path(path)
    try:
        return safe_load(text)
    except YamlLimit as exc:
        mark = exc.problem_mark
        raise UserError(f"{path}{f':{mark.line + 1}' if mark is not None else ''}: {exc.problem}") from None
    except yaml.MarkedYAMLError as exc:  # syntax errors and unsafe tags (`!!python/object`) carry a position
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = exc.problem or exc.context or "syntax error"
        raise UserError(f"{where}: not valid YAML: {_cut(problem)}") from None
    except yaml.reader.ReaderError as exc:  # a control character such as NUL
        line = text.count("\n", 0, exc.position) + 1
        raise UserError(f"{path}:{line}: not valid YAML: {_cut(str(exc).splitlines()[0])}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML: {_cut(str(exc).splitlines()[0])}") from None
    except RecursionError:
        raise UserError(f"{path}: not valid YAML: nested too deeply; allowed: a plain mapping") from None


def _cut(text: str, limit: int = 2 * SHOWN_CHARS) -> str:
    """A parser's message on one line, bounded (it may quote a tag or a token the user wrote)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def spec_error(path: str, problem: str) -> TraceFormatError:
    return TraceFormatError(f"{path}: {problem}")


def numeric_hint(value: object) -> str:
    """YAML 1.1 reads `1e6` (no dot) as a string: say so, or the error would look absurd."""
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return ""
        return " (a string: YAML reads 1e6 and 1.0e6 as text; write 1.0e+6 or 1000000)"
    return ""


def is_number(value: object) -> TypeGuard[int | float]:
    """A real, finite number: not a bool, not NaN or infinity, not an integer beyond the float range."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) if isinstance(value, float) else abs(value) < 2.0**1000


def _fmt(bound: float) -> str:
    """A bound as people write it: 10000000, not 1e+07; 0.01, not 0.010000."""
    if isinstance(bound, int) or (bound.is_integer() and abs(bound) < 1e15):
        return str(int(bound))
    return f"{bound:g}"


def _allowed(kind: str, positive: bool, minimum: float | None, maximum: float | None, why: str) -> str:
    parts = [f">= {_fmt(minimum)}" if minimum is not None else "> 0" if positive else ""]
    parts.append(f"<= {_fmt(maximum)}" if maximum is not None else "")
    bounds = " and ".join(p for p in parts if p)
    return f"; allowed: {kind}{' ' + bounds if bounds else ''}{f' ({why})' if why else ''}"


def number(spec: dict, key: str, path: str, *, default: float | None = None, positive: bool = True,
           minimum: float | None = None, maximum: float | None = None, why: str = "",
           kind: str = "a number") -> float:
    """A finite numeric field of a spec, range-checked, with its YAML key path in any error.

    Booleans are not numbers (`rate: true` is a mistake, not 1), and NaN or infinity is never a setting.
    """
    value = spec.get(key, default)
    where = f"{path}.{key}"
    allowed = _allowed(kind, positive, minimum, maximum, why)
    if value is None:
        raise spec_error(where, f"required{allowed}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise spec_error(where, f"must be a number, got {shown(value)}{numeric_hint(value)}{allowed}")
    if isinstance(value, float) and not math.isfinite(value):
        raise spec_error(where, f"must be a finite number, got {value!r}{allowed}")
    if positive and value <= 0:
        raise spec_error(where, f"must be > 0, got {shown(value)}{allowed}")
    if minimum is not None and value < minimum:
        raise spec_error(where, f"must be >= {_fmt(minimum)}, got {shown(value)}{allowed}")
    if maximum is not None and value > maximum:
        raise spec_error(where, f"must be <= {_fmt(maximum)}, got {shown(value)}{allowed}")
    if not is_number(value):  # an integer beyond the float range, where no maximum caught it
        raise spec_error(where, f"must be a finite number, got {shown(value)}{allowed}")
    return float(value)


def check_keys(spec: object, allowed: tuple[str, ...], path: str) -> dict:
    if not isinstance(spec, dict):
        raise spec_error(path, f"must be a mapping, got {shown(spec)}")
    unknown = sorted(set(spec) - set(allowed), key=str)  # YAML keys may be numbers too
    if unknown:
        raise spec_error(f"{path}.{shown_key(unknown[0])}", f"unknown key; allowed: {', '.join(allowed)}")
    return spec


def integer(spec: dict, key: str, path: str, *, default: int | None = None, minimum: int = 1,
            maximum: int | None = None, why: str = "") -> int:
    """An integral field (2 and 2.0 are fine, 2.5 is not), range-checked like `number`."""
    value = spec.get(key, default)
    where = f"{path}.{key}"
    allowed = _allowed("an integer", False, minimum, maximum, why)
    if isinstance(value, float) and math.isfinite(value) and not value.is_integer():
        raise spec_error(where, f"must be an integer, got {value!r}{allowed}")
    if isinstance(value, int) and not isinstance(value, bool):  # exact: a float would round a huge integer
        if value < minimum:
            raise spec_error(where, f"must be >= {minimum}, got {shown(value)}{allowed}")
        if maximum is not None and value > maximum:
            raise spec_error(where, f"must be <= {maximum}, got {shown(value)}{allowed}")
        return value
    return int(number(spec, key, path, default=default, positive=False, minimum=minimum, maximum=maximum,
                      why=why, kind="an integer"))


def fraction(spec: dict, path: str, default: float) -> float:
    """The `fraction` field: a share in (0, 1]."""
    value = number(spec, "fraction", path, default=default)
    if value > 1:
        raise spec_error(f"{path}.fraction", f"must be in (0, 1], got {value!r}; allowed: a share in (0, 1]")
    return value
