"""Reading a benchmark tool's result file: bounded, strict, one line naming the file on anything unreadable.

`load_document(path)` parses the file into the document every format's `detect` and `read` take:
- a `.csv` file: its rows as a list of dicts (column name -> the cell's text; AIPerf's CSV export);
- JSON (RFC 8259 via `kvplan.strict_json`: no NaN, no infinity, bounded nesting): the parsed value;
- JSON lines (several JSON values, one a line: `vllm bench serve --append-result` writes its runs so): the list
  of the parsed values, in the file's order.
`read_runs(path, format)` then reads its runs with the named format's module, or with the first whose `detect`
accepts the document (`formats.FORMATS` order).
"""

from __future__ import annotations

import csv
import io
from importlib.util import find_spec
from pathlib import Path

from kvplan.errors import UserError, listed
from kvplan.measured.formats import FORMATS, format_module
from kvplan.measured.record import MeasuredRun
from kvplan.strict_json import loads

# The largest result file read: a GuideLLM report of a long sweep keeps every request's record (~1 KB each), tens
# of MB; Python holds parsed JSON at ~10x its text, so 256 MB is a few GB of memory - the most a file may take.
MAX_RESULT_BYTES = 256 * 2**20
MAX_CSV_FIELD = 16 * 2**20  # csv's own default limit is 128 KB; one AIPerf cell never comes near 16 MB


def read_text(path: Path) -> str:
    """The file's text, refused past MAX_RESULT_BYTES before it is read whole (a FIFO or a device too)."""
    try:
        if not path.is_file():
            why = "no such file" if not path.exists() else "not a regular file"
            raise UserError(f"{path}: {why}; allowed: a benchmark tool's result file")
        with path.open("rb") as f:
            data = f.read(MAX_RESULT_BYTES + 1)
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror or exc}); allowed: a readable result file") from None
    if len(data) > MAX_RESULT_BYTES:
        raise UserError(f"{path}: larger than {MAX_RESULT_BYTES} bytes; allowed: a result file of at most "
                        f"{MAX_RESULT_BYTES} bytes (measured.load.MAX_RESULT_BYTES: what parsing fits in memory)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte offset {exc.start}); allowed: a JSON, JSON-lines or CSV "
                        "result file") from None


def load_document(path: str | Path) -> object:
    """The parsed file (see the module docstring for its shape); a UserError naming the file otherwise."""
    path = Path(path)
    text = read_text(path)
    if not text.strip():
        raise UserError(f"{path}: empty; allowed: a JSON, JSON-lines or CSV result file")
    if path.suffix.lower() == ".csv":
        return _csv_rows(path, text)
    try:
        return loads(text)
    except UserError as whole:
        lines = [line for line in text.splitlines() if line.strip()]
        if len(lines) < 2:
            raise UserError(f"{path}: {whole}; allowed: a JSON, JSON-lines or CSV result file") from None
        values = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    values.append(loads(line))
                except UserError as exc:
                    raise UserError(f"{path}: line {number}: {exc}; allowed: a JSON, JSON-lines or CSV result "
                                    "file") from None
        return values


def _csv_rows(path: Path, text: str) -> list[dict[str, str]]:
    previous = csv.field_size_limit(MAX_CSV_FIELD)
    reader = csv.DictReader(io.StringIO(text, newline=""), strict=True)
    try:
        rows = [dict(row) for row in reader]
    except csv.Error as exc:
        raise UserError(f"{path}: line {reader.line_num}: not CSV ({exc}); allowed: a CSV result file") from None
    finally:
        csv.field_size_limit(previous)
    if reader.fieldnames is None:
        raise UserError(f"{path}: no header row; allowed: a CSV result file with a header")
    return rows


def present() -> list[str]:
    """The formats of `FORMATS` whose reader module is part of this build, in registry order."""
    return [name for name in FORMATS if find_spec(f"kvplan.measured.formats.{FORMATS[name]}") is not None]


def read_runs(path: str | Path, format: str | None = None) -> tuple[str, list[MeasuredRun]]:
    """(the format, every run of the file). `format` None: the first format whose `detect` accepts the file."""
    document = load_document(path)
    allowed = listed(FORMATS)
    if format is None:
        found = [name for name in present() if format_module(name).detect(document)]
        if not found:
            raise UserError(f"{path}: no known result format recognised; allowed: --format {{{allowed}}} "
                            "(vllm bench serve --save-result, GuideLLM, AIPerf or inference-perf output)")
        format = found[0]
    elif format not in present():
        raise UserError(f"--format: {format!r} is unknown; allowed: {listed(present())}")
    runs = format_module(format).read(document, str(path))
    if not runs:
        raise UserError(f"{path}: holds no benchmark run ({format_module(format).TOOL}); allowed: a result file "
                        "with at least one run")
    return format, runs
