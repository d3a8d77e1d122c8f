"""What a trace load may tolerate or override, the same options for every format."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class LoadOptions:
    """How to read a trace file, whatever its format: what to do with bad rows and how strict to be."""

    skip_bad: bool = False  # drop malformed rows (counted in the report) instead of stopping
    order_tolerance_s: float = 1.0  # how far a timestamp may fall behind an earlier one and still be sorted
    keep_failed: bool = False  # BurstGPT: keep failed requests (0 response tokens)
    hash_granularity: int | None = None  # tokens per prefix hash, overriding what the format states
    decode_errors: str = "strict"  # "surrogateescape": rows that are not UTF-8 become bad rows (--skip-bad)
