"""Request-length tables of the Vidur / Splitwise / Sarathi family.

- `vidur`: Vidur's request traces, `arrived_at,num_prefill_tokens,num_decode_tokens` (seconds).
- `lengths`: the length-only distributions (`num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio`,
  e.g. etalon's ShareGPT and arXiv tables): no arrivals, so re-time them before replaying.
- `splitwise`: splitwise-sim's request CSV, `request_id,request_type,application_id,arrival_timestamp,batch_size,
  prompt_size,token_size` (arrival in seconds; `request_type` 2 is LLM inference; `batch_size` is 1 in every
  published and generated trace: a row batching several prompts is refused rather than counted as one).
"""

from __future__ import annotations

import numpy as np

from kvplan.traces.loaders.options import LoadOptions
from kvplan.traces.loaders.rows import Rows
from kvplan.traces.loaders.spec import Field, csv_format
from kvplan.traces.schema import LoadReport

_LENGTHS = (Field("prompt_tokens", "num_prefill_tokens", minimum=1),
            Field("output_tokens", "num_decode_tokens"))

VIDUR = csv_format(
    "vidur",
    (Field("arrival_s", "arrived_at", integer=False), *_LENGTHS),
    "Vidur / Splitwise CSV with arrivals (seconds)",
)

LENGTHS = csv_format(
    "lengths",
    _LENGTHS,
    "length-only CSV (Vidur/etalon distributions; arrivals are all 0 until re-timed)",
    timed=False, optional=("num_total_tokens", "pd_ratio"),
)


def _single_prompt(rows: Rows, columns: dict[str, np.ndarray], opts: LoadOptions, report: LoadReport) -> None:
    batch = columns.pop("_batch")
    rows.flag(batch != 1, lambda r: f"batch_size {batch[r]:g} is not supported; allowed: 1 (one prompt per "
                                    "request)")


SPLITWISE = csv_format(
    "splitwise",
    (Field("request_id", "request_id"),
     Field("arrival_s", "arrival_timestamp", integer=False),
     Field("prompt_tokens", "prompt_size", minimum=1),
     Field("output_tokens", "token_size"),
     Field("_batch", "batch_size", minimum=1)),
    "splitwise-sim request CSV (arrival_timestamp in seconds)",
    adjust=_single_prompt, extra_required=("request_type", "application_id"),
)
