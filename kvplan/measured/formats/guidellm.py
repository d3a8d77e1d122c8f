"""GuideLLM's benchmark report (`guidellm run --output kind=json`): one `MeasuredRun` per benchmark in it.

The schema is GuideLLM 0.8.1's (report `metadata.version` 2), read from its pydantic models:
`guidellm.benchmark.schemas.report.GenerativeBenchmarksReport` (`metadata`, `config`, `benchmarks`); each benchmark a
`guidellm.benchmark.schemas.benchmark.GenerativeBenchmark` whose `config.strategy` is a
`guidellm.scheduler.strategies.SchedulingStrategy` (`type_` synchronous, concurrent, throughput, constant, poisson
or trace), `scheduler_metrics` a `benchmark.schemas.metrics.SchedulerMetrics`, `metrics` a
`benchmark.schemas.metrics.GenerativeMetrics` and `requests` lists (successful, errored, incomplete) of
`guidellm.schemas.base.request_stats.GenerativeRequestStats`.

Where each number comes from (GuideLLM's field names; its `*_ms` fields are milliseconds, the rest seconds):
- per request (`requests.<status>[i]`): `prompt_tokens`, `output_tokens` (the server's usage counts when it sent
  them, else GuideLLM's own), `request_start_time` (epoch s; `start_s` counts from the benchmark's
  `scheduler_metrics.request_start_time`, its first request), `time_to_first_token_ms` (first streamed token minus
  request start), `request_latency` (request end minus start). Errored and incomplete (cancelled at the run's end)
  requests are `ok=False`; one with no output count produced none (GuideLLM's totals count it as 0 too).
  `itl_s` stays None: GuideLLM keeps each request's mean gap, not the gaps.
- `percentiles` from `metrics.<name>.successful` (`percentiles.p50/p90/p95/p99` and `mean`): ttft <-
  `time_to_first_token_ms`; itl <- `inter_token_latency_ms`, per request (last token - first token) / (output - 1)
  weighted by output - 1, so its mean is the mean over all gaps as vLLM's ITL, its percentiles those of the
  requests' mean gaps; e2e <- `request_latency`. No tpot: GuideLLM's `time_per_output_token_ms` is
  (last token - request start) / output, the first token's wait included, which is not vLLM's TPOT (TTFT and
  E2E per request give that). A metric with no successful sample is left out (GuideLLM writes zeros there).
  They cover the measurement window (after warm-up, before cool-down); `requests` holds every request sent.
- `throughput`: the `.successful.mean` of `requests_per_second`, `output_tokens_per_second`, `tokens_per_second`
  (GuideLLM's duration-weighted mean rate: the window's successful requests or tokens over its `duration`).
- `rate_rps`, `max_concurrency`, `run_label` from `config.strategy` (the label as GuideLLM prints the strategy);
  `model` from `config.backend.model`; `duration_s` from `duration` (the measurement window).
With `config.sample_size` N > 0, GuideLLM keeps at most N requests per status (a uniform reservoir sample): a file
where a status holds N is read as sampled, its successful requests' lengths become `prompt_tokens` /
`output_tokens` and `num_requests` is `scheduler_state.processed_requests`.
"""

from __future__ import annotations

import math

from kvplan.measured.formats._fields import Fields, Key, key_path
from kvplan.measured.record import MeasuredRequest, MeasuredRun
from kvplan.strict_json import short

TOOL = "GuideLLM"
SCHEMA_VERSION = 2  # GuideLLM's GenerativeBenchmarkMetadata.version: bumped on a breaking change to the report
_ALLOWED = f"a report as `guidellm run --output kind=json` writes it (GuideLLM 0.8, schema version {SCHEMA_VERSION})"

_POINTS = {"50": "p50", "90": "p90", "95": "p95", "99": "p99"}  # record.py's percentile keys -> GuideLLM's
# kvplan metric -> (GuideLLM's distribution under `metrics`, seconds per unit of it)
_LATENCIES = {"ttft": ("time_to_first_token_ms", 1e-3), "itl": ("inter_token_latency_ms", 1e-3),
              "e2e": ("request_latency", 1.0)}
_THROUGHPUT = {"request_rps": "requests_per_second", "output_tps": "output_tokens_per_second",
               "total_tps": "tokens_per_second"}
_STATUSES = (("successful", True), ("errored", False), ("incomplete", False))  # GuideLLM's groups; ok
_STRATEGIES = ("synchronous", "concurrent", "throughput", "constant", "poisson", "trace")

# Every field is read from the report's root by its full key path (a function gets the `_KeyPath` of the object it
# reads, e.g. ("benchmarks", 0, "config")), so that each complaint names the field as it sits in the file.
_KeyPath = tuple[Key, ...]


def detect(document: object) -> bool:
    """A GuideLLM report: an object with a `benchmarks` list and GuideLLM's `metadata.guidellm_version`, or
    benchmarks typed `generative_benchmark` (an older report, which `read` then names as unsupported)."""
    if not isinstance(document, dict) or not isinstance(document.get("benchmarks"), list):
        return False
    metadata = document.get("metadata")
    return ((isinstance(metadata, dict) and "guidellm_version" in metadata)
            or any(isinstance(b, dict) and b.get("type_") == "generative_benchmark" for b in document["benchmarks"]))


def read(document: object, source: str) -> list[MeasuredRun]:
    """Every benchmark of the report, in its order; a missing or malformed field is a one-line `UserError`."""
    fields = Fields(source, "GuideLLM report", f"allowed: {_ALLOWED}")
    fields.mapping(document)
    fields.mapping(document, "metadata")
    version = fields.get(document, "metadata", "version")
    if version != SCHEMA_VERSION:
        raise fields.fail(f"metadata.version {short(version)} is not supported; "
                          f"allowed: {SCHEMA_VERSION} (the report of GuideLLM 0.8)")
    tool = f"{TOOL} {fields.text(document, 'metadata', 'guidellm_version')}"
    benchmarks = fields.items(document, "benchmarks")
    if not benchmarks:
        raise fields.fail(f"benchmarks is an empty list (a report of no benchmark); {fields.expected}")
    return [_run(fields, document, ("benchmarks", index), tool) for index in range(len(benchmarks))]


def _run(fields: Fields, report: object, bench: _KeyPath, tool: str) -> MeasuredRun:
    fields.mapping(report, *bench)
    config = (*bench, "config")
    fields.mapping(report, *config)
    label, rate, concurrency, arrivals = _schedule(fields, report, (*config, "strategy"))
    fields.mapping(report, *config, "backend")
    # None where the report names no model (GuideLLM then took the server's first): "" counts as none too
    model = fields.text(report, *config, "backend", "model", required=False) or None
    records = _requests(fields, report, bench)
    metrics = (*bench, "metrics")
    fields.mapping(report, *metrics)
    run = MeasuredRun(source=fields.source, format="guidellm", tool=tool, run_label=label, model=model,
                      rate_rps=rate, max_concurrency=concurrency,
                      duration_s=_number(fields, report, *bench, "duration"),
                      percentiles=_percentiles(fields, report, metrics),
                      throughput=_throughput(fields, report, metrics),
                      settings={"arrival_process": arrivals} if arrivals else {})
    sample_size = fields.count(report, *config, "sample_size", required=False)
    kept = [len(fields.items(report, *bench, "requests", status) or ()) for status, _ in _STATUSES]
    if sample_size and max(kept) >= sample_size:
        # A status at the reservoir's size may have had more requests: the records are a sample of the lengths.
        run.prompt_tokens = [r.prompt_tokens for r in records if r.ok]
        run.output_tokens = [r.output_tokens for r in records if r.ok]
        run.num_requests = fields.count(report, *bench, "scheduler_state", "processed_requests")
    else:
        run.requests, run.num_requests = records, len(records)
    return run


def _schedule(fields: Fields, report: object, strategy: _KeyPath) -> tuple[str, float | None, int | None, str | None]:
    """(label, rate_rps, max_concurrency, arrival process) of a strategy; the label is GuideLLM's `str(strategy)`.
    `max_concurrency` is the strategy's own cap as recorded (GuideLLM fills in its 10,240 default where the user
    set none); synchronous sends one request at a time, concurrent keeps `streams` in flight, throughput sends
    everything at once (rate inf) and trace replays timestamps (the requests' `start_s`)."""
    fields.mapping(report, *strategy)
    kind = fields.text(report, *strategy, "type_")
    cap = fields.count(report, *strategy, "max_concurrency", required=False, low=1)
    if kind == "synchronous":
        return kind, None, 1, None
    if kind == "concurrent":
        streams = fields.count(report, *strategy, "streams", low=1)
        return f"concurrent@{streams}", None, streams, None
    if kind == "throughput":
        return f"throughput@{cap or 'unlimited'}", math.inf, cap, None
    if kind in ("constant", "poisson"):
        rate = _number(fields, report, *strategy, "rate")
        return f"{kind}@{rate:.2f}", rate, cap, kind
    if kind == "trace":
        return f"trace@{_number(fields, report, *strategy, 'time_scale'):.2f}", None, cap, None
    raise fields.fail(f"{key_path((*strategy, 'type_'))}: {short(kind)} is not a strategy kvplan reads; "
                      f"allowed: {', '.join(_STRATEGIES)}")


def _requests(fields: Fields, report: object, bench: _KeyPath) -> list[MeasuredRequest]:
    """Every request record of the three status groups, in the order they were sent (unknown send times last)."""
    origin = _number(fields, report, *bench, "scheduler_metrics", "request_start_time")
    fields.mapping(report, *bench, "requests")
    records = [_request(fields, report, (*bench, "requests", status, index), ok, origin)
               for status, ok in _STATUSES
               for index in range(len(fields.items(report, *bench, "requests", status) or ()))]
    records.sort(key=lambda r: math.inf if r.start_s is None else r.start_s)
    return records


def _request(fields: Fields, report: object, item: _KeyPath, ok: bool, origin: float) -> MeasuredRequest:
    """One request; a failed one with no output count produced none (GuideLLM's totals count it as 0 too)."""
    fields.mapping(report, *item)
    prompt = fields.count(report, *item, "prompt_tokens")
    assert prompt is not None  # required: an absent one raised
    start, ttft, e2e = (fields.number(report, *item, name, required=False)
                        for name in ("request_start_time", "time_to_first_token_ms", "request_latency"))
    return MeasuredRequest(prompt_tokens=prompt,
                           output_tokens=fields.count(report, *item, "output_tokens", required=ok) or 0,
                           start_s=start - origin if start is not None else None,
                           ttft_s=ttft / 1000.0 if ttft is not None else None,
                           e2e_s=e2e, ok=ok)


def _percentiles(fields: Fields, report: object, metrics: _KeyPath) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for metric, (name, seconds) in _LATENCIES.items():
        summary = (*metrics, name, "successful")
        fields.mapping(report, *summary)
        if fields.count(report, *summary, "count") == 0:
            continue  # GuideLLM writes 0.0 for every statistic of an empty distribution: nothing was measured
        out[metric] = {p: _number(fields, report, *summary, "percentiles", key) * seconds
                       for p, key in _POINTS.items()}
        out[metric]["mean"] = _number(fields, report, *summary, "mean") * seconds
    return out


def _throughput(fields: Fields, report: object, metrics: _KeyPath) -> dict[str, float]:
    return {key: _number(fields, report, *metrics, name, "successful", "mean") for key, name in _THROUGHPUT.items()}


def _number(fields: Fields, report: object, *keys: Key) -> float:
    """A required finite number >= 0 (`Fields.number`): every time, rate and statistic GuideLLM writes is one."""
    value = fields.number(report, *keys)
    assert value is not None  # required: an absent one raised
    return value
