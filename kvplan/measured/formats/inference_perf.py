"""inference-perf (kubernetes-sigs/inference-perf, llm-d's benchmark) reports: `summary_lifecycle_metrics.json`
or one `stage_<N>_lifecycle_metrics.json`, with the files the same run wrote beside them.

Read from inference-perf 0.7.0's own source (the PyPI release; repository kubernetes-sigs/inference-perf):
- inference_perf/reportgen/base.py: `summarize_requests` writes every lifecycle report (`ResponsesSummary`):
  `benchmark_time_seconds` (first send to last end), `load_summary` (`count`: every request, failed ones too;
  a stage's also `requested_rate` and, for a concurrent stage, `concurrency`), `successes` (`count`,
  `latency.<metric>` and `prompt_tokens` / `output_tokens` as {"mean", "median", "p90", ...} - the
  percentiles are the run's `report.request_lifecycle.percentiles`, so a reader takes those that are there -
  and `throughput.requests_per_sec` / `output_tokens_per_sec` / `total_tokens_per_sec`) and `failures`.
  `generate_reports` names them `summary_lifecycle_metrics`, `stage_<id>_lifecycle_metrics` and, with
  `per_request: true` (off by default), `per_request_lifecycle_metrics`: a list of
  `build_per_request_lifecycle_entry` dicts (`start_time`, `end_time`, `info.request_metrics.text.input_tokens`,
  `info.response_metrics.output_tokens` / `.server_usage.completion_tokens` / `.output_token_times`, `error`).
- every time is in seconds (time.perf_counter()); `compute_request_latency_metrics` defines the metrics:
  `request_latency` = end - start (E2E), `time_to_first_token` = first token time - start,
  `time_per_output_token` = (last - first token time) / (output tokens - 1) (TPOT, vLLM's), and
  `inter_token_latency` pools every gap between token times (ITL).
- inference_perf/client/filestorage/local.py: the files lie in one folder, each name behind the optional
  `storage.*.report_file_prefix`; `config.yaml` there is the run's config (`server.model_name`, `load.stages`).
- inference_perf/loadgen/load_generator.py runs the stages one after another, each ending (its requests done or
  cancelled) before the next starts: the per-request list, sorted by start, splits into the stages in order.
  A concurrent stage is sent as `num_requests` requests over one second (main.py) behind `concurrency_level`
  slots: its `requested_rate` is that, and the run is closed-loop at `concurrency`.

A summary with stage reports beside it is read as one run per stage (their rates differ; the summary pools them);
without them, as one run. Token counts prefer the server's usage (what the engine computed) to inference-perf's
client re-tokenization, as the tool's own `use_server_output_tokens` does. inference-perf writes no version.
"""

from __future__ import annotations

import glob
import re
from itertools import pairwise
from pathlib import Path

from kvplan import limits
from kvplan.measured.formats._fields import Fields, read_json, sibling
from kvplan.measured.record import MeasuredRequest, MeasuredRun
from kvplan.traces.specs import read_yaml

TOOL = "inference-perf"
_FORMAT = "inference-perf"
_EXPECTED = "expected as inference-perf writes its *_lifecycle_metrics.json reports"
_FIGURES = {"median": "50", "p90": "90", "p95": "95", "p99": "99", "mean": "mean"}
# record metric -> inference-perf's name under successes.latency
_LATENCY = {"ttft": "time_to_first_token", "tpot": "time_per_output_token", "itl": "inter_token_latency",
            "e2e": "request_latency"}
_THROUGHPUT = {"request_rps": "requests_per_sec", "output_tps": "output_tokens_per_sec",
               "total_tps": "total_tokens_per_sec"}
_NAME = re.compile(r"(?P<prefix>.*?)(?:stage_(?P<stage>\d+)|summary)_lifecycle_metrics\.json")


def detect(document: object) -> bool:
    """A lifecycle report: an object with `benchmark_time_seconds`, `load_summary`, `failures` and `successes`
    holding `latency` (the server-metrics summary inference-perf also writes has no `successes.latency`)."""
    return (isinstance(document, dict)
            and all(key in document for key in ("benchmark_time_seconds", "load_summary", "failures"))
            and isinstance(document.get("successes"), dict) and "latency" in document["successes"])


def read(document: object, source: str) -> list[MeasuredRun]:
    """One run per stage (a stage report: that stage; a summary: each stage report beside it, else the summary
    itself), with per-request records from the per-request report beside it when the run wrote one. A file not
    named as inference-perf names its reports is read alone: which files beside it are its run is unknown."""
    match = _NAME.fullmatch(Path(source).name)
    if match is None:
        return [_run("", source, document, None)]
    prefix, named_stage = match["prefix"], match["stage"]
    stages = _stage_reports(source, prefix)
    if named_stage is not None:
        stages[int(named_stage)] = (source, document)
    config_path = sibling(source, f"{prefix}config.yaml")
    config = None if config_path is None else read_yaml(config_path, f"{config_path} (inference-perf config)")
    config_fields = Fields(str(config_path), "inference-perf config", "expected as inference-perf writes config.yaml")
    model = config_fields.text(config, "server", "model_name", required=False)  # no config: None
    parts = [(f"stage {stage}", path, doc) for stage, (path, doc) in sorted(stages.items())]
    runs = [_run(label, path, doc, model) for label, path, doc in parts or [("", source, document)]]
    if not parts:
        _load_from_config(runs[0], config, config_fields)
    per_request = sibling(source, f"{prefix}per_request_lifecycle_metrics.json")
    if per_request is not None:
        for run, requests in zip(runs, _split(per_request, [run.num_requests or 0 for run in runs]), strict=True):
            run.requests, run.prompt_tokens, run.output_tokens = requests, None, None  # lengths are per request
    if named_stage is not None:  # the user named one stage: that run only
        runs = [run for run in runs if run.run_label == f"stage {named_stage}"]
    return runs


def _stage_reports(source: str, prefix: str) -> dict[int, tuple[str, object]]:
    """The stage reports of the run beside `source`, by stage id, parsed."""
    stages: dict[int, tuple[str, object]] = {}
    for path in Path(source).parent.glob(f"{glob.escape(prefix)}stage_*_lifecycle_metrics.json"):
        found = _NAME.fullmatch(path.name)
        if found and found["stage"] is not None and found["prefix"] == prefix and path.is_file():
            stages[int(found["stage"])] = (str(path), read_json(path, "inference-perf stage report"))
    return stages


def _run(label: str, source: str, document: object, model: str | None) -> MeasuredRun:
    fields = Fields(source, "inference-perf report", _EXPECTED)
    fields.mapping(document)
    run = MeasuredRun(
        source=source, format=_FORMAT, tool=f"{TOOL} (version not recorded)", run_label=label, model=model,
        rate_rps=fields.number(document, "load_summary", "requested_rate", required=False),
        max_concurrency=fields.count(document, "load_summary", "concurrency", required=False),
        duration_s=fields.number(document, "benchmark_time_seconds"),
        num_requests=fields.count(document, "load_summary", "count"),
    )
    fields.count(document, "successes", "count")
    for metric, name in _LATENCY.items():
        figures = fields.figures(document, ("successes", "latency", name), _FIGURES, 1.0, required=metric == "e2e")
        if figures:  # TTFT, TPOT and ITL need a streamed response
            run.percentiles[metric] = figures
    for ours, theirs in _THROUGHPUT.items():
        value = fields.number(document, "successes", "throughput", theirs, required=ours == "request_rps")
        if value is not None:
            run.throughput[ours] = value
    prompt = fields.number(document, "successes", "prompt_tokens", "mean", required=False)
    output = fields.number(document, "successes", "output_tokens", "mean", required=False)
    run.prompt_tokens = None if prompt is None else [round(prompt)]  # the means, until per-request records
    run.output_tokens = None if output is None else [round(output)]
    return run


def _load_from_config(run: MeasuredRun, config: object, fields: Fields) -> None:
    """A summary without stage reports: the rate and concurrency of the config's one stage (none when the run
    had several: the summary pools them, and no one rate describes it)."""
    stages = fields.items(config, "load", "stages", required=False)  # no config: None
    if stages is not None and len(stages) == 1:
        run.rate_rps = fields.number(config, "load", "stages", 0, "rate", required=False)
        run.max_concurrency = fields.count(config, "load", "stages", 0, "concurrency_level", required=False)


def _split(path: Path, counts: list[int]) -> list[list[MeasuredRequest]]:
    """The per-request report's requests in send order, cut into the runs' `counts` (the stages ran one after
    another); a report whose requests do not add up to them, or whose stages overlap, is another run's."""
    document = read_json(path, "inference-perf per-request report")
    fields = Fields(str(path), "inference-perf per-request report", _EXPECTED.replace("*_lifecycle_metrics",
                                                                                       "per_request_lifecycle_metrics"))
    entries = fields.items(document)
    assert entries is not None
    if len(entries) != sum(counts):
        raise fields.fail(f"{len(entries)} requests, but the reports beside it count {sum(counts)}; allowed: the "
                          "per-request report of the same run")
    timed = sorted((_request(fields, index, entries) for index in range(len(entries))), key=lambda item: item[0])
    runs: list[list[MeasuredRequest]] = []
    cut, previous_end = 0, -float("inf")
    for count in counts:
        part, cut = timed[cut:cut + count], cut + count
        if part and part[0][0] < previous_end:
            raise fields.fail(f"the requests of stage {len(runs) - 1} end after stage {len(runs)} starts; allowed: "
                              "stages run one after another, as inference-perf runs them")
        previous_end = max((end for _start, end, _request in part), default=previous_end)
        first = part[0][0] if part else 0.0
        for start, _end, request in part:
            request.start_s = start - first
        runs.append([request for _start, _end, request in part])
    return runs


def _request(fields: Fields, index: int, entries: list) -> tuple[float, float, MeasuredRequest]:
    """(start, end, request) of entry `index`, TTFT and gaps from its token times as the tool computes them."""
    start = fields.number(entries, index, "start_time", low=-float("inf"))
    end = fields.number(entries, index, "end_time", low=-float("inf"))
    assert start is not None and end is not None
    if end < start:
        raise fields.fail(f"[{index}].end_time {end} is before start_time {start}; allowed: end >= start")
    ok = fields.get(entries, index, "error", required=False) is None
    prompt = fields.count(entries, index, "info", "request_metrics", "text", "input_tokens", high=limits.MAX_TOKENS)
    output = fields.count(entries, index, "info", "response_metrics", "server_usage", "completion_tokens",
                          required=False, high=limits.MAX_TOKENS)
    if output is None:
        output = fields.count(entries, index, "info", "response_metrics", "output_tokens", required=ok,
                              high=limits.MAX_TOKENS)
    times = fields.items(entries, index, "info", "response_metrics", "output_token_times", required=False) or []
    stamps = [fields.number(entries, index, "info", "response_metrics", "output_token_times", at,
                            low=-float("inf")) or 0.0 for at in range(len(times))]
    streamed = ok and len(stamps) > 1  # the tool's rule: TTFT and gaps need more than one token time
    assert prompt is not None
    request = MeasuredRequest(
        prompt_tokens=prompt, output_tokens=output or 0, ttft_s=stamps[0] - start if streamed else None,
        e2e_s=end - start, itl_s=[b - a for a, b in pairwise(stamps)] if streamed else None, ok=ok)
    return start, end, request

