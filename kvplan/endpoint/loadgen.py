"""The async load generator of `kvplan replay --endpoint`: each trace request is sent at its arrival time to an
OpenAI-compatible `/v1/completions`, streamed, and every token's arrival is stamped. What the server is (its
metric names, reset call, extra request fields) comes from its `ServerAdapter` (kvplan.endpoint.servers).

Clocks: everything is on the trace's clock (the first arrival = the trace's first arrival_s). TTFT and E2E count
from the request's trace arrival, so a request held back by `--max-concurrency` includes that wait, as a user's
request would. A token is stamped when the chunk that carries it is read; a chunk that carries k tokens stamps k
tokens at once: k from the chunk's `token_ids` (vLLM's `return_token_ids`), else from re-tokenizing the chunk's text
with the tokenizer given, else one per non-empty chunk. Without ids the count is checked against the usage's
completion_tokens: when they differ, some chunks carried several tokens (or tokens with no text of their own), the
missing ones are stamped at the finish, and the request's per-token gaps are marked approximate (excluded from the
ITL distribution; TTFT, TPOT and E2E use only its first and last token times, which stay exact). A request that
fails (connection error, HTTP error, an error event, a short answer) is kept with its error and whatever it
received.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from kvplan.endpoint import scrape, servers
from kvplan.endpoint.prompts import EndpointRequest
from kvplan.endpoint.servers import ADAPTERS, ServerAdapter
from kvplan.errors import UserError
from kvplan.strict_json import loads, short, whole

PROGRESS_EVERY_S = 5.0


@dataclass(slots=True)
class Outcome:
    """What the client saw of one request."""

    row: int
    arrival_s: float
    sent_s: float = math.nan
    finish_s: float = math.nan
    token_times: dict[int, list[float]] = field(default_factory=dict)  # choice index -> each token's time
    token_ids: dict[int, list[int]] = field(default_factory=dict)  # when the server returns them
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    gaps_approximate: bool = False  # token counts per chunk were guessed and did not add up (see module doc)
    server_timings: dict | None = None  # llama.cpp's per-response `timings`


@dataclass(slots=True)
class LoadResult:
    outcomes: list[Outcome]  # in trace order
    series: list[dict]  # sampled gauges: time_s, running, waiting, swapped, kv_usage
    counters: dict[str, float]  # vLLM counters over the replay (NaN: not exposed)
    cache_config: dict[str, str]  # vllm:cache_config_info labels, {} when not exposed
    wall_s: float
    prefix_cache_reset: str | None = None  # what the reset call did before the replay (None: not asked)
    server: str = "vllm"  # the adapter's kind


class LoadGenerator:
    def __init__(self, url: str, model: str | None, *, temperature: float = 1.0, seed: int = 0,
                 max_concurrency: int | None = None, timeout_s: float = 600.0, sample_interval_s: float = 1.0,
                 reset_prefix_cache: bool = False, progress: Callable[[str], None] | None = None,
                 adapter: ServerAdapter | None = None, tokenizer=None) -> None:
        self.base = url.rstrip("/").removesuffix("/v1")
        self.adapter = adapter if adapter is not None else ADAPTERS["vllm"]
        self.tokenizer = tokenizer  # counts a text chunk's tokens where the server sends no ids
        self.model, self.temperature, self.seed = model, temperature, seed
        self.max_concurrency, self.timeout_s = max_concurrency, timeout_s
        self.sample_interval_s = sample_interval_s
        self.reset_prefix_cache = reset_prefix_cache
        self.progress = progress if progress is not None else (lambda line: print(line, file=sys.stderr))

    def run(self, requests: list[EndpointRequest]) -> LoadResult:
        return asyncio.run(self._run(requests))

    async def _run(self, requests: list[EndpointRequest]) -> LoadResult:
        limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
        timeout = httpx.Timeout(self.timeout_s, connect=min(30.0, self.timeout_s))
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            reset = await self._reset(client) if self.reset_prefix_cache else None
            before = await self._scrape(client)
            t0 = requests[0].arrival_s if requests else 0.0
            origin = time.perf_counter() - t0
            outcomes = [Outcome(r.row, r.arrival_s) for r in requests]
            series: list[dict] = []
            gate = asyncio.Semaphore(self.max_concurrency) if self.max_concurrency else None
            monitor = asyncio.create_task(self._monitor(client, origin, series, outcomes))
            tasks = []
            for request, outcome in zip(requests, outcomes, strict=True):
                delay = request.arrival_s - (time.perf_counter() - origin)
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(self._send(client, request, outcome, origin, gate)))
            await asyncio.gather(*tasks)
            monitor.cancel()
            after = await self._scrape(client)
            wall = time.perf_counter() - origin - t0
        start, end = servers.counters(self.adapter, before), servers.counters(self.adapter, after)
        counters, broken = scrape.difference(start, end), scrape.broken(start, end)
        if broken:
            self.progress(f"  warning: server counters went backwards or are not counts (a restart mid-replay?), "
                          f"reported as unknown: {', '.join(broken)}")
        return LoadResult(outcomes, series, counters, scrape.cache_config(after or before), wall, reset,
                          self.adapter.kind)

    async def _reset(self, client: httpx.AsyncClient) -> str:
        """The adapter's reset calls (vLLM's POST /reset_prefix_cache, SGLang's /flush_cache): "reset" when every
        one answered 200, else what happened."""
        if not self.adapter.reset_paths:
            return f"not supported: {self.adapter.kind} has no cache-reset call"
        for path in self.adapter.reset_paths:
            try:
                response = await client.post(f"{self.base}{path}", timeout=30.0)
            except httpx.HTTPError as exc:
                return f"failed: POST {path}: {type(exc).__name__}"
            if response.status_code != 200:
                return (f"not supported (POST {path}: HTTP {response.status_code}): the replay starts from the "
                        "server's warm cache")
        return "reset"

    async def _scrape(self, client: httpx.AsyncClient) -> list:
        try:
            response = await client.get(f"{self.base}/metrics", timeout=10.0)
        except httpx.HTTPError:
            return []
        return scrape.parse(response.text) if response.status_code == 200 else []

    async def _monitor(self, client: httpx.AsyncClient, origin: float, series: list, outcomes: list) -> None:
        last_progress = time.perf_counter()
        while True:
            now = time.perf_counter()
            samples = await self._scrape(client)
            if samples:
                series.append({"time_s": now - origin, **servers.gauges(self.adapter, samples)})
            if now - last_progress >= PROGRESS_EVERY_S:
                last_progress = now
                sent = sum(not math.isnan(o.sent_s) for o in outcomes)
                done = sum(not math.isnan(o.finish_s) or o.error is not None for o in outcomes)
                failed = sum(o.error is not None for o in outcomes)
                self.progress(f"  t={now - origin:.0f}s: sent {sent}/{len(outcomes)}, finished {done}, failed "
                              f"{failed}, in flight {sent - done}")
            await asyncio.sleep(self.sample_interval_s)

    def body(self, request: EndpointRequest) -> dict:
        body = {"prompt": request.prompt, "max_tokens": request.max_tokens, "n": request.n,
                "temperature": self.temperature, "seed": self.seed * 1_000_003 + request.row, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True,
                **self.adapter.request_fields}
        return body if self.model is None else {"model": self.model, **body}

    async def _send(self, client: httpx.AsyncClient, request: EndpointRequest, outcome: Outcome, origin: float,
                    gate: asyncio.Semaphore | None) -> None:
        if gate is not None:
            await gate.acquire()
        try:
            outcome.sent_s = time.perf_counter() - origin
            await self._stream(client, request, outcome, origin)
        except httpx.HTTPError as exc:
            outcome.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        except (KeyError, TypeError, ValueError) as exc:  # MalformedEvent, strict JSON, counts
            outcome.error = f"malformed stream: {exc}"
        finally:
            if gate is not None:
                gate.release()
        if outcome.error is None:
            got = sum(len(t) for t in outcome.token_times.values())
            if got != request.max_tokens * request.n:
                outcome.error = f"short answer: {got} of {request.max_tokens * request.n} tokens (ignore_eos honoured?)"

    async def _stream(self, client: httpx.AsyncClient, request: EndpointRequest, outcome: Outcome,
                      origin: float) -> None:
        async with client.stream("POST", f"{self.base}/v1/completions", json=self.body(request)) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                outcome.error = f"HTTP {response.status_code}: {_message(text)}"
                return
            completion = 0
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter() - origin
                event = _mapping(loads(data), "event")
                if "error" in event:
                    outcome.error = f"error event: {_message(data)}"
                    return
                choices = event.get("choices") or []
                if not isinstance(choices, list):
                    raise MalformedEvent(f"choices is {short(choices)}; allowed: a list of objects")
                for choice in choices:
                    self._tokens(outcome, _mapping(choice, "choices[]"), now)
                usage = _mapping(event.get("usage") or {}, "usage")
                if usage:
                    outcome.prompt_tokens = _count(usage.get("prompt_tokens"), "usage.prompt_tokens")
                    details = _mapping(usage.get("prompt_tokens_details") or {}, "usage.prompt_tokens_details")
                    outcome.cached_tokens = _count(details.get("cached_tokens"), "usage.cached_tokens")
                    completion = _count(usage.get("completion_tokens"), "usage.completion_tokens")
                timings = event.get("timings")
                if isinstance(timings, dict):  # llama.cpp: cache_n = prompt tokens its slot cache served
                    outcome.server_timings = timings
                    if not (usage and "prompt_tokens_details" in usage):
                        outcome.cached_tokens = _count(timings.get("cache_n"), "timings.cache_n")
        times = outcome.token_times.setdefault(0, [])
        if request.n == 1 and not outcome.token_ids:  # chunk counts were a guess: exact only if they add up
            if completion and len(times) > completion:  # re-tokenized chunks over-counted: the last is the finish
                times[completion - 1:] = [times[-1]]
            outcome.gaps_approximate = len(times) != completion
        if request.n == 1 and times and completion > len(times):  # tokens that came without a chunk of their own
            times.extend([times[-1]] * (completion - len(times)))
        outcome.finish_s = max((t[-1] for t in outcome.token_times.values() if t), default=math.nan)
        if not outcome.prompt_tokens:
            outcome.prompt_tokens = request.prompt_tokens

    def _tokens(self, outcome: Outcome, choice: dict, now: float) -> None:
        index = _count(choice.get("index", 0), "choices[].index", MAX_CHOICES)
        ids, text = choice.get("token_ids"), choice.get("text")
        if isinstance(ids, list):
            count = len(ids)
        elif text and self.tokenizer is not None:
            count = max(1, len(self.tokenizer.encode(str(text), add_special_tokens=False)))
        else:
            count = int(bool(text))
        if isinstance(ids, list):
            outcome.token_ids.setdefault(index, []).extend(_count(t, "choices[].token_ids[]") for t in ids)
        outcome.token_times.setdefault(index, []).extend([now] * count)


MAX_CHOICES = 1 << 16  # a choice index beyond any n a request may ask for


class MalformedEvent(UserError):
    """A server event that is not what the OpenAI streaming protocol sends: the request fails with this reason
    (the replay goes on with the other requests)."""


def _mapping(value: object, what: str) -> dict:
    if not isinstance(value, dict):
        raise MalformedEvent(f"{what} is {short(value)}; allowed: a JSON object")
    return value


def _count(value: object, what: str, high: int | None = None) -> int:
    """A count from the server (usage, indices, token ids): an integer >= 0, absent = 0."""
    return 0 if value is None else whole(value, what, 0, high)


def _message(text: str) -> str:
    """The error message of an OpenAI-style error body, else the text (one line, shortened)."""
    try:
        doc = json.loads(text)
        error = doc.get("error", doc) if isinstance(doc, dict) else doc
        text = error.get("message", text) if isinstance(error, dict) else str(error)
    except (json.JSONDecodeError, AttributeError):
        pass
    text = " ".join(str(text).split())
    return text if len(text) <= 300 else text[:297] + "..."
