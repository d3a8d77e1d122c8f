"""Strict reading of values kvplan did not write itself: JSON from a server, a replay directory, a step profile or
a config.json, and the numbers in it.

Python's `json` accepts `NaN`, `Infinity` and `1e400` (which it reads as inf) although RFC 8259 has none of them,
and nests until the interpreter's recursion limit; `int()` turns 16.7 into 16 and `true` into 1. Each of those
reached kvplan as a traceback or as a silently wrong number; every reader of foreign JSON goes through here.
(Trace rows have their own, faster checks in `traces.loaders`.) A leaf beside `kvplan.errors`, importing only
it and the standard library: its readers are the serving app, the simulator's recorded cost model, the endpoint
client and calibration, on different layers.
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from itertools import accumulate

from kvplan.errors import UserError

_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother = 2, 4, 4, 60, 60


def short(value: object, limit: int = 60) -> str:
    """A value as a message quotes it: about `limit` characters however large it is. Not `errors.short_repr`:
    that one bounds tuples and long integers differently, and these messages stay as they were."""
    text = _SHORT.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def why(exc: BaseException) -> str:
    """What went wrong reading a record, in words and about 100 characters: never a bare repr such as
    `KeyError('meta')` or an exception quoting a whole line."""
    if isinstance(exc, KeyError):
        return f"no key {short(exc.args[0]) if exc.args else '?'}"
    if isinstance(exc, IndexError):
        return "a list with too few items"
    if isinstance(exc, TypeError):
        return f"a value of the wrong type ({short(str(exc), 70)})"
    text = str(exc).split("; allowed:")[0].strip()  # the caller says what is allowed, once
    return (text if len(text) <= 100 else text[:97] + "...") if text else type(exc).__name__


def _refuse_constant(name: str) -> float:
    raise UserError(f"{name} is not a JSON number (RFC 8259 has no NaN or infinity)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: a literal beyond float64, read as inf
        raise UserError(f"{short(text)} is beyond float64's range")
    return value


MAX_DEPTH = 100  # arrays and objects inside each other: every document kvplan reads nests fewer than 10 levels
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes included
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def too_deep(text: str) -> bool:
    """Whether `text` nests arrays and objects deeper than MAX_DEPTH (brackets inside strings do not count).
    Counted at C speed: nothing to do for a text with few brackets (the common case), else strings and
    everything but brackets removed by regex, and the running depth accumulated."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return False
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0) > MAX_DEPTH


def loads(text: str | bytes) -> object:
    """`json.loads` as RFC 8259 has it: NaN, ±Infinity and overflowing numbers raise a ValueError, and so does
    nesting deeper than MAX_DEPTH, checked before the parser runs (a body nested 100,000 deep would otherwise
    reach the interpreter's recursion limit, or its stack, depending on the thread it is read in)."""
    if isinstance(text, bytes | bytearray):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:  # a ValueError that a caller catching UserError would not expect
            raise UserError(f"not UTF-8 text (byte {bytes(text[exc.start:exc.start + 1])!r} at offset "
                            f"{exc.start}); allowed: UTF-8 JSON") from None
    if too_deep(text):
        raise UserError(f"nested too deeply; allowed: JSON nested at most {MAX_DEPTH} levels")
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise UserError(f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise UserError(f"nested too deeply; allowed: JSON nested at most {MAX_DEPTH} levels") from None


def whole(value: object, what: str, low: int | None = None, high: int | None = None) -> int:
    """`value` as an integer if it is one exactly (an int, an integral float, or a string of digits), within
    [low, high]; a boolean, 16.7, NaN or a number out of range is a ValueError naming `what`."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif ((isinstance(value, float) and math.isfinite(value) and value.is_integer())
          or (isinstance(value, str) and value.strip().lstrip("+-").isdigit())):
        number = int(value)
    bounds = " and ".join(b for b in (f">= {low}" if low is not None else "",
                                      f"<= {high}" if high is not None else "") if b)
    allowed = f"allowed: an integer{' ' + bounds if bounds else ''}"
    if number is None:
        kind = "a boolean" if isinstance(value, bool) else "not an integer"
        raise UserError(f"{what}: {short(value)} is {kind}; {allowed}")
    if (low is not None and number < low) or (high is not None and number > high):
        raise UserError(f"{what}: {number} is out of range; {allowed}")
    return number
