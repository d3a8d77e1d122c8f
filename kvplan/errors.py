"""The one exception type for bad input.

`UserError` is raised where an input is checked — a flag, a YAML key, a trace row, a profile, a config entry, an
HTTP body — and its message names where (file:line, key path or flag) and what is allowed. `kvplan` prints only
these as one line and exits 2; any other exception, `ValueError` included, is a bug and keeps its traceback. It is a
`ValueError`, so library callers (`LLM(...)`, `CacheConfig(...)`) catch it as Python code expects of bad arguments.

This module imports nothing: every layer (core, traces, simulator, engine, commands) may raise it.
"""


class UserError(ValueError):
    """Bad input, checked where it enters; the message says where and what is allowed."""
