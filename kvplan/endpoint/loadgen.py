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
ITL distribution; TTFT, TPOT and E2E use only its first and last token times, which stay exact).

Deadlines and bounds (kvplan.endpoint.http_limits): a request has `timeout_s` from being sent to the last byte of
its stream, however the server spends it (a drip, keep-alive comments, a line that never ends); the cache reset
and every /metrics scrape have min(timeout_s, CALL_TIMEOUT_S) each.

Distrust: every value of a server's stream is checked against its meaning before it is used: choices[].index in
[0, n), token ids and counts integers >= 0 and bounded (kvplan.limits.MAX_TOKENS), no more tokens than asked for,
usage.completion_tokens at most what was asked, cached tokens at most the prompt's, finish_reason a string and not
a failure ("error", "abort"). The classes, and what each does:
* a request the server answers badly fails, kept with whatever it received, and its `reason` is counted in the
  result: `timeout`, `transport`, `too_large`, `http` (a status other than 200), `error_event`, `short_answer`, or
  `server_error:<field>` (a value against its meaning; the message names the URL, the field, the value and what
  was expected). The replay goes on with the other requests.
* a /metrics scrape during the replay that fails (deadline, size, transport) or a gauge or counter against its
  meaning (kvplan.endpoint.scrape) is excluded and counted in `LoadResult.faults`, written to the result; after
  a scrape missed its deadline or size, the command scrapes no more (`Scrapes`), each skipped one counted.
* a cache reset that misses its deadline or fails to connect refuses the run (one line, exit 2): a replay that
  was asked to start cold must not start warm in silence.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from kvplan.endpoint import http_limits, scrape, servers
from kvplan.endpoint.http_limits import (
    MAX_LINE_BYTES,
    STREAM_BYTES_PER_TOKEN,
    Faults,
    Scrapes,
    ServerFault,
    bad_count,
    bad_value,
    deadline,
    is_count,
    lines,
    read,
    request,
    server_error,
)
from kvplan.endpoint.prompts import EndpointRequest
from kvplan.endpoint.servers import ADAPTERS, CALL_TIMEOUT_S, ServerAdapter
from kvplan.errors import UserError
from kvplan.limits import MAX_TOKENS
from kvplan.strict_json import loads

PROGRESS_EVERY_S = 5.0
SETTLE_S, SETTLE_POLL_S = 2.0, 0.02  # the closing scrape waits at most this for the counters to settle
MAX_TOKEN_ID = 2**31 - 1  # a token id: below any vocabulary's size
FAILED_FINISH = ("error", "abort")  # vLLM's finish reasons for a request it gave up on
TIMING_KEYS = 32  # llama.cpp's `timings`: its numeric entries, at most this many, are kept


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
    reason: str | None = None  # the error's class (module doc)
    gaps_approximate: bool = False  # token counts per chunk were guessed and did not add up (see module doc)
    server_timings: dict | None = None  # llama.cpp's per-response `timings`

    def fail(self, reason: str, error: str) -> None:
        if self.error is None:
            self.reason, self.error = reason, error


@dataclass(slots=True)
class LoadResult:
    outcomes: list[Outcome]  # in trace order
    series: list[dict]  # sampled gauges: time_s, running, waiting, swapped, kv_usage
    counters: dict[str, float]  # vLLM counters over the replay (NaN: not exposed)
    cache_config: dict[str, str]  # vllm:cache_config_info labels, {} when not exposed
    wall_s: float
    prefix_cache_reset: str | None = None  # what the reset call did before the replay (None: not asked)
    server: str = "vllm"  # the adapter's kind
    faults: Faults = field(default_factory=Faults)  # scrapes and values excluded (module doc)


class LoadGenerator:
    def __init__(self, url: str, model: str | None, *, temperature: float = 1.0, seed: int = 0,
                 max_concurrency: int | None = None, timeout_s: float = 600.0, sample_interval_s: float = 1.0,
                 reset_prefix_cache: bool = False, progress: Callable[[str], None] | None = None,
                 adapter: ServerAdapter | None = None, tokenizer=None, scrapes: Scrapes | None = None) -> None:
        self.base = url.rstrip("/").removesuffix("/v1")
        self.scrapes = scrapes if scrapes is not None else Scrapes()
        self.adapter = adapter if adapter is not None else ADAPTERS["vllm"]
        self.tokenizer = tokenizer  # counts a text chunk's tokens where the server sends no ids
        self.model, self.temperature, self.seed = model, temperature, seed
        self.max_concurrency, self.timeout_s = max_concurrency, timeout_s
        self.call_s = min(timeout_s, CALL_TIMEOUT_S)  # a scrape's or the reset's deadline
        self.sample_interval_s = sample_interval_s
        self.reset_prefix_cache = reset_prefix_cache
        self.progress = progress if progress is not None else (lambda line: print(line, file=sys.stderr))

    def run(self, requests: list[EndpointRequest]) -> LoadResult:
        return http_limits.run(self._run(requests))

    async def _run(self, requests: list[EndpointRequest]) -> LoadResult:
        limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
        faults = Faults()
        async with http_limits.client(limits=limits, timeout=self.timeout_s) as client:
            reset = await self._reset(client) if self.reset_prefix_cache else None
            before = await self._scrape(client, faults)
            t0 = requests[0].arrival_s if requests else 0.0
            origin = time.perf_counter() - t0
            outcomes = [Outcome(r.row, r.arrival_s) for r in requests]
            series: list[dict] = []
            gate = asyncio.Semaphore(self.max_concurrency) if self.max_concurrency else None
            monitor = asyncio.create_task(self._monitor(client, origin, series, outcomes, faults))
            tasks = []
            for request_, outcome in zip(requests, outcomes, strict=True):
                delay = request_.arrival_s - (time.perf_counter() - origin)
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(self._send(client, request_, outcome, origin, gate)))
            await asyncio.gather(*tasks)
            monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await monitor
            wall = time.perf_counter() - origin - t0
            after = await self._settled_scrape(client, faults)
        start, end = servers.counters(self.adapter, before), servers.counters(self.adapter, after)
        counters, broken = scrape.difference(start, end), scrape.broken(start, end)
        if broken:
            self.progress(f"  warning: server counters went backwards or are not counts (a restart mid-replay?), "
                          f"reported as unknown: {', '.join(broken)}")
        for fault in scrape.check_counters(start, end, counters, f"GET {self.base}/metrics",
                                           dict(self.adapter.counters)):
            faults.add(fault)
        return LoadResult(outcomes, series, counters, scrape.cache_config(after or before), wall, reset,
                          self.adapter.kind, faults)

    async def _reset(self, client: httpx.AsyncClient) -> str:
        """The adapter's reset calls (vLLM's POST /reset_prefix_cache, SGLang's /flush_cache): "reset" when every
        one answered 200, else what the server said. One that misses its deadline or cannot connect is a
        ServerFault (module doc)."""
        if not self.adapter.reset_paths:
            return f"not supported: {self.adapter.kind} has no cache-reset call"
        for path in self.adapter.reset_paths:
            reply = await request(client, "POST", f"{self.base}{path}", self.call_s)
            if reply.status != 200:
                return (f"not supported (POST {path}: HTTP {reply.status}): the replay starts from the "
                        "server's warm cache")
        return "reset"

    async def _scrape(self, client: httpx.AsyncClient, faults: Faults) -> list:
        """The /metrics samples; [] when the server has none (a status other than 200) or the scrape failed
        (counted in `faults`). After one that missed its deadline or its size, none is tried again in this
        command (`Scrapes`): each would cost the deadline again."""
        if self.scrapes.given_up is not None:
            faults.add(ServerFault(f"not scraped: {self.scrapes.given_up}", "metrics_scrape:given_up"))
            return []
        try:
            reply = await request(client, "GET", f"{self.base}/metrics", self.call_s)
        except ServerFault as fault:
            faults.add(ServerFault(str(fault), f"metrics_scrape:{fault.reason}"))
            if fault.reason in ("timeout", "too_large"):
                self.scrapes.given_up = str(fault)
            return []
        return scrape.parse(reply.text()) if reply.status == 200 else []

    async def _settled_scrape(self, client: httpx.AsyncClient, faults: Faults) -> list:
        """The closing /metrics samples, once the server has counted the replay: a server updates its counters
        when it logs a finished request, which may come after the client read that request's last byte (vLLM's
        output handler records stats after it hands the outputs on). Scraped again every SETTLE_POLL_S until the
        running gauge reads 0 (where the server has one) and the counters read the same twice, at most
        min(SETTLE_S, the scrape deadline); past that the last scrape is taken as it is (another client may keep
        the server busy)."""
        samples = await self._scrape(client, faults)
        settle_by = time.perf_counter() + min(SETTLE_S, self.call_s)
        while samples and time.perf_counter() < settle_by:
            await asyncio.sleep(SETTLE_POLL_S)
            again = await self._scrape(client, faults)
            if not again:
                break
            running = servers.gauges(self.adapter, again, "")[0]["running"]
            now, before = servers.counters(self.adapter, again), servers.counters(self.adapter, samples)
            same = all(now[k] == before[k] or (math.isnan(now[k]) and math.isnan(before[k])) for k in now)
            samples = again
            if same and (running == 0 or math.isnan(running)):  # no running gauge: the counters alone decide
                break
        return samples

    async def _monitor(self, client: httpx.AsyncClient, origin: float, series: list, outcomes: list,
                       faults: Faults) -> None:
        last_progress = time.perf_counter()
        while True:
            now = time.perf_counter()
            samples = await self._scrape(client, faults)
            if samples:
                values, bad = servers.gauges(self.adapter, samples, f"GET {self.base}/metrics")
                for fault in bad:
                    faults.add(fault)
                series.append({"time_s": now - origin, **values})
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
        model = request.lora or self.model  # an adapter is named in `model`, as vLLM's server takes it
        return body if model is None else {"model": model, **body}

    async def _send(self, client: httpx.AsyncClient, request: EndpointRequest, outcome: Outcome, origin: float,
                    gate: asyncio.Semaphore | None) -> None:
        if gate is not None:
            await gate.acquire()
        url = f"{self.base}/v1/completions"
        try:
            outcome.sent_s = time.perf_counter() - origin
            async with deadline(self.timeout_s, f"POST {url}"):
                await self._stream(client, url, request, outcome, origin)
        except ServerFault as fault:
            outcome.fail(fault.reason, str(fault))
        finally:
            if gate is not None:
                gate.release()
        if outcome.error is None:
            got = sum(len(t) for t in outcome.token_times.values())
            if got != request.max_tokens * request.n:
                outcome.fail("short_answer", f"short answer: {got} of {request.max_tokens * request.n} tokens "
                             "(ignore_eos honoured?)")

    async def _stream(self, client: httpx.AsyncClient, url: str, request: EndpointRequest, outcome: Outcome,
                      origin: float) -> None:
        check = Check(url, request)
        async with client.stream("POST", url, json=self.body(request), timeout=self.timeout_s) as response:
            if response.status_code != 200:
                head = (await read(response, f"POST {url}")).decode(errors="replace")
                outcome.fail("http", f"HTTP {response.status_code}: {_message(head)}")
                return
            completion = 0
            limit = MAX_LINE_BYTES + STREAM_BYTES_PER_TOKEN * request.max_tokens * request.n
            async for line in lines(response, f"POST {url}", limit):
                if not line.startswith("data:"):  # SSE comments (`: ping`), `event:` and `id:` fields, blank lines
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter() - origin
                event = check.mapping(check.json(data), "event")
                if "error" in event:
                    outcome.fail("error_event", f"error event: {_message(data)}")
                    return
                choices = event.get("choices") or []
                if not isinstance(choices, list):
                    raise check.bad("choices", choices, "a list of objects")
                for choice in choices:
                    self._tokens(outcome, check, check.mapping(choice, "choices[]"), now)
                usage = check.mapping(event.get("usage") or {}, "usage")
                if usage:
                    outcome.prompt_tokens = check.count(usage.get("prompt_tokens"), "usage.prompt_tokens")
                    details = check.mapping(usage.get("prompt_tokens_details") or {}, "usage.prompt_tokens_details")
                    outcome.cached_tokens = check.count(details.get("cached_tokens"),
                                                        "usage.prompt_tokens_details.cached_tokens")
                    completion = check.count(usage.get("completion_tokens"), "usage.completion_tokens",
                                             request.max_tokens * request.n)
                timings = event.get("timings")
                if timings is not None:  # llama.cpp: cache_n = prompt tokens its slot cache served
                    timings = check.mapping(timings, "timings")
                    outcome.server_timings = _numbers(timings)
                    if not (usage and "prompt_tokens_details" in usage):
                        outcome.cached_tokens = check.count(timings.get("cache_n"), "timings.cache_n")
        if not outcome.prompt_tokens:
            outcome.prompt_tokens = request.prompt_tokens
        if outcome.cached_tokens > outcome.prompt_tokens:
            raise check.bad("cached_tokens", outcome.cached_tokens,
                            f"at most the prompt's {outcome.prompt_tokens} tokens")
        times = outcome.token_times.setdefault(0, [])
        if request.n == 1 and not outcome.token_ids:  # chunk counts were a guess: exact only if they add up
            if completion and len(times) > completion:  # re-tokenized chunks over-counted: the last is the finish
                times[completion - 1:] = [times[-1]]
            outcome.gaps_approximate = len(times) != completion
        if request.n == 1 and times and completion > len(times):  # tokens that came without a chunk of their own
            times.extend([times[-1]] * (completion - len(times)))
        outcome.finish_s = max((t[-1] for t in outcome.token_times.values() if t), default=math.nan)

    def _tokens(self, outcome: Outcome, check: Check, choice: dict, now: float) -> None:
        index = check.count(choice.get("index", 0), "choices[].index", check.request.n - 1)
        reason = choice.get("finish_reason")
        if reason is not None and (not isinstance(reason, str) or reason in FAILED_FINISH):
            raise check.bad("finish_reason", reason, "null or a reason the request completed for "
                            "(\"length\", \"stop\")")
        ids, text = choice.get("token_ids"), choice.get("text")
        if ids is not None and not isinstance(ids, list):
            raise check.bad("choices[].token_ids", ids, "a list of token ids")
        if text is not None and not isinstance(text, str):
            raise check.bad("choices[].text", text, "a string")
        if isinstance(ids, list):
            count = len(ids)
        elif text and self.tokenizer is not None:
            count = max(1, len(self.tokenizer.encode(text, add_special_tokens=False)))
        else:
            count = int(bool(text))
        times = outcome.token_times.setdefault(index, [])
        if len(times) + count > check.request.max_tokens:  # what is kept stays bounded by what was asked
            raise check.bad("choices[].token_ids", f"{len(times) + count} tokens for choice {index}",
                            f"at most max_tokens = {check.request.max_tokens}")
        if isinstance(ids, list):
            outcome.token_ids.setdefault(index, []).extend(check.count(t, "choices[].token_ids[]", MAX_TOKEN_ID)
                                                           for t in ids)
        times.extend([now] * count)


@dataclass(slots=True)
class Check:
    """The checks of one request's stream: each bad value is a ServerFault naming the URL, the trace row and the
    field; the request fails with it (reason `server_error:<field>`)."""

    url: str
    request: EndpointRequest

    @property
    def where(self) -> str:
        return f"POST {self.url}, trace row {self.request.row}"

    def bad(self, what: str, value: object, expected: str) -> ServerFault:
        return bad_value(self.where, what, value, expected, MALFORMED)

    def json(self, data: str) -> object:
        try:
            return loads(data)
        except UserError as exc:
            raise server_error(self.where, "event", f"event is not JSON: {exc}", MALFORMED) from None

    def mapping(self, value: object, what: str) -> dict:
        if not isinstance(value, dict):
            raise self.bad(what, value, "a JSON object")
        return value

    def count(self, value: object, what: str, high: int = MAX_TOKENS) -> int:
        """A count from the server (usage, indices, token ids): an integer in [0, high], absent = 0."""
        if value is None:
            return 0
        if not is_count(value, 0, high):
            raise bad_count(self.where, what, value, 0, high, MALFORMED)
        return value  # type: ignore[return-value]  # is_count: an int


MALFORMED = "malformed stream"


def _numbers(doc: dict) -> dict:
    """The numeric entries of a server's `timings` (at most TIMING_KEYS): what is kept of it is bounded."""
    kept = [(k, v) for k, v in doc.items() if isinstance(k, str) and len(k) <= 64
            and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)]
    return dict(kept[:TIMING_KEYS])


def _message(text: str) -> str:
    """The error message of an OpenAI-style error body, else the text (one line, shortened). Read with the
    strict reader: an error body is the server's too (nested 100,000 deep, it is quoted, not parsed)."""
    try:
        doc = loads(text)
        error = doc.get("error", doc) if isinstance(doc, dict) else doc
        text = error.get("message", text) if isinstance(error, dict) else str(error)
    except UserError:
        pass
    text = " ".join(str(text).split())
    return text if len(text) <= 300 else text[:297] + "..."
