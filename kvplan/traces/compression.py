"""Compressed trace files, read transparently: gzip, bz2, xz and zstd, told apart by their magic bytes (never by
the file name, so `trace.csv.gz`, `trace.gz` and a compressed file without a suffix all load the same way).

Detection and every reader go through `open_binary` / `open_text`, so a compressed file is parsed exactly as its
plain content would be: same format detection, same line numbers in errors, same `Trace`.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zlib
from pathlib import Path
from typing import BinaryIO, TextIO

from kvplan.traces.schema import TraceFormatError

# Magic bytes at the start of each container (RFC 1952, bzip2, the .xz format, RFC 8878).
MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bz2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"))
METHODS = tuple(name for _, name in MAGIC)


def compression_of(path: str | Path) -> str | None:
    """The compression method of the file at `path`, or None for a plain file."""
    with open(path, "rb") as f:
        head = f.read(6)
    return next((name for magic, name in MAGIC if head.startswith(magic)), None)


def open_binary(path: str | Path) -> BinaryIO:
    """The file's decompressed bytes as a stream (the plain file itself when not compressed)."""
    method = compression_of(path)
    if method is None:
        return open(path, "rb")
    if method == "gzip":
        return gzip.open(path, "rb")
    if method == "bz2":
        return bz2.open(path, "rb")
    if method == "xz":
        return lzma.open(path, "rb")
    return _zstd_reader(path)


def open_text(path: str | Path, errors: str = "strict") -> TextIO:
    """The decompressed content as UTF-8 text (a leading byte-order mark dropped), universal newlines off so
    that CSV quoting and line counting see the file's own line ends."""
    return io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", errors=errors, newline="")


def read_bytes(path: str | Path) -> bytes:
    with open_binary(path) as f:
        return f.read()


def _zstd_reader(path: str | Path) -> BinaryIO:
    try:
        import zstandard
    except ModuleNotFoundError:
        raise TraceFormatError(f"{path}: zstd-compressed; reading it needs the zstandard package "
                               "(pip install zstandard), or decompress it first") from None
    raw = open(path, "rb")  # noqa: SIM115 -- the reader owns and closes it (closefd)
    # read_across_frames: a file made of several concatenated frames (zstd -c a b > f) reads whole.
    reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=True)
    return io.BufferedReader(reader)  # lines and peeking, which the bare reader lacks


def decompression_errors() -> tuple[type[BaseException], ...]:
    """What a corrupt or truncated compressed file raises while being read."""
    # zlib.error: a gzip whose deflate data is corrupt (a bad header is gzip.BadGzipFile, an OSError)
    errors: list[type[BaseException]] = [OSError, EOFError, lzma.LZMAError, zlib.error]
    try:
        import zstandard

        errors.append(zstandard.ZstdError)
    except ModuleNotFoundError:
        pass
    return tuple(errors)
