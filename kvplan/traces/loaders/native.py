"""Our own interchange formats, written by `kvplan trace convert`: JSONL, CSV and Parquet of the Request
record. JSONL and Parquet hold `prefix_hashes` as lists; CSV as space-separated integers."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd

from kvplan import limits
from kvplan.traces.compression import compression_of, read_bytes
from kvplan.traces.loaders.csv_rows import read_csv
from kvplan.traces.loaders.rows import Rows, object_column
from kvplan.traces.loaders.spec import Field, Format, jsonl_format
from kvplan.traces.schema import NO_VALUE, TraceFormatError, short_repr

FIELDS = (
    Field("request_id", "request_id"),
    Field("arrival_s", "arrival_s", integer=False),
    Field("prompt_tokens", "prompt_tokens", minimum=0),  # 0 only in a failed request (a kept BurstGPT row)
    Field("output_tokens", "output_tokens"),
    Field("session_id", "session_id", default=NO_VALUE),
    Field("turn", "turn", default=NO_VALUE),
    Field("priority", "priority", minimum=None, default=0),
    Field("n", "n", minimum=1, default=1),
    Field("_granularity", "hash_granularity", default=0),
)
HASHES = "prefix_hashes"


def _split_hashes(text: object) -> object:
    """'3 17 42' -> [3, 17, 42]; anything unparsable stays as it is so that validation names it."""
    if text is None:
        return None
    try:
        return [int(h) for h in str(text).split()]
    except ValueError:
        return text


def read_native_csv(path: str | Path, errors: str = "strict") -> Rows:
    rows = read_csv(path, errors)
    if HASHES in rows.fields:
        rows.fields[HASHES] = object_column([_split_hashes(v) for v in rows.fields[HASHES]])
    return rows


def parquet_source(path: str | Path) -> str | Path | io.BytesIO:
    """What pyarrow reads for the Parquet file at `path`, checked against the trace limits before any row is
    decoded: Parquet compresses and run-length encodes internally, so a few KB can declare a billion rows. A
    compressed file is decompressed whole (its footer is at the end), within MAX_TRACE_BYTES."""
    import pyarrow.parquet as pq

    source = path if compression_of(path) is None else io.BytesIO(read_bytes(path, text=False))
    meta = pq.read_metadata(source)
    decoded = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    if meta.num_rows > limits.MAX_TRACE_LINES:
        raise TraceFormatError(f"{path}: {meta.num_rows} rows; allowed: at most {limits.MAX_TRACE_LINES} "
                               "(limits.MAX_TRACE_LINES: what loading fits in memory)")
    if meta.num_columns > limits.MAX_TRACE_FIELDS:
        raise TraceFormatError(f"{path}: {meta.num_columns} columns; allowed: at most {limits.MAX_TRACE_FIELDS} "
                               "(limits.MAX_TRACE_FIELDS)")
    if meta.num_rows * meta.num_columns > limits.MAX_TRACE_CELLS:
        raise TraceFormatError(f"{path}: {meta.num_columns} columns x {meta.num_rows} rows; allowed: at most "
                               f"{limits.MAX_TRACE_CELLS} values in all (limits.MAX_TRACE_CELLS)")
    if decoded > limits.MAX_TRACE_BYTES:
        raise TraceFormatError(f"{path}: {decoded} bytes once decoded; allowed: at most {limits.MAX_TRACE_BYTES} "
                               "(limits.MAX_TRACE_BYTES: what loading fits in memory)")
    if isinstance(source, io.BytesIO):
        source.seek(0)
    return source


def read_parquet(path: str | Path, errors: str = "strict") -> Rows:
    """Rows of a Parquet file; 'line' numbers are 1-based row numbers. (Parquet strings are UTF-8 by the
    format's definition: `errors` is accepted for the reader interface only.)"""
    frame = pd.read_parquet(parquet_source(path))
    for name in frame.columns:
        if frame[name].dtype == bool:
            raise TraceFormatError(f"{path}: column {short_repr(name)} holds booleans; allowed: numbers")
    fields = {name: frame[name].to_numpy(dtype=object) for name in frame.columns}
    for name, values in fields.items():  # pandas reads integer columns with nulls as floats with NaN
        fields[name] = np.where(pd.isna(values), None, values) if name != HASHES else values
    return Rows(str(path), list(frame.columns), np.arange(1, len(frame) + 1, dtype=np.int64), fields)


_DESCRIPTION = "kvplan Request records ({}): the lossless interchange format"
LORA = "lora"  # the adapter a row names (absent or null: the base model)
KVPLAN_JSONL = jsonl_format("kvplan-jsonl", FIELDS, _DESCRIPTION.format("JSONL"), hashes=HASHES,
                            failed_requests=True, lora=LORA)
KVPLAN_CSV = Format("kvplan-csv", "csv", read_native_csv, FIELDS, _DESCRIPTION.format("CSV"), hashes=HASHES,
                    failed_requests=True, lora=LORA)
KVPLAN_PARQUET = Format("kvplan-parquet", "parquet", read_parquet, FIELDS, _DESCRIPTION.format("Parquet"),
                        hashes=HASHES, failed_requests=True, lora=LORA)
