"""Vidur-format per-op profile directories read into tidy rows (github.com/microsoft/vidur, MIT).

A profile directory holds `compute/<gpu>/<org>/<model>/mlp.csv` (and, where profiled, `attention.csv`) and
`network/<name>/{all_reduce,send_recv}.csv`; `read_profiles` accepts that root or any folder below it and finds
every such file. Each CSV row times one op at one shape, as statistics over repeated runs in milliseconds
(`time_stats.<op>.<stat>`); only the median is read. One tidy row per (CSV row, op):

    op, family (gemm / elementwise / attention / allreduce / send_recv), gpu (the `compute/<gpu>` folder, or the
    network folder's name up to its first '_': `a100_dgx` -> a100), source (model folder or network folder),
    tokens, hidden, heads, kv_heads, intermediate, gated, tp (the TP degree; a collective's GPU count),
    devices_per_node, message_bytes, batch, context, block_size, prefill, measured_ms, file, line.

Vidur's collective `size` is already in bytes: its profiler writes `size * 2` for an fp16 tensor of `size`
elements (vidur/profiling/collectives/collectives_wrapper.py), and its times are the NCCL kernels' own (Kineto,
launch excluded). `line` is the 1-based line of the row in its file as an editor shows it (the header is line
1). Bad input (a missing column, an op Vidur does not time, a non-positive or missing median) is a `UserError`
naming the file, the line and the column.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kvplan.errors import UserError
from kvplan.traces.schema import short_repr

GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS = ("emb", "input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")
ATTENTION_OPS = ("attn_prefill", "attn_decode", "attn_kv_cache_save", "attn_input_reshape", "attn_output_reshape")
FAMILY = {**{op: "gemm" for op in GEMM_OPS}, **{op: "elementwise" for op in ELEMENTWISE_OPS},
          **{op: "attention" for op in ATTENTION_OPS}, "all_reduce": "allreduce", "send_recv": "send_recv"}
FAMILIES = ("gemm", "elementwise", "attention", "allreduce", "send_recv")
COLUMNS = ("op", "family", "gpu", "source", "tokens", "hidden", "heads", "kv_heads", "intermediate", "gated", "tp",
           "devices_per_node", "message_bytes", "batch", "context", "block_size", "prefill", "measured_ms", "file",
           "line")
INT_COLUMNS = ("tokens", "hidden", "heads", "kv_heads", "intermediate", "tp", "devices_per_node", "batch", "context",
               "block_size")
# The shape columns each kind of file must have (Vidur's names).
REQUIRED = {
    "mlp.csv": ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "num_tokens", "num_tensor_parallel_workers"),
    "attention.csv": ("n_q_head", "n_kv_head", "n_embd", "num_tensor_parallel_workers", "batch_size",
                      "prefill_chunk_size", "kv_cache_size", "is_prefill"),
    "all_reduce.csv": ("num_workers", "size", "devices_per_node"),
    "send_recv.csv": ("num_workers", "size", "devices_per_node"),
}
KNOWN = {"mlp.csv": GEMM_OPS + ELEMENTWISE_OPS, "attention.csv": ATTENTION_OPS, "all_reduce.csv": ("all_reduce",),
         "send_recv.csv": ("send_recv",)}


def read_profiles(root: Path | str, flag: str = "--profiles") -> pd.DataFrame:
    """Every op row of every Vidur-format file under `root`, as tidy rows (`COLUMNS`), in file order. `flag`
    names the option (or setting) the directory came from in an error."""
    root = Path(root)
    shown = short_repr(str(root), 60)
    try:
        is_dir = root.is_dir()
    except OSError as exc:  # a name past the system's limit, a path through a file: not a profile directory
        raise UserError(f"{flag}: {shown}: {exc.strerror or exc}; allowed: a Vidur-format profile directory") \
            from None
    if not is_dir:
        raise UserError(f"{flag}: {shown}: not a directory (a Vidur-format profile directory: "
                        "compute/<gpu>/<org>/<model>/mlp.csv, network/<name>/all_reduce.csv, ...)")
    paths = sorted(p for name in REQUIRED for p in root.rglob(name))
    if not paths:
        raise UserError(f"{flag}: {shown}: no mlp.csv, attention.csv, all_reduce.csv or send_recv.csv under it")
    frames = [read_file(path, root) for path in paths]
    return pd.concat(frames, ignore_index=True)


def rows_for_hardware(rows: pd.DataFrame, hardware: str, where: str) -> pd.DataFrame:
    """The rows of the GPU `hardware` names: all of them when the directory holds one GPU's profiles, else those
    whose GPU folder the hardware's name starts with (`compute/a100` for a100-80gb)."""
    labels = sorted(rows["gpu"].unique())
    if len(labels) <= 1:
        return rows
    mine = rows[[hardware.startswith(label) for label in rows["gpu"]]]
    if mine.empty:
        raise UserError(f"{where} holds profiles of {', '.join(labels)}, none of them for {hardware}; point it at "
                        "one GPU's folder or choose a matching hardware")
    return mine


def read_file(path: Path, root: Path) -> pd.DataFrame:
    """One Vidur CSV as tidy rows; its gpu and source labels come from where it sits under `root`."""
    try:
        raw = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not a readable CSV ({str(exc).splitlines()[0]})") from None
    kind = path.name
    missing = [c for c in REQUIRED[kind] if c not in raw.columns]
    if missing:
        raise UserError(f"{path}: line 1: missing column {missing[0]!r}; a Vidur {kind} needs "
                        f"{', '.join(REQUIRED[kind])}")
    ops = [c.split(".")[1] for c in raw.columns if c.startswith("time_stats.") and c.endswith(".median")]
    unknown = [op for op in ops if op not in KNOWN[kind]]
    if unknown:
        raise UserError(f"{path}: line 1: column 'time_stats.{unknown[0]}.median': unknown op {unknown[0]!r}; a "
                        f"{kind} times {', '.join(KNOWN[kind])}")
    if not ops:
        raise UserError(f"{path}: line 1: no 'time_stats.<op>.median' column; a {kind} times "
                        f"{', '.join(KNOWN[kind])}")
    for column in REQUIRED[kind]:
        if column != "is_prefill":
            _check_positive(path, raw, column, np.ones(len(raw), bool), allow_zero=column in (
                "prefill_chunk_size", "kv_cache_size"))
    labels = _labels(path, root)
    return pd.concat([_op_rows(path, raw, kind, op, labels) for op in ops], ignore_index=True)


def _labels(path: Path, root: Path) -> tuple[str, str]:
    """(gpu, source) from the path: compute/<gpu>/<org>/<model>/... or network/<name>/...; the folders nearest the
    file when the layout is shallower."""
    parts = path.resolve().relative_to(root.resolve().anchor).parts[:-1]
    if "compute" in parts:
        rest = parts[parts.index("compute") + 1:]
        return (rest[0] if rest else "unknown"), "/".join(rest[1:]) or path.parent.name
    if "network" in parts:
        rest = parts[parts.index("network") + 1:]
        name = rest[0] if rest else path.parent.name
        return name.split("_")[0], name
    return path.parent.name, path.parent.name


def _check_positive(path: Path, raw: pd.DataFrame, column: str, mask: np.ndarray, allow_zero: bool = False) -> None:
    """Refuse the first row (of those in `mask`) whose `column` is missing, not a number or not > 0."""
    values = pd.to_numeric(raw[column], errors="coerce").to_numpy(float)
    bad = mask & ~(np.isfinite(values) & ((values >= 0) if allow_zero else (values > 0)))
    if bad.any():
        i = int(np.argmax(bad))
        what = "a number >= 0" if allow_zero else "a number > 0"
        raise UserError(f"{path}: line {i + 2}: column {column!r}: {raw[column].iloc[i]} is not {what}")


def _int(raw: pd.DataFrame, column: str, default: int = 0) -> np.ndarray:
    if column not in raw.columns:
        return np.full(len(raw), default, np.int64)
    return pd.to_numeric(raw[column], errors="coerce").fillna(default).to_numpy(np.int64)


def _op_rows(path: Path, raw: pd.DataFrame, kind: str, op: str, labels: tuple[str, str]) -> pd.DataFrame:
    """The tidy rows of one op column of a file."""
    column = f"time_stats.{op}.median"
    n = len(raw)
    mask = np.ones(n, bool)
    prefill = np.zeros(n, bool)
    if kind == "attention.csv":
        prefill = raw["is_prefill"].astype(str).str.lower().isin(("true", "1")).to_numpy()
        # a prefill row has no decode time and a decode row no prefill time; every other column is timed always
        mask = prefill if op == "attn_prefill" else ~prefill if op == "attn_decode" else mask
    _check_positive(path, raw, column, mask)
    out = pd.DataFrame({"op": op, "family": FAMILY[op], "gpu": labels[0], "source": labels[1]}, index=range(n))
    if kind == "mlp.csv":
        out["tokens"], out["hidden"], out["heads"] = _int(raw, "num_tokens"), _int(raw, "n_embd"), _int(raw, "n_head")
        out["kv_heads"], out["intermediate"] = _int(raw, "n_kv_head"), _int(raw, "n_expanded_embd")
        out["tp"] = _int(raw, "num_tensor_parallel_workers")
        gated = raw["use_gated_mlp"].astype(str).str.lower() if "use_gated_mlp" in raw.columns else None
        out["gated"] = True if gated is None else gated.isin(("true", "1")).to_numpy()
    elif kind == "attention.csv":
        out["hidden"], out["heads"], out["kv_heads"] = _int(raw, "n_embd"), _int(raw, "n_q_head"), \
            _int(raw, "n_kv_head")
        out["tp"], out["batch"] = _int(raw, "num_tensor_parallel_workers"), _int(raw, "batch_size")
        out["tokens"] = np.where(prefill, _int(raw, "prefill_chunk_size"), _int(raw, "batch_size"))
        out["context"], out["block_size"] = _int(raw, "kv_cache_size"), _int(raw, "block_size", 16)
        out["prefill"] = prefill
    else:
        out["tp"], out["devices_per_node"] = _int(raw, "num_workers"), _int(raw, "devices_per_node")
        out["message_bytes"] = pd.to_numeric(raw["size"]).to_numpy(float)
    out["measured_ms"] = pd.to_numeric(raw[column], errors="coerce").to_numpy(float)
    out["file"], out["line"] = str(path), np.arange(n) + 2
    defaults = {"tokens": 0, "hidden": 0, "heads": 0, "kv_heads": 0, "intermediate": 0, "gated": True, "tp": 1,
                "devices_per_node": 0, "message_bytes": 0.0, "batch": 0, "context": 0, "block_size": 0,
                "prefill": False}
    for column, value in defaults.items():
        if column not in out.columns:
            out[column] = value
    out = out[mask].reindex(columns=list(COLUMNS))
    return out.astype({c: np.int64 for c in INT_COLUMNS} | {"gated": bool, "prefill": bool, "line": np.int64})
