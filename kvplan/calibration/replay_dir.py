"""Reading an endpoint replay's directory (`kvplan replay --endpoint URL --out DIR`) for `calibrate --from-replay`,
every file checked: a problem is one line naming the file (and line) and what is allowed.

Kept apart from `kvplan.endpoint.result` (which writes these files) so that reading them needs neither the HTTP
client nor the engine: the light install calibrates from a replay another machine made.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kvplan.errors import UserError
from kvplan.limits import MAX_TOKENS
from kvplan.results.rejected import REASON
from kvplan.sim.cost.calibrated import MAX_BLOCK_SIZE, MAX_BLOCKS
from kvplan.strict_json import loads, whole, why

COLUMNS = ("request", "sample", "first_scheduled_s", "prompt_tokens", "output_tokens", "cached_prompt_tokens")
ALLOWED = ("the --out DIR of `kvplan replay --endpoint URL` (requests.parquet, tokens.jsonl, endpoint.json; rerun "
           "the replay to write it again)")


@dataclass(slots=True)
class Replay:
    endpoint: dict  # endpoint.json as written
    block_size: int | None  # from its cache_config (vllm:cache_config_info); None when the server does not say
    num_gpu_blocks: int | None
    table: pd.DataFrame  # COLUMNS of requests.parquet, one row per sequence
    times: list[np.ndarray]  # each row's token times (tokens.jsonl)


def read_replay(directory: Path) -> Replay:
    if not directory.is_dir():
        raise UserError(f"{directory}: not a directory; allowed: {ALLOWED}")
    for name in ("endpoint.json", "requests.parquet", "tokens.jsonl"):
        if not (directory / name).is_file():
            raise UserError(f"{directory / name}: missing, so this is not an endpoint replay; allowed: {ALLOWED}")
    endpoint = _endpoint(directory / "endpoint.json")
    cache = endpoint.get("cache_config") or {}
    server = endpoint.get("server") if isinstance(endpoint.get("server"), dict) else {}
    kv = server.get("kv_config") if isinstance(server.get("kv_config"), dict) else {}
    # vLLM's labels first; else the KV configuration another server's adapter read (llama.cpp's /props, ...)
    cache = {**{k: kv[f] for k, f in (("block_size", "block_size"), ("num_gpu_blocks", "num_blocks"))
                if kv.get(f) is not None}, **cache}
    table = _requests(directory / "requests.parquet")
    return Replay(endpoint, _cache_int(directory / "endpoint.json", cache, "block_size", MAX_BLOCK_SIZE),
                  _cache_int(directory / "endpoint.json", cache, "num_gpu_blocks", MAX_BLOCKS), table,
                  _token_times(directory / "tokens.jsonl", table))


def _endpoint(path: Path) -> dict:
    try:
        doc = loads(path.read_text(errors="replace"))
    except ValueError as exc:  # also NaN / Infinity, which Python's json would take
        raise UserError(f"{path}: {exc}; allowed: {ALLOWED}") from None
    if not isinstance(doc, dict) or not all(isinstance(doc.get(key) or {}, dict)
                                            for key in ("cache_config", "server_counters")):
        raise UserError(f"{path}: not an endpoint description; allowed: an object with url, model, cache_config "
                         "and server_counters (mappings)")
    return doc


def _cache_int(path: Path, cache: dict, key: str, maximum: int) -> int | None:
    text = cache.get(key)
    if text is None:
        return None
    # vLLM writes the labels as strings ("16"); 16.7 or true is not a block size, never rounded to one
    return whole(text, f"{path}: cache_config.{key}", 1, maximum)


def _requests(path: Path) -> pd.DataFrame:
    try:
        table = pd.read_parquet(path)
        if REASON in table.columns:  # never-served requests are rows too, with their reason: nothing to fit
            table = table[table[REASON].fillna("") == ""]
        table = table[list(COLUMNS)]
    except (OSError, ValueError, KeyError) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UserError(f"{path}: not a replay's per-request table ({reason}); allowed: a table with columns "
                         f"{', '.join(COLUMNS)}") from None
    if not len(table):
        raise UserError(f"{path}: no completed request; allowed: a replay in which requests completed")
    counts = [c for c in COLUMNS if not c.endswith("_s")]
    if not all(pd.api.types.is_integer_dtype(table[c]) for c in counts) or table["first_scheduled_s"].isna().any():
        raise UserError(f"{path}: {', '.join(counts)} must be integers and first_scheduled_s set; allowed: {ALLOWED}")
    if (table["prompt_tokens"] < 1).any() or (table["output_tokens"] < 1).any() or (table[counts] < 0).any(axis=None):
        raise UserError(f"{path}: a sequence with an empty prompt or output; allowed: {ALLOWED}")
    tokens = ["prompt_tokens", "output_tokens", "cached_prompt_tokens"]
    if (table[tokens] > MAX_TOKENS).any(axis=None):  # longer than any model's context: not a replay's count
        raise UserError(f"{path}: a token count above {MAX_TOKENS}; allowed: {ALLOWED}")
    return table.reset_index(drop=True)


def _token_times(path: Path, table: pd.DataFrame) -> list[np.ndarray]:
    """Each table row's token times, from tokens.jsonl (every line checked, its line number named)."""
    index = {(int(r), int(s)): i for i, (r, s) in enumerate(zip(table["request"], table["sample"], strict=True))}
    lengths = table["output_tokens"].to_numpy()
    out: list[np.ndarray | None] = [None] * len(table)
    with open(path, errors="replace") as f:
        for number, line in enumerate(f, 1):
            where = f"{path}:{number}"
            try:
                doc = loads(line)
                key = (whole(doc["row"], "row", 0), whole(doc["sample"], "sample", 0))
                times = np.array(doc["times_s"], dtype=np.float64)
            except (KeyError, TypeError, ValueError) as exc:
                raise UserError(f'{where}: not a token-times line ({why(exc)}); allowed: {{"row": R, "sample": S, '
                                 '"times_s": [t, ...]}') from None
            if times.ndim != 1 or not np.isfinite(times).all() or (np.diff(times) < 0).any():
                raise UserError(f"{where}: times_s: allowed: finite seconds in non-decreasing order")
            i = index.get(key)
            if i is None or out[i] is not None:
                raise UserError(f"{where}: row {key[0]} sample {key[1]} is {'repeated' if i is not None else 'not'} "
                                 "in requests.parquet; allowed: one line per row of requests.parquet")
            if len(times) != lengths[i]:
                raise UserError(f"{where}: {len(times)} times for {lengths[i]} output tokens (requests.parquet); "
                                 "allowed: one time per output token")
            out[i] = times
    missing = [key for key, i in index.items() if out[i] is None]
    if missing:
        raise UserError(f"{path}: no line for row {missing[0][0]} sample {missing[0][1]} of requests.parquet; "
                         "allowed: one line per row")
    return out
