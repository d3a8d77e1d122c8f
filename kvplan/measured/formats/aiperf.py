"""AIPerf (NVIDIA's `aiperf profile`) result files: the summary `profile_export_aiperf.json`, and the per-request
`profile_export.jsonl` beside it when the run wrote one (its default `--export-level records` does).

Read from AIPerf 0.13.0's own source (the PyPI release; repository ai-dynamo/aiperf, under src/aiperf/):
- the summary is `JsonExportData` (common/models/export_models.py, schema_version "1.4"): one object per metric
  tag, `{"unit": ..., "avg": ..., "p50": ..., "p90": ..., "p95": ..., "p99": ...}`, plus `input_config` (the
  run's resolved configuration: `models.items[].name`, `phases[]` with `kind` "profiling" and its `rate` and
  `concurrency`, config/phases.py), `aiperf_version` and `error_request_count` (only when a request failed).
- a JSON-lines record is `MetricRecordInfo` (common/models/record_models.py): `metadata.request_start_ns`
  (wall clock, ns), `metadata.benchmark_phase` ("warmup" records are not the run), `metadata.was_cancelled`,
  `metrics.<tag> = {"value", "unit"}`, and `error` (null unless the request failed).
- units: every time metric is kept in ns and exported in its display unit, named in its `unit` field
  (`MetricTimeUnit` tags ns/us/ms/sec, common/enums/metric_enums.py); this reader converts by that field.
- file names (config/artifacts.py): `profile_export_aiperf.json` beside `profile_export.jsonl`; with
  `--profile-export-prefix foo`, `foo.json` beside `foo.jsonl`.

The metrics (metrics/types/): `request_latency` is E2E; `time_to_first_token` TTFT; `inter_token_latency` is
(E2E - TTFT) / (output tokens - 1) per request, which is vLLM's and kvplan's TPOT; `inter_chunk_latency` is every
gap between streamed content chunks, which is the ITL distribution (a token per chunk, as vLLM and `kvplan
serve` stream). Token counts: `usage_prompt_tokens` / `usage_completion_tokens` are the server's own (what the
engine computed) and are preferred; `input_sequence_length` / `output_sequence_length` are AIPerf's client-side
tokenizer counts, used where the server reported no usage. `request_count` counts the valid requests and
`error_request_count` the failed ones: the run sent their sum.
"""

from __future__ import annotations

from pathlib import Path

from kvplan import limits
from kvplan.measured.formats._fields import Fields, read_json_lines, sibling
from kvplan.measured.record import MeasuredRequest, MeasuredRun

TOOL = "AIPerf"
_FORMAT = "aiperf"
_EXPECTED = "expected as `aiperf profile` writes profile_export_aiperf.json"
_RECORD_EXPECTED = "expected as `aiperf profile` writes profile_export.jsonl"

_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "sec": 1.0}  # MetricTimeUnit tags
_FIGURES = {"p50": "50", "p90": "90", "p95": "95", "p99": "99", "avg": "mean"}
# record metric -> AIPerf metric tag (see the module docstring for why TPOT is AIPerf's "inter_token_latency")
_LATENCY = {"ttft": "time_to_first_token", "tpot": "inter_token_latency", "itl": "inter_chunk_latency",
            "e2e": "request_latency"}
_THROUGHPUT = {"request_rps": "request_throughput", "output_tps": "output_token_throughput",
               "total_tps": "total_token_throughput"}
# (server's count, AIPerf's own count): the first one a record or the summary has is used
_PROMPT = ("usage_prompt_tokens", "input_sequence_length")
_OUTPUT = ("usage_completion_tokens", "output_sequence_length")


def detect(document: object) -> bool:
    """An AIPerf summary: a JSON object with `aiperf_version`, or (exports from before the version was written)
    with `input_config` and a `request_latency` metric."""
    return isinstance(document, dict) and (
        "aiperf_version" in document
        or ("input_config" in document and isinstance(document.get("request_latency"), dict)))


def records_name(summary: str) -> str:
    """The per-request JSON-lines file AIPerf writes beside the summary `summary` (config/artifacts.py):
    profile_export_aiperf.json -> profile_export.jsonl; with a prefix, foo.json -> foo.jsonl."""
    name = Path(summary).name
    return "profile_export.jsonl" if name == "profile_export_aiperf.json" else f"{Path(name).stem}.jsonl"


def read(document: object, source: str) -> list[MeasuredRun]:
    """The one run an AIPerf summary holds, with its per-request records when `records_name(source)` lies
    beside it (their count must be the summary's: a file from another run is refused, not mixed in)."""
    fields = Fields(source, "AIPerf export", _EXPECTED)
    fields.mapping(document)
    phase = _profiling_phase(fields, document)
    valid = fields.count(document, "request_count", "avg")
    failed = fields.count(document, "error_request_count", "avg", required=False) or 0
    assert valid is not None  # required
    run = MeasuredRun(
        source=source, format=_FORMAT,
        tool=f"{TOOL} {fields.text(document, 'aiperf_version', required=False) or '(version not recorded)'}",
        model=fields.text(document, "input_config", "models", "items", 0, "name", required=False),
        rate_rps=fields.number(phase, "rate", required=False),
        max_concurrency=fields.count(phase, "concurrency", required=False),
        duration_s=_seconds(fields, document, "benchmark_duration", "avg", required=False),
        num_requests=valid + failed,
    )
    for metric, tag in _LATENCY.items():
        figures = fields.figures(document, (tag,), _FIGURES, _scale(fields, document, tag, metric == "e2e"),
                                 required=metric == "e2e")  # E2E exists for every run; the rest need streaming
        if figures:
            run.percentiles[metric] = figures
    for name, tag in _THROUGHPUT.items():
        unit = fields.text(document, tag, "unit", required=name == "request_rps")
        if unit is not None and not unit.endswith("/sec"):
            raise fields.fail(f"{tag}.unit is {unit!r}; allowed: a rate per second (requests/sec, tokens/sec)")
        value = fields.number(document, tag, "avg", required=name == "request_rps")
        if value is not None:
            run.throughput[name] = value
    records = sibling(source, records_name(source))
    if records is not None:
        run.requests = _requests(records, valid + failed, source)
    else:  # the summary alone: the dataset's mean lengths
        prompt = _first(fields, document, _PROMPT, "avg")
        output = _first(fields, document, _OUTPUT, "avg")
        run.prompt_tokens = None if prompt is None else [round(prompt)]
        run.output_tokens = None if output is None else [round(output)]
    return [run]


def _profiling_phase(fields: Fields, document: object) -> dict:
    """The phase whose records are the run (`kind` "profiling"; a warmup phase is not measured)."""
    phases = fields.items(document, "input_config", "phases")
    assert phases is not None  # required
    for index in range(len(phases)):
        if fields.text(phases, index, "kind", required=False) == "profiling":
            phase = fields.mapping(phases, index)
            assert phase is not None
            return phase
    raise fields.fail(f"missing input_config.phases[kind=profiling]; {_EXPECTED}")


def _scale(fields: Fields, doc: object, tag: str, required: bool) -> float:
    """Seconds per unit of the time metric `tag` (1.0 when the metric is absent: nothing is scaled)."""
    unit = fields.text(doc, tag, "unit", required=required)
    if unit is None:
        return 1.0
    if unit not in _SECONDS:
        raise fields.fail(f"{tag}.unit is {unit!r}; allowed: {', '.join(_SECONDS)}")
    return _SECONDS[unit]


def _seconds(fields: Fields, doc: object, tag: str, key: str, required: bool = True) -> float | None:
    value = fields.number(doc, tag, key, required=required)
    return None if value is None else value * _scale(fields, doc, tag, required=True)


def _first(fields: Fields, doc: object, tags: tuple[str, ...], key: str) -> float | None:
    """The first of `tags` the document has (the server's count before AIPerf's own)."""
    for tag in tags:
        value = fields.number(doc, tag, key, required=False)
        if value is not None:
            return value
    return None


def _requests(path: Path, expected: int, summary: str) -> list[MeasuredRequest]:
    """The profiling records of `path`, in the order they were sent, `start_s` from the first send."""
    starts: list[int] = []
    requests: list[MeasuredRequest] = []
    for line, record in read_json_lines(path, "AIPerf records"):
        fields = Fields(f"{path}:{line}", "AIPerf record", _RECORD_EXPECTED)
        if fields.text(record, "metadata", "benchmark_phase", required=False) not in (None, "profiling"):
            continue
        if len(requests) == limits.MAX_TRACE_LINES:
            raise fields.fail(f"more than {limits.MAX_TRACE_LINES} records; allowed: at most that many")
        start = fields.count(record, "metadata", "request_start_ns")
        assert start is not None  # required
        ok = (fields.get(record, "error", required=False) is None
              and fields.get(record, "metadata", "was_cancelled", required=False) is not True)
        # a failed request has only the prompt AIPerf sent (`error_isl`) and no output
        prompt = _token_count(fields, record, (*_PROMPT, "error_isl"))
        output = _token_count(fields, record, _OUTPUT, required=ok)
        assert prompt is not None  # required
        gaps = fields.items(record, "metrics", "inter_chunk_latency", "value", required=False)
        gap_scale = _record_scale(fields, record, "inter_chunk_latency") if gaps is not None else 1.0
        starts.append(start)
        requests.append(MeasuredRequest(
            prompt_tokens=prompt,
            output_tokens=output if output is not None else 0,  # a failed request received nothing
            ttft_s=_record_seconds(fields, record, "time_to_first_token"),
            e2e_s=_record_seconds(fields, record, "request_latency", required=ok),
            itl_s=None if gaps is None else [
                gap_scale * (fields.number(record, "metrics", "inter_chunk_latency", "value", index) or 0.0)
                for index in range(len(gaps))],
            ok=ok))
    if len(requests) != expected:
        raise Fields(str(path), "AIPerf records", _RECORD_EXPECTED).fail(
            f"{len(requests)} profiling records, but {summary} counts {expected} requests; allowed: the records "
            "written with that summary")
    first = min(starts, default=0)
    for request, start in zip(requests, starts, strict=True):
        request.start_s = (start - first) * 1e-9
    order = sorted(range(len(requests)), key=lambda index: starts[index])
    return [requests[index] for index in order]


def _token_count(fields: Fields, record: object, tags: tuple[str, ...], required: bool = True) -> int | None:
    """The first of `tags` the record has; missing, it is named by AIPerf's own count (`tags[1]`)."""
    for tag in tags:
        value = fields.count(record, "metrics", tag, "value", required=False, high=limits.MAX_TOKENS)
        if value is not None:
            return value
    if required:
        raise fields.fail(f"missing metrics.{tags[1]}.value; {_RECORD_EXPECTED}")
    return None


def _record_scale(fields: Fields, record: object, tag: str) -> float:
    unit = fields.text(record, "metrics", tag, "unit")
    if unit not in _SECONDS:
        raise fields.fail(f"metrics.{tag}.unit is {unit!r}; allowed: {', '.join(_SECONDS)}")
    return _SECONDS[unit]


def _record_seconds(fields: Fields, record: object, tag: str, required: bool = False) -> float | None:
    value = fields.number(record, "metrics", tag, "value", required=required)
    return None if value is None else value * _record_scale(fields, record, tag)
