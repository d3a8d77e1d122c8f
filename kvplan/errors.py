"""The one exception type for bad input.

`UserError` is raised where an input is checked — a flag, a YAML key, a trace row, a profile, a config entry, an
HTTP body — and its message names where (file:line, key path or flag) and what is allowed. `kvplan` prints only
these as one line and exits 2; any other exception, `ValueError` included, is a bug and keeps its traceback. It is a
`ValueError`, so library callers (`LLM(...)`, `CacheConfig(...)`) catch it as Python code expects of bad arguments.

This module imports only the standard library: every layer (core, traces, simulator, engine, commands) may raise
it, and quotes a bad value the same way (`short_repr`).
"""

import reprlib
from collections.abc import Iterable

SHOWN_CHARS = 60
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxdict = 2, 4, 4, 4
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = SHOWN_CHARS, SHOWN_CHARS, SHOWN_CHARS


class UserError(ValueError):
    """Bad input, checked where it enters; the message says where and what is allowed."""


def short_repr(value: object, limit: int = SHOWN_CHARS) -> str:
    """A value as an error message quotes it: about `limit` characters however large the value, and bounded in
    time too (a YAML alias bomb expands to billions of items; reprlib never walks them all)."""
    text = _SHORT.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class ConfigError(UserError):
    """A setting is out of its allowed range or names something unknown; the message starts with its key path
    (`cache.block_size`, `engine.block_size`) and says what is allowed."""


LISTED_CHARS = 150


def listed(names: Iterable[object], limit: int = LISTED_CHARS) -> str:
    """Allowed names joined for a message: all when they fit in about `limit` characters, else the first that fit
    and how many more (forty summary metrics or sixty sweepable keys made 650-character lines)."""
    names = [str(n) for n in names]
    if len(", ".join(names)) <= limit:
        return ", ".join(names)
    shown: list[str] = []
    for name in names:
        if len(", ".join([*shown, name])) > limit - 20:
            break
        shown.append(name)
    return f"{', '.join(shown)}, ... ({len(names) - len(shown)} more)"
