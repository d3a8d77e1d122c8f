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
from dataclasses import dataclass

from kvplan.errors import UserError
from kvplan.measured.record import MeasuredRequest, MeasuredRun
from kvplan.strict_json import short, whole

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


@dataclass(slots=True, frozen=True)
class _At:
    """A value of the report and the JSON path it sits at (`benchmarks[0].metrics.request_latency`), so that
    every complaint names the field: the one way this module reads a field."""

    value: object
    path: str
    source: str

    def fail(self, problem: str, allowed: str = _ALLOWED) -> UserError:
        return UserError(f"{self.source}: GuideLLM report: {problem}; allowed: {allowed}")

    def _child(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def opt(self, name: str) -> _At | None:
        """Field `name` of this object; None when it is absent or null."""
        if not isinstance(self.value, dict):
            raise self.fail(f"{self.path or 'the document'}: {short(self.value)} is not an object")
        value = self.value.get(name)
        return None if value is None else _At(value, self._child(name), self.source)

    def get(self, name: str) -> _At:
        """Field `name` of this object, required: absent or null is a `missing <path>` error."""
        found = self.opt(name)
        if found is None:
            raise self.fail(f"missing {self._child(name)}")
        return found

    def items(self) -> list[_At]:
        if not isinstance(self.value, list):
            raise self.fail(f"{self.path}: {short(self.value)} is not a list")
        return [_At(v, f"{self.path}[{i}]", self.source) for i, v in enumerate(self.value)]

    def number(self) -> float:
        if isinstance(self.value, bool) or not isinstance(self.value, int | float) or not math.isfinite(self.value):
            raise self.fail(f"{self.path}: {short(self.value)} is not a finite number")
        return float(self.value)

    def count(self, low: int = 0) -> int:
        return whole(self.value, f"{self.source}: GuideLLM report: {self.path}", low=low)

    def text(self) -> str:
        if not isinstance(self.value, str):
            raise self.fail(f"{self.path}: {short(self.value)} is not a string")
        return self.value


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
    root = _At(document, "", source)
    metadata = root.get("metadata")
    version = metadata.get("version")
    if version.value != SCHEMA_VERSION:
        raise version.fail(f"metadata.version {short(version.value)} is not supported",
                           f"{SCHEMA_VERSION} (the report of GuideLLM 0.8)")
    tool = f"{TOOL} {metadata.get('guidellm_version').text()}"
    benchmarks = root.get("benchmarks").items()
    if not benchmarks:
        raise root.fail("benchmarks is an empty list (a report of no benchmark)")
    return [_run(bench, source, tool) for bench in benchmarks]


def _run(bench: _At, source: str, tool: str) -> MeasuredRun:
    config = bench.get("config")
    label, rate, concurrency, arrivals = _schedule(config.get("strategy"))
    model_at = config.get("backend").opt("model")
    model = model_at.text() if model_at is not None else ""  # "": none named (GuideLLM took the server's first)
    records = _requests(bench)
    run = MeasuredRun(source=source, format="guidellm", tool=tool, run_label=label, model=model or None,
                      rate_rps=rate, max_concurrency=concurrency, duration_s=bench.get("duration").number(),
                      percentiles=_percentiles(bench.get("metrics")), throughput=_throughput(bench.get("metrics")),
                      settings={"arrival_process": arrivals} if arrivals else {})
    sample_size = config.opt("sample_size")
    kept = [len(bench.get("requests").get(status).items()) for status, _ in _STATUSES]
    if sample_size is not None and sample_size.count() > 0 and max(kept) >= sample_size.count():
        # A status at the reservoir's size may have had more requests: the records are a sample of the lengths.
        run.prompt_tokens = [r.prompt_tokens for r in records if r.ok]
        run.output_tokens = [r.output_tokens for r in records if r.ok]
        run.num_requests = bench.get("scheduler_state").get("processed_requests").count()
    else:
        run.requests, run.num_requests = records, len(records)
    return run


def _schedule(strategy: _At) -> tuple[str, float | None, int | None, str | None]:
    """(label, rate_rps, max_concurrency, arrival process) of a strategy; the label is GuideLLM's `str(strategy)`.
    `max_concurrency` is the strategy's own cap as recorded (GuideLLM fills in its 10,240 default where the user
    set none); synchronous sends one request at a time, concurrent keeps `streams` in flight, throughput sends
    everything at once (rate inf) and trace replays timestamps (the requests' `start_s`)."""
    kind_at = strategy.get("type_")
    kind = kind_at.text()
    cap_at = strategy.opt("max_concurrency")
    cap = cap_at.count(low=1) if cap_at is not None else None
    if kind == "synchronous":
        return kind, None, 1, None
    if kind == "concurrent":
        streams = strategy.get("streams").count(low=1)
        return f"concurrent@{streams}", None, streams, None
    if kind == "throughput":
        return f"throughput@{cap or 'unlimited'}", math.inf, cap, None
    if kind in ("constant", "poisson"):
        rate = strategy.get("rate").number()
        return f"{kind}@{rate:.2f}", rate, cap, kind
    if kind == "trace":
        return f"trace@{strategy.get('time_scale').number():.2f}", None, cap, None
    raise kind_at.fail(f"{kind_at.path}: {short(kind)} is not a strategy kvplan reads", ", ".join(_STRATEGIES))


def _requests(bench: _At) -> list[MeasuredRequest]:
    """Every request record of the three status groups, in the order they were sent (unknown send times last)."""
    origin = bench.get("scheduler_metrics").get("request_start_time").number()
    groups = bench.get("requests")
    records = [_request(item, ok, origin) for status, ok in _STATUSES for item in groups.get(status).items()]
    records.sort(key=lambda r: math.inf if r.start_s is None else r.start_s)
    return records


def _request(item: _At, ok: bool, origin: float) -> MeasuredRequest:
    output = item.get("output_tokens") if ok else item.opt("output_tokens")
    start, ttft, e2e = (item.opt(name) for name in ("request_start_time", "time_to_first_token_ms", "request_latency"))
    return MeasuredRequest(prompt_tokens=item.get("prompt_tokens").count(),
                           output_tokens=output.count() if output is not None else 0,
                           start_s=start.number() - origin if start is not None else None,
                           ttft_s=ttft.number() / 1000.0 if ttft is not None else None,
                           e2e_s=e2e.number() if e2e is not None else None, ok=ok)


def _percentiles(metrics: _At) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for metric, (name, seconds) in _LATENCIES.items():
        summary = metrics.get(name).get("successful")
        if summary.get("count").count() == 0:
            continue  # GuideLLM writes 0.0 for every statistic of an empty distribution: nothing was measured
        points = summary.get("percentiles")
        out[metric] = {p: points.get(key).number() * seconds for p, key in _POINTS.items()}
        out[metric]["mean"] = summary.get("mean").number() * seconds
    return out


def _throughput(metrics: _At) -> dict[str, float]:
    return {key: metrics.get(name).get("successful").get("mean").number() for key, name in _THROUGHPUT.items()}
