"""Request records, loaders for public trace formats, transforms and synthetic workloads.

`load(path)` reads any supported trace into the columnar `Trace`; `Trace.records()` yields `RequestRecord`s.
"""

from __future__ import annotations

from pathlib import Path

from kvplan import limits
from kvplan.traces.compression import METHODS, compression_of, decompression_errors, open_binary
from kvplan.traces.detect import choose_format
from kvplan.traces.loaders import FORMATS, LoadOptions
from kvplan.traces.schema import LoadReport, RequestRecord, Trace, TraceFormatError


def first_undecodable(path: str | Path) -> tuple[int, int, bytes]:
    """(line, column, byte) of the first byte that is not UTF-8, in the decompressed content."""
    with open_binary(path) as f:
        for number, raw in enumerate(f, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return number, exc.start + 1, raw[exc.start:exc.start + 1]
    return 1, 1, b""


def load(path: str | Path, format: str | None = None, skip_bad: bool = False, *,
         order_tolerance_s: float = 1.0, keep_failed: bool = False, hash_granularity: int | None = None) -> Trace:
    """Load a trace file, plain or gzip/bz2/xz/zstd-compressed; the format is detected from the (decompressed)
    content unless named (see `FORMATS`). `hash_granularity` overrides the tokens per prefix hash that the
    format states (a Mooncake-layout file written with 16-token blocks)."""
    if not str(path).strip():  # Path("") is the current directory
        raise TraceFormatError("empty path; allowed: a trace file")
    if Path(path).is_dir():
        raise TraceFormatError(f"{path}: is a directory; allowed: a trace file")
    if not Path(path).exists():
        raise FileNotFoundError(f"{path}: no such trace file")
    if not Path(path).is_file():  # /dev/null, a FIFO (opening one would wait for a writer), a socket
        raise TraceFormatError(f"{path}: not a regular file; allowed: a trace file")
    if hash_granularity is not None and hash_granularity < 1:
        raise TraceFormatError(f"--hash-granularity: {hash_granularity}; allowed: an integer >= 1")
    opts = LoadOptions(skip_bad=skip_bad, order_tolerance_s=order_tolerance_s, keep_failed=keep_failed,
                       hash_granularity=hash_granularity)
    try:
        try:
            return choose_format(path, format).load(path, opts)
        except UnicodeDecodeError:
            line, column, byte = first_undecodable(path)
            if not skip_bad or line == 1:  # the header or first record must be readable to know the format
                raise TraceFormatError(f"{path}:{line}: not UTF-8 text (byte {byte!r} at column {column}); allowed: "
                                       "UTF-8 text (--skip-bad drops such rows), optionally "
                                       f"{'/'.join(METHODS)}-compressed") from None
            # Read again with the bad bytes escaped: the rows holding them are dropped and counted as bad.
            opts.decode_errors = "surrogateescape"
            return choose_format(path, format).load(path, opts)
    except TraceFormatError:
        raise
    except (*decompression_errors(), ValueError) as exc:
        if type(exc).__module__.startswith("pyarrow"):  # ArrowInvalid / ArrowIOError: pyarrow names no file
            reason = " ".join(str(exc).split())[:200]
            raise TraceFormatError(f"{path}: not a readable Parquet file ({reason}); allowed: a complete Parquet "
                                   "file") from None
        method = compression_of(path)
        if method is None or isinstance(exc, ValueError):
            raise
        if "Memory usage limit" in str(exc):  # liblzma's words for a dictionary past limits.MAX_XZ_MEMORY
            raise TraceFormatError(f"{path}: the xz stream needs more than {limits.MAX_XZ_MEMORY} bytes of memory to "
                                   f"decompress; allowed: at most {limits.MAX_XZ_MEMORY} (limits.MAX_XZ_MEMORY; xz -9 "
                                   "needs 65 MiB)") from None
        raise TraceFormatError(f"{path}: corrupt or truncated {method} data ({exc}); allowed: a complete "
                               f"{method} file") from None


__all__ = ["FORMATS", "LoadReport", "RequestRecord", "Trace", "TraceFormatError", "load"]
