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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from kvplan.endpoint import scrape
from kvplan.endpoint.frontend_fit import HISTOGRAM_KEYS
from kvplan.strict_json import loads

SERVER_KINDS = ("vllm", "sglang", "tgi", "llamacpp")
PROBE_TIMEOUT_S = 10.0


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


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, float) and value.is_integer() and value > 0:
        return int(value)
    if isinstance(value, str) and value.isdigit() and int(value) > 0:
        return int(value)
    return None


def _vllm_kv(info: dict, samples: list) -> KvConfig:
    labels = scrape.cache_config(samples)
    if not labels:
        return KvConfig()
    caching = labels.get("enable_prefix_caching")
    return KvConfig(block_size=_int(labels.get("block_size")), num_blocks=_int(labels.get("num_gpu_blocks")),
                    max_model_len=_int(labels.get("max_model_len")),
                    enable_prefix_caching=None if caching not in ("True", "False") else caching == "True",
                    source="/metrics vllm:cache_config_info")


def _sglang_state(info: dict) -> dict:
    """`/get_server_info` with the scheduler's first internal state folded in (newer SGLang reports
    max_total_num_tokens there); the top level wins."""
    states = info.get("internal_states")
    inner = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    return {**inner, **info}


def _sglang_kv(info: dict, samples: list) -> KvConfig:
    get = _sglang_state(info).get

    page = _int(get("page_size")) or 1
    tokens = _int(get("max_total_num_tokens"))
    radix = get("disable_radix_cache")
    return KvConfig(block_size=page, num_blocks=tokens // page if tokens else None,
                    max_model_len=_int(get("context_length")), max_num_seqs=_int(get("max_running_requests")),
                    enable_prefix_caching=None if not isinstance(radix, bool) else not radix,
                    source="/get_server_info")


def _tgi_kv(info: dict, samples: list) -> KvConfig:
    # TGI states its KV capacity in tokens (max_batch_total_tokens) but not its block size: the capacity is
    # expressed in blocks of 1 token, exact in tokens whatever block TGI pages with.
    tokens = _int(info.get("max_batch_total_tokens"))
    return KvConfig(block_size=1 if tokens else None, num_blocks=tokens,
                    max_model_len=_int(info.get("max_total_tokens")),
                    max_num_seqs=_int(info.get("max_concurrent_requests")), source="/info" if info else "")


def _llamacpp_kv(info: dict, samples: list) -> KvConfig:
    slots = _int(info.get("total_slots"))
    settings = info.get("default_generation_settings")
    n_ctx = _int(settings.get("n_ctx")) if isinstance(settings, dict) else None
    if slots is None or n_ctx is None:
        return KvConfig()
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


def _get_json(client, url: str) -> dict | None:
    import httpx

    try:
        response = client.get(url, timeout=PROBE_TIMEOUT_S)
        doc = loads(response.text) if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def metrics(client, base: str) -> list:
    import httpx

    try:
        response = client.get(f"{base}/metrics", timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError:
        return []
    return scrape.parse(response.text) if response.status_code == 200 else []


def probe(url: str, server: str = "auto") -> ServerInfo:
    """The server's kind (from its info endpoints, else its metric names; vLLM's when nothing tells) and its KV
    configuration. Only GETs: nothing is sent that the server would count as a request."""
    import httpx

    base = url.rstrip("/").removesuffix("/v1")
    with httpx.Client() as client:
        samples = metrics(client, base)
        if server != "auto":
            adapter = ADAPTERS[server]
            info = (_get_json(client, base + adapter.info_path) or {}) if adapter.info_path else {}
            return ServerInfo(adapter, f"--server {server}", adapter.read_kv(info, samples), info)
        for adapter in ADAPTERS.values():
            if adapter.info_path is None:
                continue
            info = _get_json(client, base + adapter.info_path)
            if info is not None and adapter.identifies(info):
                return ServerInfo(adapter, f"detected from {adapter.info_path}", adapter.read_kv(info, samples), info)
    for adapter in ADAPTERS.values():
        if any(name.startswith(adapter.metric_prefix) for name, _, _ in samples):
            return ServerInfo(adapter, f"detected from /metrics ({adapter.metric_prefix}*)",
                              adapter.read_kv({}, samples))
    adapter = ADAPTERS["vllm"]
    return ServerInfo(adapter, "nothing identifies it: treated as vLLM-compatible", adapter.read_kv({}, samples))


def counters(adapter: ServerAdapter, samples: list) -> dict[str, float]:
    """Every summary counter key, NaN where this server has no such counter."""
    return scrape.read(samples, scrape.COUNTER_KEYS, dict(adapter.counters))


def gauges(adapter: ServerAdapter, samples: list) -> dict[str, float]:
    """Every series gauge column, NaN where this server has no such gauge."""
    return scrape.read(samples, scrape.GAUGE_KEYS, dict(adapter.gauges))

