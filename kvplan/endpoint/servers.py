"""Server adapters: what each OpenAI-compatible server kvplan replays against publishes about itself, under which
names, and how its prefix cache is emptied. One mechanism with parameters: a `ServerAdapter` per server kind
(its info endpoint, metric names, KV-configuration reader, reset calls, per-request fields, and the facts it does
not expose); `probe` detects the kind from what the endpoint answers (or takes the one `--server` names) and
reads the KV configuration before any request is sent.

Names, from each server's own source or documentation:
* vLLM: `/metrics` `vllm:*` (vllm/v1/metrics/loggers.py), `vllm:cache_config_info` labels block_size,
  num_gpu_blocks, enable_prefix_caching; `POST /reset_prefix_cache` (with VLLM_SERVER_DEV_MODE=1). `kvplan
  serve` speaks the same.
* SGLang: `GET /get_server_info` (server args with page_size, context_length, disable_radix_cache,
  max_running_requests, plus the scheduler's max_total_num_tokens, possibly under internal_states[0]);
  `/metrics` `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`,
  `sglang:prompt_tokens_total`, `sglang:generation_tokens_total`, `sglang:cached_tokens_total`
  (docs/references/production_metrics.md, python/sglang/srt/metrics/collector.py); `POST /flush_cache`
  (docs basic_usage/native_api.md).
* TGI: `GET /info` (max_total_tokens, max_batch_total_tokens, max_concurrent_requests, model_id, version);
  `/metrics` `tgi_batch_current_size`, `tgi_queue_size`, `tgi_request_generated_tokens` and
  `tgi_request_input_length` histograms (huggingface.co/docs/text-generation-inference/reference/metrics). No
  cache-reset call.
* llama.cpp `llama-server` (vendored tools/server/server-context.cpp): `GET /props` total_slots and
  default_generation_settings.n_ctx (the context of one slot), `GET /slots` (with --slots), `/metrics`
  `llamacpp:*` (with --metrics), a `timings` object {cache_n, prompt_n, ...} on each final response, and the
  per-request `cache_prompt` field. `POST /slots/{id}?action=erase` exists but answers 501 unless the server runs
  with --slot-save-path, and it does not touch the host-memory prompt cache (--cache-ram, on by default), so
  kvplan sends `cache_prompt: false` instead: no request reuses another's KV, and every run is cold by
  construction (the simulator models the same: prefix caching off).

Distrust: a KV fact a server publishes is read exactly or not at all. Absent (or null, or vLLM's label "None")
is "not published" and the simulator needs the option; present, it must be what it means: a count an integer
>= 1 and at most its bound (a Prometheus label a string of digits, a JSON value a JSON integer: "16.5", 16.5,
true or "yes" are not a block size), a switch exactly a boolean ("True"/"False" in vLLM's labels). Anything else
refuses the run before the first request, one line naming the URL, the field, the value and what is allowed
(`KvFactError`, a ServerFault): a default in its place would simulate another server in silence. Every call
here has the deadline min(--timeout, CALL_TIMEOUT_S) and the bounds of kvplan.endpoint.http_limits; one that
misses them refuses the run too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from kvplan.endpoint import scrape
from kvplan.endpoint.frontend_fit import HISTOGRAM_KEYS
from kvplan.endpoint.http_limits import (
    ServerFault,
    bad_value,
    count_detail,
    fetch,
    is_count,
    server_error,
    value_detail,
)
from kvplan.limits import MAX_BLOCKS, MAX_TOKENS

SERVER_KINDS = ("vllm", "sglang", "tgi", "llamacpp")
CALL_TIMEOUT_S = 30.0  # a probe, scrape or reset: at most this, and at most --timeout
MAX_BLOCK_SIZE = 1 << 16  # tokens per KV block or page: far beyond any server's (vLLM's largest is 256)
MAX_SEQS = 1 << 20  # sequences a server runs at once
INTEGER = re.compile(r"[+-]?[0-9]{1,30}")  # a label that reads as an integer (checked for its range after)


@dataclass(slots=True)
class KvConfig:
    """The KV facts a server publishes; None where it publishes none (the simulator then needs the option).
    `allocator` is the simulator's allocator that matches the server's memory model: `paged` blocks, or `max`
    (llama.cpp: each slot a contiguous reservation of its whole context)."""

    block_size: int | None = None
    num_blocks: int | None = None
    max_model_len: int | None = None  # context per request (llama.cpp: per slot)
    max_num_seqs: int | None = None  # sequences run at once (llama.cpp: slots)
    enable_prefix_caching: bool | None = None
    allocator: str = "paged"
    source: str = ""  # where it was read

    def to_json(self) -> dict:
        return asdict(self)


class KvFactError(ValueError):
    """A published KV fact against its meaning (module doc); `probe` names the URL it came from."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(detail)
        self.what, self.detail = what, detail

    def fault(self, where: str) -> ServerFault:
        return server_error(where, self.what, self.detail)


def _count(doc: dict, key: str, high: int, *, label: bool = False, what: str | None = None) -> int | None:
    """doc[key] as a count in [1, high]; None when absent (or null, or the label "None"). `label`: the value is a
    Prometheus label (a string of digits), else a JSON integer."""
    value = doc.get(key)
    what = what or (f"vllm:cache_config_info label {key}" if label else key)
    if value is None or (label and value == "None"):
        return None
    number = int(value) if label and isinstance(value, str) and INTEGER.fullmatch(value) else value
    if not is_count(number, 1, high):
        raise KvFactError(what, count_detail(what, number, 1, high))  # a label's digits: the number they read as
    return number  # type: ignore[return-value]  # is_count: an int


def _switch(doc: dict, key: str, *, label: bool = False, what: str | None = None) -> bool | None:
    """doc[key] as a boolean (a label: "True" or "False"); None when absent."""
    value = doc.get(key)
    what = what or (f"vllm:cache_config_info label {key}" if label else key)
    if value is None or (label and value == "None"):
        return None
    if label and value in ("True", "False"):
        return value == "True"
    if not label and isinstance(value, bool):
        return value
    raise KvFactError(what, value_detail(what, value, "a boolean" + (' ("True" or "False")' if label else "")))


def _vllm_kv(info: dict, samples: list) -> KvConfig:
    labels = scrape.cache_config(samples)
    if not labels:
        return KvConfig()
    return KvConfig(block_size=_count(labels, "block_size", MAX_BLOCK_SIZE, label=True),
                    num_blocks=_count(labels, "num_gpu_blocks", MAX_BLOCKS, label=True),
                    max_model_len=_count(labels, "max_model_len", MAX_TOKENS, label=True),
                    enable_prefix_caching=_switch(labels, "enable_prefix_caching", label=True),
                    source="/metrics vllm:cache_config_info")


def _sglang_state(info: dict) -> dict:
    """`/get_server_info` with the scheduler's first internal state folded in (newer SGLang reports
    max_total_num_tokens there); the top level wins."""
    states = info.get("internal_states")
    inner = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    return {**inner, **info}


def _sglang_kv(info: dict, samples: list) -> KvConfig:
    state = _sglang_state(info)
    page = _count(state, "page_size", MAX_BLOCK_SIZE) or 1  # absent: SGLang's default page of one token
    tokens = _count(state, "max_total_num_tokens", MAX_BLOCKS * page)
    if tokens is not None and tokens < page:
        raise KvFactError("max_total_num_tokens", count_detail("max_total_num_tokens", tokens, page,
                                                               MAX_BLOCKS * page))
    radix = _switch(state, "disable_radix_cache")
    return KvConfig(block_size=page, num_blocks=tokens // page if tokens else None,
                    max_model_len=_count(state, "context_length", MAX_TOKENS),
                    max_num_seqs=_count(state, "max_running_requests", MAX_SEQS),
                    enable_prefix_caching=None if radix is None else not radix, source="/get_server_info")


def _tgi_kv(info: dict, samples: list) -> KvConfig:
    # TGI states its KV capacity in tokens (max_batch_total_tokens) but not its block size: the capacity is
    # expressed in blocks of 1 token, exact in tokens whatever block TGI pages with.
    tokens = _count(info, "max_batch_total_tokens", MAX_BLOCKS)
    return KvConfig(block_size=1 if tokens else None, num_blocks=tokens,
                    max_model_len=_count(info, "max_total_tokens", MAX_TOKENS),
                    max_num_seqs=_count(info, "max_concurrent_requests", MAX_SEQS), source="/info" if info else "")


def _llamacpp_kv(info: dict, samples: list) -> KvConfig:
    slots = _count(info, "total_slots", MAX_SEQS)
    settings = info.get("default_generation_settings")
    if settings is not None and not isinstance(settings, dict):
        raise KvFactError("default_generation_settings", value_detail("default_generation_settings", settings,
                                                                      "a JSON object"))
    n_ctx = _count(settings or {}, "n_ctx", MAX_TOKENS, what="default_generation_settings.n_ctx")
    if slots is None or n_ctx is None:
        return KvConfig()
    if slots * n_ctx > MAX_BLOCKS:
        raise KvFactError("total_slots", count_detail("total_slots x n_ctx", slots * n_ctx, 1, MAX_BLOCKS))
    # one token per block: a slot's reservation is exactly its context, whatever the trace's lengths
    return KvConfig(block_size=1, num_blocks=slots * n_ctx, max_model_len=n_ctx, max_num_seqs=slots,
                    enable_prefix_caching=False, allocator="max", source="/props")


@dataclass(frozen=True, slots=True)
class ServerAdapter:
    """How kvplan talks to one kind of server. Every field is data; the code that uses them is shared."""

    kind: str
    info_path: str | None  # GET, a JSON document describing the server (None: none)
    identifies: Callable[[dict], bool]  # whether an answer of info_path is this kind's
    metric_prefix: str
    counters: tuple[tuple[str, tuple[str, ...]], ...]  # summary key -> metric names (summed over labels)
    gauges: tuple[tuple[str, tuple[str, ...]], ...]  # series column -> gauge names
    read_kv: Callable[[dict, list], KvConfig]
    reset_paths: tuple[str, ...] = ()  # POSTed before a replay to empty the prefix cache ('' if none)
    request_fields: dict = field(default_factory=dict)  # added to every completion request
    cold_by_request: str | None = None  # why every run is cold without a reset (request_fields), else None
    token_ids: bool = False  # streams the ids of its tokens when asked (`return_token_ids`)
    not_exposed: tuple[str, ...] = ()


def _has(*keys: str) -> Callable[[dict], bool]:
    return lambda doc: all(k in doc for k in keys)


def _sglang_info(doc: dict) -> bool:
    return "max_total_num_tokens" in _sglang_state(doc)


ADAPTERS = {
    "vllm": ServerAdapter(
        "vllm", None, lambda doc: False, "vllm:",
        (("prefix_cache_queries", ("vllm:prefix_cache_queries_total",)),
         ("prefix_cache_hits", ("vllm:prefix_cache_hits_total",)),
         ("num_preemptions", ("vllm:num_preemptions_total",)),
         ("generation_tokens", ("vllm:generation_tokens_total",)),
         ("prompt_tokens", ("vllm:prompt_tokens_total",)),
         ("request_success", ("vllm:request_success_total",)), *HISTOGRAM_KEYS.items()),
        (("running", ("vllm:num_requests_running",)), ("waiting", ("vllm:num_requests_waiting",)),
         ("swapped", ("vllm:num_requests_swapped",)),
         ("kv_usage", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"))),
        _vllm_kv, reset_paths=("/reset_prefix_cache",), token_ids=True,
        not_exposed=("evicted blocks", "memory breakdown", "per-request preemptions", "queueing inside the server")),
    "sglang": ServerAdapter(
        "sglang", "/get_server_info", _sglang_info, "sglang:",
        (("prefix_cache_hits", ("sglang:cached_tokens_total",)),
         ("num_preemptions", ("sglang:num_retracted_requests_total",)),
         ("generation_tokens", ("sglang:generation_tokens_total",)),
         ("prompt_tokens", ("sglang:prompt_tokens_total",)),
         ("request_success", ("sglang:num_requests_total",))),
        (("running", ("sglang:num_running_reqs",)), ("waiting", ("sglang:num_queue_reqs",)),
         ("kv_usage", ("sglang:token_usage",))),
        _sglang_kv, reset_paths=("/flush_cache",),
        not_exposed=("prefix-cache lookups", "evicted blocks", "memory breakdown", "swapped requests",
                     "token ids in the stream", "queueing inside the server")),
    "tgi": ServerAdapter(
        "tgi", "/info", _has("max_batch_total_tokens", "max_total_tokens"), "tgi_",
        (("generation_tokens", ("tgi_request_generated_tokens_sum",)),
         ("prompt_tokens", ("tgi_request_input_length_sum",)),
         ("request_success", ("tgi_request_success",))),
        (("running", ("tgi_batch_current_size",)), ("waiting", ("tgi_queue_size",))),
        _tgi_kv,
        not_exposed=("a cache-reset call (repeats after the first run warm)", "block size", "prefix-cache lookups "
                     "and hits", "preemptions", "KV usage", "evicted blocks", "memory breakdown",
                     "token ids in the stream", "queueing inside the server")),
    "llamacpp": ServerAdapter(
        "llamacpp", "/props", _has("total_slots", "default_generation_settings"), "llamacpp:",
        (("prefix_cache_hits", ("llamacpp:prompt_tokens_cached_total",)),
         ("generation_tokens", ("llamacpp:tokens_predicted_total",)),
         ("prompt_tokens", ("llamacpp:prompt_tokens_total",))),
        (("running", ("llamacpp:requests_processing",)), ("waiting", ("llamacpp:requests_deferred",))),
        _llamacpp_kv, request_fields={"cache_prompt": False},
        cold_by_request="cache_prompt false on every request: no request reuses cached KV",
        not_exposed=("KV usage", "prefix-cache lookups", "preemptions", "evicted blocks", "memory breakdown",
                     "prompt tokens per step (n_batch)", "token ids in the OpenAI stream",
                     "queueing inside the server")),
}


@dataclass(slots=True)
class ServerInfo:
    """What `probe` found: the adapter used, how it was chosen, the KV configuration read."""

    adapter: ServerAdapter
    detected: str  # "detected from /props", "--server llamacpp", ...
    kv: KvConfig
    info: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        a = self.adapter
        return {"kind": a.kind, "chosen": self.detected, "kv_config": self.kv.to_json(),
                "reset": list(a.reset_paths) or None, "cold_by_request": a.cold_by_request,
                "request_fields": a.request_fields, "token_ids": a.token_ids, "not_exposed": list(a.not_exposed)}

    def sentence(self) -> str:
        kv = {k: v for k, v in self.kv.to_json().items() if v is not None and k != "source"}
        read = ", ".join(f"{k}={v}" for k, v in kv.items()) if self.kv.source else "nothing"
        return (f"server: {self.adapter.kind} ({self.detected}); KV configuration read from "
                f"{self.kv.source or 'nowhere'}: {read}; not exposed: {', '.join(self.adapter.not_exposed)}")


def _get_json(url: str, seconds: float, *, required: bool) -> dict | None:
    """The JSON object at `url`; None when it answers another status, or (`required` False: while detecting
    the kind) something that is not a JSON object. `required`: the adapter was named, so its info document must
    be one (else a ServerFault)."""
    reply = fetch("GET", url, seconds)
    if reply.status != 200:
        return None
    try:
        doc = reply.json()
    except ServerFault:
        if required:
            raise
        return None
    if not isinstance(doc, dict):
        if required:
            raise bad_value(reply.what, "body", doc, "a JSON object")
        return None
    return doc


def metrics(base: str, seconds: float) -> list:
    """The /metrics samples; [] when the server answers another status (it has none)."""
    reply = fetch("GET", f"{base}/metrics", seconds)
    return scrape.parse(reply.text()) if reply.status == 200 else []


def probe(url: str, server: str = "auto", timeout_s: float = CALL_TIMEOUT_S) -> ServerInfo:
    """The server's kind (from its info endpoints, else its metric names; vLLM's when nothing tells) and its KV
    configuration. Only GETs: nothing is sent that the server would count as a request. Each GET has
    min(timeout_s, CALL_TIMEOUT_S); a miss, or a KV fact against its meaning, is a ServerFault."""
    base = url.rstrip("/").removesuffix("/v1")
    seconds = min(timeout_s, CALL_TIMEOUT_S)
    samples = metrics(base, seconds)
    found = _detect(base, server, seconds, samples)
    try:
        found.kv = found.adapter.read_kv(found.info, samples)
    except KvFactError as exc:
        path = found.adapter.info_path if found.info else "/metrics"
        raise exc.fault(f"GET {base}{path}") from None
    return found


def _detect(base: str, server: str, seconds: float, samples: list) -> ServerInfo:
    if server != "auto":
        adapter = ADAPTERS[server]
        info = (_get_json(base + adapter.info_path, seconds, required=True) or {}) if adapter.info_path else {}
        return ServerInfo(adapter, f"--server {server}", KvConfig(), info)
    for adapter in ADAPTERS.values():
        if adapter.info_path is None:
            continue
        info = _get_json(base + adapter.info_path, seconds, required=False)
        if info is not None and adapter.identifies(info):
            return ServerInfo(adapter, f"detected from {adapter.info_path}", KvConfig(), info)
    for adapter in ADAPTERS.values():
        if any(name.startswith(adapter.metric_prefix) for name, _, _ in samples):
            return ServerInfo(adapter, f"detected from /metrics ({adapter.metric_prefix}*)", KvConfig())
    return ServerInfo(ADAPTERS["vllm"], "nothing identifies it: treated as vLLM-compatible", KvConfig())


def counters(adapter: ServerAdapter, samples: list) -> dict[str, float]:
    """Every summary counter key, NaN where this server has no such counter."""
    return scrape.read(samples, scrape.COUNTER_KEYS, dict(adapter.counters))


def gauges(adapter: ServerAdapter, samples: list, where: str) -> tuple[dict[str, float], list[ServerFault]]:
    """Every series gauge column, NaN where this server has no such gauge or sent a bad value (each bad value a
    fault: scrape.read_gauges); `where`: the scrape, "GET http://host/metrics"."""
    return scrape.read_gauges(samples, dict(adapter.gauges), where)

