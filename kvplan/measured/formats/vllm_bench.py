"""`vllm bench serve --save-result` (vLLM 0.34; the keys are those of `vllm/benchmarks/serve.py`): one run per file,
or one per line with `--append-result`.

Where each number comes from (the `*_ms` keys are milliseconds, every other time seconds):
- the load: `num_prompts` requests; `request_rate` (a number, or "inf": all sent at once), `burstiness` (vLLM
  draws gamma gaps of shape b: CV 1/sqrt(b)), `max_concurrency` (null: unbounded); `model_id` the served name.
- `percentiles`: `mean_<m>_ms`, `median_<m>_ms` (50) and `p<q>_<m>_ms` for m in ttft, tpot, itl, e2el (vLLM's
  E2E), present for the metrics of `--percentile-metrics` (default ttft, tpot, itl) at `--metric-percentiles`
  (default 99). vLLM's TPOT of a request is (latency - ttft) / (output - 1), averaged over requests with more
  than one output token; ITL pools every gap of every request. All over successful requests only.
- `throughput`: `request_throughput` (completed / duration), `output_throughput`, `total_token_throughput`.
- per request, with `--save-detailed` only: `input_lens`, `output_lens` (0 for a failed request), `ttfts`,
  `latencies`, `itls` (lists of gaps), `start_times` (the client's `time.perf_counter()` at the send, after any
  concurrency wait: the run's clock starts at the first) and `errors` ("" for success).
- without `--save-detailed` the file keeps `latencies` (every request's E2E, 0 for a failed one) but no lengths:
  the workload is `num_prompts` requests of the mean lengths of `total_input_tokens` / `total_output_tokens` over
  `completed` (exact for `--dataset-name random` with the default range ratio 0), said in `notes`; the E2E
  distribution, when the file has no `*_e2el_ms`, is taken from `latencies` if no request failed.
The file records nothing of the server (no vLLM version, block size or GPU): those come from flags or are guessed.
"""

from __future__ import annotations

import math
import re

from kvplan.errors import UserError
from kvplan.measured.record import MeasuredRequest, MeasuredRun
from kvplan.strict_json import short, whole

TOOL = "vllm bench serve"
_ALLOWED = "allowed: a file as `vllm bench serve --save-result` writes it"
# vLLM's metric names in the keys -> record.METRICS
_METRICS = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"}
_POINT = re.compile(r"^(mean|median|p(\d+(?:\.\d+)?))_(ttft|tpot|itl|e2el)_ms$")
_THROUGHPUT = {"request_rps": "request_throughput", "output_tps": "output_throughput",
               "total_tps": "total_token_throughput"}
# Keys every --save-result file has (serve.py writes them unconditionally): their absence means another tool's file
# or a damaged one, and the reader names the first one missing.
_REQUIRED = ("model_id", "num_prompts", "request_rate", "max_concurrency", "duration", "completed",
             "total_input_tokens", "total_output_tokens", "request_throughput", "output_throughput")
_DETAILED = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors")


def detect(document: object) -> bool:
    """A `vllm bench serve` result: an object with its `backend` (or older `endpoint_type`), `model_id`,
    `num_prompts` and `request_throughput`, or a list of such objects (JSON lines of --append-result)."""
    items = document if isinstance(document, list) else [document]
    return bool(items) and all(isinstance(d, dict) and ("backend" in d or "endpoint_type" in d)
                               and all(k in d for k in ("model_id", "num_prompts", "request_throughput"))
                               for d in items)


def read(document: object, source: str) -> list[MeasuredRun]:
    items = document if isinstance(document, list) else [document]
    runs = []
    for i, item in enumerate(items):
        where = source if len(items) == 1 else f"{source}: run {i + 1} (line {i + 1})"
        if not isinstance(item, dict):
            raise UserError(f"{where}: not a JSON object; {_ALLOWED}")
        runs.append(_run(item, where, source, "" if len(items) == 1 else f"run {i + 1}"))
    return runs


def _field(doc: dict, key: str, where: str) -> object:
    if key not in doc:
        raise UserError(f"{where}: no field `{key}` (every --save-result file has it); {_ALLOWED}")
    return doc[key]


def _number(doc: dict, key: str, where: str, *, low: float = 0.0) -> float:
    value = _field(doc, key, where)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < low:
        raise UserError(f"{where}: `{key}` is {short(value)}; allowed: a finite number >= {low:g}")
    return float(value)


def _count(doc: dict, key: str, where: str, low: int = 0) -> int:
    return whole(_field(doc, key, where), f"{where}: `{key}`", low=low)


def _run(doc: dict, where: str, source: str, label: str) -> MeasuredRun:
    for key in _REQUIRED:
        _field(doc, key, where)
    model = doc["model_id"]
    if not isinstance(model, str) or not model:
        raise UserError(f"{where}: `model_id` is {short(model)}; allowed: the served model's name")
    rate_value = doc["request_rate"]
    rate = math.inf if rate_value == "inf" else _number(doc, "request_rate", where)
    if rate <= 0:
        raise UserError(f"{where}: `request_rate` is {short(rate_value)}; allowed: a number > 0 or \"inf\"")
    concurrency = None if doc["max_concurrency"] is None else _count(doc, "max_concurrency", where, 1)
    burstiness = _number(doc, "burstiness", where) if "burstiness" in doc else 1.0
    if burstiness <= 0:
        raise UserError(f"{where}: `burstiness` is {short(burstiness)}; allowed: a number > 0 (vLLM's gamma shape)")
    completed, num_prompts = _count(doc, "completed", where), _count(doc, "num_prompts", where, 1)
    run = MeasuredRun(source=source, format="vllm-bench", tool=TOOL, run_label=str(doc.get("label") or label),
                      model=model, rate_rps=rate, max_concurrency=concurrency,
                      duration_s=_number(doc, "duration", where), num_requests=num_prompts,
                      arrival_cv=None if burstiness == 1.0 else 1 / math.sqrt(burstiness),
                      throughput={ours: _number(doc, theirs, where) for ours, theirs in _THROUGHPUT.items()
                                  if theirs in doc})
    for key in doc:
        match = _POINT.match(key)
        if match:
            point = "mean" if match[1] == "mean" else "50" if match[1] == "median" else match[2]
            run.percentiles.setdefault(_METRICS[match[3]], {})[point] = _number(doc, key, where) / 1e3
    if "ramp_up_strategy" in doc and "start_times" not in doc:
        raise UserError(f"{where}: a ramp-up run (`ramp_up_strategy`) without per-request send times; allowed: a "
                        "file written with --save-detailed (its `start_times` give the ramp)")
    if "input_lens" in doc:
        run.requests = _requests(doc, where)
    else:
        _means(doc, run, where, completed, num_prompts)
    return run


def _requests(doc: dict, where: str) -> list[MeasuredRequest]:
    """Every request of a --save-detailed file, in the file's order, `start_s` from the first send."""
    lists: dict[str, list] = {}
    first_list = _field(doc, "input_lens", where)
    size = len(first_list) if isinstance(first_list, list) else -1
    for key in _DETAILED:
        value = _field(doc, key, where)
        if not isinstance(value, list) or len(value) != size:
            raise UserError(f"{where}: `{key}` is not a list of {max(size, 0)} entries (one per request, as "
                            f"`input_lens`); {_ALLOWED} --save-detailed")
        lists[key] = value
    if size == 0:
        raise UserError(f"{where}: `input_lens` is empty; allowed: a run with at least one request")
    starts = [_seconds(v, f"{where}: `start_times[{i}]`") for i, v in enumerate(lists["start_times"])]
    first = min(starts)
    out = []
    for i in range(size):
        error = lists["errors"][i]
        ok = error in ("", None)
        gaps = lists["itls"][i]
        if not isinstance(gaps, list):
            raise UserError(f"{where}: `itls[{i}]` is {short(gaps)}; allowed: a list of gaps in seconds")
        out.append(MeasuredRequest(
            prompt_tokens=whole(lists["input_lens"][i], f"{where}: `input_lens[{i}]`", low=0),
            output_tokens=whole(lists["output_lens"][i], f"{where}: `output_lens[{i}]`", low=0),
            start_s=starts[i] - first,
            ttft_s=_seconds(lists["ttfts"][i], f"{where}: `ttfts[{i}]`") if ok else None,
            e2e_s=_seconds(lists["latencies"][i], f"{where}: `latencies[{i}]`") if ok else None,
            itl_s=[_seconds(g, f"{where}: `itls[{i}][{j}]`") for j, g in enumerate(gaps)] if ok else None,
            ok=ok))
    return out


def _seconds(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise UserError(f"{what} is {short(value)}; allowed: a finite number of seconds >= 0")
    return float(value)


def _means(doc: dict, run: MeasuredRun, where: str, completed: int, num_prompts: int) -> None:
    """An aggregate-only file: `num_prompts` requests of the mean lengths; the E2E distribution from `latencies`."""
    if completed == 0:
        raise UserError(f"{where}: `completed` is 0: no request succeeded, so the file holds no lengths; allowed: "
                        "a run with completed requests, or one written with --save-detailed")
    lengths = []
    for key in ("total_input_tokens", "total_output_tokens"):
        mean = _count(doc, key, where) / completed
        lengths.append(max(1, round(mean)))
        if mean != round(mean):
            run.notes.append(f"`{key}` / `completed` = {mean:.2f}: simulated as {lengths[-1]} per request")
    run.prompt_tokens, run.output_tokens = [lengths[0]], [lengths[1]]
    run.notes.append(f"no per-request lengths (written without --save-detailed): {num_prompts} requests of the "
                     f"mean lengths, {lengths[0]} prompt and {lengths[1]} output tokens")
    latencies = doc.get("latencies")
    failed = doc.get("failed", 0)
    if "e2e" not in run.percentiles and isinstance(latencies, list) and latencies and failed == 0:
        from kvplan.measured.compare import distribution

        values = [_seconds(v, f"{where}: `latencies[{i}]`") for i, v in enumerate(latencies)]
        points = sorted({"mean", "50", *(p for m in run.percentiles.values() for p in m)}, key=_order)
        run.percentiles["e2e"] = distribution(values, points)
        run.notes.append("E2E percentiles computed from the file's `latencies` (one per request)")


def _order(point: str) -> float:
    return -1.0 if point == "mean" else float(point)
