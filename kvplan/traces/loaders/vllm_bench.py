"""Per-request timings of a vLLM offline-engine benchmark run, as LLMServingSim's `python -m bench run` writes them
(`vllm/requests.jsonl`): `request_id` (a label such as `bench-0`), `input_toks`, `output_toks`, `arrival_time`
(wall-clock epoch seconds: when the workload released the request) and the engine's own monotonic-clock stamps
`queued_ts <= scheduled_ts <= first_token_ts <= last_token_ts`.

As a trace (`vllm-bench`) a row is its arrival and its token counts: the prompts' contents are not recorded, so the
requests carry no prefix identity (a replay's prefix cache has nothing to hit, as in the run, whose ShareGPT
prompts share none). `read_timings` returns what the engine measured per request, each stamp checked:
TTFT = first_token_ts - queued_ts, E2E = last_token_ts - queued_ts (engine-internal: no API server in the
offline bench), TPOT = (last_token_ts - first_token_ts) / (output_toks - 1), undefined for a one-token output.
The two clocks differ (wall vs monotonic), so arrival_time is never compared with the stamps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvplan.traces.loaders.jsonl_rows import read_jsonl
from kvplan.traces.loaders.options import LoadOptions
from kvplan.traces.loaders.rows import Rows
from kvplan.traces.loaders.spec import Field, jsonl_format, parse
from kvplan.traces.schema import LoadReport

# The engine's stamps, in the order a request passes them (seconds on one monotonic clock).
STAMPS = ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")
_STAMP_FIELDS = tuple(Field(f"_{name}", name, integer=False) for name in STAMPS)


def _check_stamps(rows: Rows, columns: dict[str, np.ndarray], opts: LoadOptions, report: LoadReport) -> None:
    """Each stamp no earlier than the one before it (a request is queued, scheduled, then emits its first and
    its last token); a row breaking that order is bad, named by line and the two fields."""
    stamps = [columns[f"_{name}"] for name in STAMPS]
    for (before, earlier), (after, later) in zip(zip(STAMPS, stamps, strict=True),
                                                 zip(STAMPS[1:], stamps[1:], strict=True), strict=False):
        with np.errstate(invalid="ignore"):
            wrong = rows.ok() & (later < earlier)
        rows.flag(wrong, lambda r, a=after, b=before, x=later, y=earlier:
                  f"{a} {x[r]:.6f} is before {b} {y[r]:.6f}; allowed: {' <= '.join(STAMPS)}")


VLLM_BENCH = jsonl_format(
    "vllm-bench",
    (Field("request_id", "request_id", kind="label"),
     Field("arrival_s", "arrival_time", integer=False),
     Field("prompt_tokens", "input_toks", minimum=1),
     Field("output_tokens", "output_toks", minimum=1),
     *_STAMP_FIELDS),
    "vLLM offline bench per-request timings (LLMServingSim bench requests.jsonl; arrival_time in s)",
    adjust=_check_stamps,
)


@dataclass(slots=True, frozen=True)
class Timings:
    """What the engine measured, one entry per request in file order (seconds; tpot NaN for one output token)."""

    request_id: tuple[str, ...]
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    queued_s: np.ndarray  # queued_ts as recorded (the engine's monotonic clock)
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2e_s: np.ndarray


def read_timings(path: str | Path) -> Timings:
    """Every request's measured TTFT, TPOT and E2E. The file must load as a `vllm-bench` trace (the same checks,
    the first bad row stops it: `path:LINE: problem; allowed: ...`)."""
    VLLM_BENCH.load(path, LoadOptions())  # every field, every row and the stamp order checked as for a replay
    rows = read_jsonl(path)
    columns = {f.column: parse(rows, f) for f in VLLM_BENCH.fields if f.kind != "label"}
    queued, first_token, last_token = (columns[f"_{n}"] for n in ("queued_ts", "first_token_ts", "last_token_ts"))
    output = columns["output_tokens"]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output > 1, (last_token - first_token) / (output - 1), np.nan)
    return Timings(tuple(str(v) for v in rows.fields["request_id"]), columns["prompt_tokens"].astype(np.int64),
                   output.astype(np.int64), queued, first_token - queued, tpot, last_token - queued)
