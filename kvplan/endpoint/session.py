"""One endpoint replay from the command line's options: prompts for the trace, the load generator, and the result
directory's files (the simulator's tables plus tokens.jsonl, failed.jsonl and endpoint.json)."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvplan.arg_types import POSITIVE, integer, number
from kvplan.endpoint.http_limits import (
    MAX_BODY_BYTES,
    MAX_LINE_BYTES,
    Scrapes,
    ServerFault,
    bad_count,
    fetch,
    is_count,
)
from kvplan.endpoint.servers import CALL_TIMEOUT_S, SERVER_KINDS, KvConfig, ServerInfo, probe
from kvplan.errors import UserError
from kvplan.traces import Trace
from kvplan.traces.schema import short_repr as short


@dataclass(slots=True)
class EndpointOptions:
    url: str
    model: str | None  # the `model` field sent (None: the server's only model)
    vocab_size: int | None
    tokenizer: str | None  # text prompts through this tokenizer
    max_concurrency: int | None
    duration_s: float | None
    timeout_s: float
    reset_prefix_cache: bool
    server: str = "auto"  # the adapter kind, or auto: detected (kvplan.endpoint.servers)
    drift_probe: bool = False  # probe the endpoint's speed before and after the replay (probe.json)
    scrapes: Scrapes = field(default_factory=Scrapes)  # the command's /metrics state (loadgen.Scrapes)


def add_endpoint_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint", default=None, help="replay against this OpenAI-compatible server "
                   "(e.g. http://127.0.0.1:8000) instead of the in-process engine")
    p.add_argument("--served-model", default=None, help="--endpoint: the `model` field to send (default: --model)")
    p.add_argument("--vocab-size", type=integer(2, 2**24), default=None,
                   help="--endpoint: token ids are drawn below this (default: the tokenizer's or --model's vocab)")
    p.add_argument("--tokenizer", default=None, help="--endpoint: send text prompts, written with this tokenizer "
                   "(a local HF directory or a built-in model name), instead of token ids")
    p.add_argument("--max-concurrency", type=integer(1, 100_000), default=None,
                   help="--endpoint: at most this many requests in flight (later ones wait; their TTFT counts it)")
    p.add_argument("--duration", type=POSITIVE, default=None,
                   help="replay only the requests arriving in the first S seconds of the trace (replay and "
                        "validate, in-process or --endpoint)")
    p.add_argument("--timeout", type=number(above=0, high=86400), default=600.0,
                   help="--endpoint: the deadline of each request (the replay's and the drift probe's), in "
                        "seconds, from connecting to the last byte of its streamed answer (keep-alive comments and "
                        "slow bytes count): a request past it fails (reason timeout) and the replay goes on. Every "
                        f"other call (/v1/models, /metrics, the server's info and cache-reset calls) has min(this, "
                        f"{CALL_TIMEOUT_S:g}) s, connect to last byte; one that misses it stops the command (a "
                        "/metrics scrape during the replay is excluded and counted instead). Sizes are bounded too: "
                        f"a body {MAX_BODY_BYTES >> 20} MiB, a streamed line {MAX_LINE_BYTES >> 20} MiB")
    p.add_argument("--reset-prefix-cache", action="store_true", help="--endpoint: POST /reset_prefix_cache before "
                   "each replay (vLLM with VLLM_SERVER_DEV_MODE=1, kvplan serve), so it starts cold like a "
                   "simulation; validate does this by default")
    p.add_argument("--server", choices=("auto", *SERVER_KINDS), default="auto",
                   help="--endpoint: the server's kind (its metric names, KV configuration, cache reset); default: "
                        "detected from what the endpoint answers (/props, /get_server_info, /info, /metrics)")


def endpoint_options(args: argparse.Namespace) -> EndpointOptions:
    url = args.endpoint
    allowed = "allowed: an http:// or https:// URL, e.g. http://127.0.0.1:8000"
    if not url.startswith(("http://", "https://")):
        raise UserError(f"--endpoint: {short(url)}; {allowed}")
    import httpx

    try:
        if not httpx.URL(url).host:
            raise httpx.InvalidURL("no host")
    except httpx.InvalidURL as exc:  # 'http://[::1' and the like: httpx refuses it at the first request
        raise UserError(f"--endpoint: {short(url)}: {str(exc).lower()}; {allowed}") from None
    return EndpointOptions(url, args.served_model or args.model, args.vocab_size, args.tokenizer,
                           args.max_concurrency, args.duration, args.timeout, args.reset_prefix_cache, args.server,
                           getattr(args, "drift_probe", False))


def within_duration(trace: Trace, duration_s: float | None) -> Trace:
    if duration_s is None:
        return trace
    arrivals = trace.arrival_s
    keep = arrivals - arrivals[0] <= duration_s
    return trace.take(np.flatnonzero(keep)) if not keep.all() else trace


def _tokenizer(name: str):
    from kvplan.engine.models import load_tokenizer

    tokenizer = load_tokenizer(name)
    if tokenizer is None:
        raise UserError(f"--tokenizer: {name} has no tokenizer files; allowed: a model directory with one")
    return tokenizer


def _vocab_size(options: EndpointOptions, tokenizer) -> int:
    """Where the prompt token ids are drawn below: --vocab-size, the tokenizer's, the model registry `serve`
    and `simulate` share, or what the server itself says of the model (kvplan serve's /v1/models)."""
    if options.vocab_size is not None:
        return options.vocab_size
    if tokenizer is not None:
        return len(tokenizer)
    from kvplan.sim.specs.models import get_model

    if options.model:
        try:
            return get_model(options.model).vocab_size
        except ValueError:
            pass
    served = served_vocab_size(options.url, options.model, options.timeout_s)
    if served is not None:
        return served
    raise UserError(f"--vocab-size: needed to draw prompt token ids ({options.model or 'the served model'} is not "
                     "a model kvplan knows, and the server's /v1/models does not state its vocab_size); or "
                     "--tokenizer for text prompts")


def check_reachable(url: str, timeout_s: float = CALL_TIMEOUT_S) -> None:
    """Before the replay: a server that is not there (refused, unresolvable, silent) is one line now, not a trace's
    worth of real time spent failing every request. Any HTTP answer counts as there (not every server has
    /v1/models); one that does not finish within min(timeout_s, CALL_TIMEOUT_S) is a ServerFault."""
    try:
        fetch("GET", f"{_base(url)}/v1/models", min(timeout_s, CALL_TIMEOUT_S))
    except ServerFault as fault:
        if fault.reason != "transport":
            raise
        raise UserError(f"--endpoint: {url}: no server answers ({str(fault).split(': ', 1)[-1]}); allowed: the "
                        "URL of a running OpenAI-compatible server") from None


def served_vocab_size(url: str, model: str | None, timeout_s: float = CALL_TIMEOUT_S) -> int | None:
    """The `vocab_size` the server's /v1/models states for `model` (or its only model), if it states one; a
    stated one that is not a vocabulary's size is the server's fault (a ServerFault), not a silent None."""
    reply = fetch("GET", f"{_base(url)}/v1/models", min(timeout_s, CALL_TIMEOUT_S))
    if reply.status != 200:
        return None
    try:
        doc = reply.json()
    except ServerFault:
        return None  # not an OpenAI model list: it states nothing
    entries = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        return None
    chosen = [e for e in entries if isinstance(e, dict) and (model is None or e.get("id") == model)]
    if len(chosen) != 1 or chosen[0].get("vocab_size") is None:
        return None
    value = chosen[0]["vocab_size"]
    if not is_count(value, 2, 2**24):
        raise bad_count(reply.what, "data[].vocab_size", value, 2, 2**24)
    return value


def _base(url: str) -> str:
    return url.rstrip("/").removesuffix("/v1")


def replay_endpoint(options: EndpointOptions, trace: Trace, *, seed: int, temperature: float, out: Path,
                    sample_interval_s: float, server: ServerInfo | None = None):
    """Replay `trace` against the endpoint; writes the tables and client files under `out`. Returns the
    ServingResult and the load result. `server`: what `servers.probe` found (probed here when None)."""
    from kvplan.endpoint.drift import endpoint_probe, write_probe_file
    from kvplan.endpoint.loadgen import LoadGenerator
    from kvplan.endpoint.prompts import endpoint_requests, text_writer
    from kvplan.endpoint.result import to_result, write_client_files
    from kvplan.output import json_text, write_atomic
    from kvplan.results.serving_result import write_tables

    check_reachable(options.url, options.timeout_s)
    server = server if server is not None else probe(options.url, options.server, options.timeout_s)
    tokenizer = _tokenizer(options.tokenizer) if options.tokenizer else None
    vocab = _vocab_size(options, tokenizer)
    requests = endpoint_requests(trace, vocab_size=vocab, seed=seed, tokenizer=tokenizer)
    generator = LoadGenerator(options.url, options.model, temperature=temperature, seed=seed,
                              max_concurrency=options.max_concurrency, timeout_s=options.timeout_s,
                              sample_interval_s=max(0.1, min(sample_interval_s, 5.0)),
                              reset_prefix_cache=options.reset_prefix_cache, adapter=server.adapter,
                              tokenizer=tokenizer, scrapes=options.scrapes)
    # the probe's prompts in the replay's form: text where the replay sends text
    to_text = text_writer(tokenizer) if tokenizer is not None and options.drift_probe else None

    def drift_probe():
        return endpoint_probe(options.url, options.model, server.adapter, vocab, to_text, options.timeout_s,
                              options.scrapes)

    probes = [drift_probe()] if options.drift_probe else []
    load = generator.run(requests)
    if options.drift_probe:
        probes.append(drift_probe())
        write_probe_file(out / "probe.json", probes)
    result = to_result(load, trace, server.kv)
    write_tables(result, out, "parquet")
    write_client_files(load, out)
    write_atomic(out / "endpoint.json", json_text({
        "url": options.url, "model": options.model, "prompts": "text" if tokenizer is not None else "token ids",
        "max_concurrency": options.max_concurrency, "prefix_cache_reset": load.prefix_cache_reset,
        "cache_config": load.cache_config, "server": server.to_json(),
        "approximate_gap_requests": result.info["approximate_gap_requests"],
        "server_counters": {k: (None if math.isnan(v) else v) for k, v in load.counters.items()},
        "wall_s": load.wall_s}))
    return result, load



def simulator_config(kv: KvConfig, options, model: str):
    """The simulator configured as the server runs: the KV facts the server publishes (`servers.KvConfig`: vLLM's
    cache_config_info, SGLang's /get_server_info, TGI's /info, llama.cpp's /props) override `options`; what it
    does not publish comes from `options`, and a KV capacity known from neither is an error (a guessed one would
    be silently wrong). llama.cpp's memory model: `max_num_seqs` = its slots, each a contiguous reservation of the
    per-slot context (the reservation allocator `max`), no prefix caching (kvplan sends cache_prompt false, and
    the reservation allocator caches nothing). Returns (options, meta) for `kvplan.live.sim_spec`."""
    from dataclasses import replace

    from kvplan.sim.specs.models import get_model

    changes: dict = {}
    if kv.block_size:
        changes["block_size"] = kv.block_size
    if kv.enable_prefix_caching is not None:
        changes["enable_prefix_caching"] = kv.enable_prefix_caching
    if kv.max_num_seqs:
        changes["max_num_seqs"] = kv.max_num_seqs
    options = replace(options, **changes)
    blocks = kv.num_blocks or options.num_blocks
    if blocks is None:
        raise UserError(f"--num-blocks: the server does not expose its KV capacity ({kv.source or 'nothing read'}); "
                         "allowed: give the server's number of KV blocks")
    try:
        spec_context = get_model(model).context_len
    except ValueError:
        spec_context = None  # a label (a profile's model name): the server or the option must say
    context = kv.max_model_len or options.max_model_len or spec_context
    if context is None:
        raise UserError("--max-model-len: the server does not expose its context length and the model spec has "
                         "none; allowed: give the server's max_model_len")
    return options, {"model_path": model, "num_blocks": blocks, "num_cpu_blocks": 0, "max_model_len": context,
                     "allocator": kv.allocator}


def check_fits(trace: Trace, meta: dict) -> None:
    """Before the first request: every request of the trace fits the server's context per request (a longer one
    would fail on the server, after the whole replay's real time)."""
    need = trace.prompt_tokens + trace.output_tokens
    over = np.flatnonzero(need > meta["max_model_len"])
    if len(over):
        row = int(over[0])
        raise UserError(f"--trace: {len(over)} request(s) need more context than the server gives one request "
                         f"({meta['max_model_len']} tokens), first {trace.reference(row)} ({int(need[row])} tokens: "
                         "prompt + output); allowed: a trace whose requests fit, or --duration to replay fewer")
