"""Compressed trace files, read transparently and within limits: gzip, bz2, xz and zstd, told apart by their magic
bytes (never by the file name, so `trace.csv.gz`, `trace.gz` and a compressed file without a suffix all load the
same way).

Detection and every reader go through `open_binary` / `open_text` / `read_bytes`, so a compressed file is parsed
exactly as its plain content would be (same format detection, same line numbers in errors, same `Trace`), and
every byte any reader sees has passed the limits of `kvplan.limits` (MAX_TRACE_BYTES, and for text
MAX_TRACE_LINE_BYTES and MAX_TRACE_LINES), checked while the content streams in: a few KB of gzip that inflate
to one 2 GB line are refused after 64 MB, with the file, the line and the limit, before memory is spent.
"""

from __future__ import annotations

import _compression
import bz2
import gzip
import io
import lzma
import zlib
from pathlib import Path
from typing import BinaryIO, TextIO

from kvplan import limits
from kvplan.traces.schema import TraceFormatError

# Magic bytes at the start of each container (RFC 1952, bzip2, the .xz format, RFC 8878).
MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bz2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"))
METHODS = tuple(name for _, name in MAGIC)
CHUNK = 2**20  # decompressed bytes per read: a read(1 GB) never inflates 1 GB at once


def compression_of(path: str | Path) -> str | None:
    """The compression method of the file at `path`, or None for a plain file."""
    with open(path, "rb") as f:
        head = f.read(6)
    return next((name for magic, name in MAGIC if head.startswith(magic)), None)


def open_binary(path: str | Path, *, text: bool = True) -> BinaryIO:
    """The file's decompressed bytes as a stream (the plain file's own when not compressed), within the limits:
    MAX_TRACE_BYTES in all, and for `text` content (every format but Parquet) MAX_TRACE_LINE_BYTES a line and
    MAX_TRACE_LINES lines. Passing one raises TraceFormatError naming the file, the line and the limit."""
    method = compression_of(path)
    if method is None:
        size = Path(path).stat().st_size
        if size > limits.MAX_TRACE_BYTES:
            raise TraceFormatError(f"{path}: {size} bytes; allowed: at most {limits.MAX_TRACE_BYTES} bytes of trace "
                                   "(limits.MAX_TRACE_BYTES: what loading fits in memory)")
        inner: BinaryIO | io.BufferedIOBase = open(path, "rb")  # noqa: SIM115 -- the bounded reader owns and closes it
    elif method == "gzip":
        inner = gzip.open(path, "rb")  # noqa: SIM115 -- closed with the bounded reader
    elif method == "bz2":
        inner = bz2.open(path, "rb")  # noqa: SIM115 -- closed with the bounded reader
    elif method == "xz":
        raw = open(path, "rb")  # noqa: SIM115 -- closed with the reader
        # lzma.open has no memory limit: the decompressor it builds, with one (a 1.5 GiB dictionary is refused).
        reader = _compression.DecompressReader(raw, lzma.LZMADecompressor, trailing_error=lzma.LZMAError,
                                               memlimit=limits.MAX_XZ_MEMORY)
        return io.BufferedReader(_Bounded(reader, str(path), method, text, raw), CHUNK)
    else:
        inner = _zstd_reader(path)
    return io.BufferedReader(_Bounded(inner, str(path), method, text), CHUNK)


def open_text(path: str | Path, errors: str = "strict") -> TextIO:
    """The decompressed content as UTF-8 text (a leading byte-order mark dropped), universal newlines off so
    that CSV quoting and line counting see the file's own line ends."""
    return io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", errors=errors, newline="")


def read_bytes(path: str | Path, *, text: bool = True) -> bytes:
    with open_binary(path, text=text) as f:
        return f.read()


class _Bounded(io.RawIOBase):
    """A decompressed stream, counted as it is read: its total size, and for text its line lengths and line
    count. A line end is \\n or a lone \\r (what csv and pandas accept); a line longer than a read spans reads,
    so the bytes since the last line end carry over, and every read is at most one line limit long (a whole
    line inside one read is then within the limit)."""

    def __init__(self, inner: BinaryIO | io.BufferedIOBase | io.RawIOBase, path: str, method: str | None, text: bool,
                 file: BinaryIO | None = None) -> None:
        super().__init__()
        self._inner, self._path, self._text, self._file = inner, path, text, file  # file: closed with inner
        self._what = f" ({method}-decompressed)" if method else ""
        self._total = 0
        self._lines = 0  # line ends seen
        self._run = 0  # bytes since the last line end

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self._inner.read(min(len(buffer), CHUNK, limits.MAX_TRACE_LINE_BYTES)) or b""
        self._total += len(data)
        if self._total > limits.MAX_TRACE_BYTES:
            raise TraceFormatError(f"{self._path}: more than {limits.MAX_TRACE_BYTES} bytes{self._what}; allowed: at "
                                   f"most {limits.MAX_TRACE_BYTES} bytes of trace (limits.MAX_TRACE_BYTES: what "
                                   "loading fits in memory)")
        if self._text and data:
            self._count_lines(data)
        buffer[:len(data)] = data
        return len(data)

    def _count_lines(self, data: bytes) -> None:
        ends = [i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0]
        if not ends:
            self._run += len(data)
            self._check_run(self._run)
            return
        self._check_run(self._run + min(ends))
        self._lines += max(data.count(b"\n"), data.count(b"\r"))  # \r\n counts once; lone \r ends (old Macs) too
        self._run = len(data) - max(data.rfind(b"\n"), data.rfind(b"\r")) - 1
        if self._lines > limits.MAX_TRACE_LINES:
            raise TraceFormatError(f"{self._path}: more than {limits.MAX_TRACE_LINES} lines{self._what}; allowed: at "
                                   f"most {limits.MAX_TRACE_LINES} rows (limits.MAX_TRACE_LINES: what loading fits "
                                   "in memory)")

    def _check_run(self, length: int) -> None:
        if length > limits.MAX_TRACE_LINE_BYTES:
            raise TraceFormatError(f"{self._path}:{self._lines + 1}: line longer than {limits.MAX_TRACE_LINE_BYTES} "
                                   f"bytes{self._what}; allowed: rows of at most {limits.MAX_TRACE_LINE_BYTES} bytes "
                                   "(limits.MAX_TRACE_LINE_BYTES: a MAX_TOKENS prompt's hash list fits)")

    def close(self) -> None:
        if not self.closed:
            self._inner.close()
            if self._file is not None:
                self._file.close()
        super().close()


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
