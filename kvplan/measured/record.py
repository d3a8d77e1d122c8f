"""What a benchmark tool's result file says, in one shape whatever tool wrote it.

Invariant: every number is in seconds, tokens or requests (a reader converts the tool's milliseconds), and
every value a reader did not find in the file is None - never a made-up default. What the comparison must
guess (a GPU, a TP size, a block size) is added later by the caller and listed in `guessed`, so that the
output can say which facts came from the file and which did not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The latency metrics a comparison reports, in this order; each is per request, in seconds.
METRICS = ("ttft", "tpot", "itl", "e2e")


@dataclass(slots=True)
class MeasuredRequest:
    """One request as the tool recorded it. `start_s`: when it was sent, from the run's start (None: not
    recorded). `ok` False: the tool counted it as failed (it is replayed, but not measured)."""

    prompt_tokens: int
    output_tokens: int
    start_s: float | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] | None = None  # inter-token latencies, when the tool kept them
    ok: bool = True


@dataclass(slots=True)
class MeasuredRun:
    """One benchmark run (a file may hold several: a GuideLLM sweep; `run_label` names which).

    `requests`: per-request records when the file has them, else None and the workload is `prompt_tokens` /
    `output_tokens` lists (the dataset's lengths) or their means. `rate_rps` (None: not rate-driven; inf: all
    at once) and `max_concurrency` (None: unbounded) say how the tool sent them. `percentiles[metric][p]` is the
    tool's own figure in seconds (p: 50, 90, 95, 99, or "mean"); `throughput` holds `request_rps`,
    `output_tps`, `total_tps` as the tool reported them; `settings` what it recorded of the server (vLLM's
    setting names)."""

    source: str  # the file, as the user named it
    format: str  # a key of formats.FORMATS
    tool: str  # the tool and its version as recorded, e.g. "vllm bench serve 0.34.0"
    run_label: str = ""
    model: str | None = None
    rate_rps: float | None = None
    max_concurrency: int | None = None
    duration_s: float | None = None
    num_requests: int | None = None
    requests: list[MeasuredRequest] | None = None
    prompt_tokens: list[int] | None = None
    output_tokens: list[int] | None = None
    percentiles: dict[str, dict[str, float]] = field(default_factory=dict)
    throughput: dict[str, float] = field(default_factory=dict)
    settings: dict[str, object] = field(default_factory=dict)
    guessed: list[str] = field(default_factory=list)  # "facts" the caller supplied: "hardware h100 (--hardware)"
    # Added for `vllm bench serve` (both optional, so every reader may leave them): the coefficient of variation
    # of the gaps between sends when rate-driven (vLLM's --burstiness b: gamma gaps, CV 1/sqrt(b); None: Poisson,
    # CV 1), and what the reader derived rather than read, one line each ("lengths: the means of the totals").
    arrival_cv: float | None = None
    notes: list[str] = field(default_factory=list)
