"""Vidur / Splitwise request traces (`arrived_at,num_prefill_tokens,num_decode_tokens`) and the length-only
distributions (`num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio`: no arrivals, so re-time
them before replaying)."""

from traces.loaders.spec import Field, csv_format

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
    timed=False,
)
