"""Every HTTP exchange kvplan has with a server, bounded in time and in memory. One mechanism for all of them:
the load generator's streamed completions, the probes (`/v1/models`, `/metrics`, `/props`, `/get_server_info`,
`/info`), the cache-reset calls, `/health` while a local server starts, and `bench serve`'s scrapes.

Time: an exchange has one overall deadline, from opening the connection to the last byte of the body (connect,
headers and body together), enforced by `asyncio.timeout` around the whole exchange. httpx's own timeout bounds
only each wait between two reads, so a server that drips a byte a second, streams SSE keep-alive comments
(`: ping`) forever, or never ends a line would hold it forever; here it ends at the deadline. A synchronous call
(`fetch`) runs the same coroutine in its own event loop.

Memory: a body kvplan reads whole (a JSON document, a metrics page) is at most MAX_BODY_BYTES, an error body is
read only as far as MAX_ERROR_BYTES (the rest is not waited for), a streamed body is read line by line with each
line at most MAX_LINE_BYTES and the whole stream bounded by the caller. Bodies are asked for uncompressed
(`Accept-Encoding: identity`), so a compressed bomb never inflates here.

What breaks a bound is a `ServerFault`: a UserError naming the method, the URL and what happened, with a
`reason` (`timeout`, `too_large`, `transport`, or `server_error:<field>` for a value that contradicts its meaning,
see `bad_value`). Whoever called decides what it means: a failed request for a completion during a replay, one
line and exit 2 for a probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from kvplan.errors import UserError
from kvplan.strict_json import loads, short

if TYPE_CHECKING:  # httpx is imported where a call is made: a command that makes none does not pay for it
    import httpx

MAX_BODY_BYTES = 16 << 20  # a JSON document or a /metrics page (vLLM's: ~0.5 MB with every histogram)
MAX_ERROR_BYTES = 64 << 10  # what is kept of an error body: its message is in its first lines
MAX_LINE_BYTES = 1 << 20  # one line of an SSE stream: one event (a chunk of a few tokens, or the usage)
STREAM_BYTES_PER_TOKEN = 64 << 10  # a completion stream: MAX_LINE_BYTES plus this per token asked for
HEADERS = {"Accept-Encoding": "identity"}
T = TypeVar("T")


class ServerFault(UserError):
    """A server that broke a bound or sent a value against its meaning; `reason` classifies it."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def server_error(where: str, what: str, detail: str, lead: str = "the server sent a bad value") -> ServerFault:
    """A value from the server that contradicts its meaning: the server's fault, named as such (`where`: the
    method and URL it came from, `what`: the field or metric, `detail`: the value and what is allowed)."""
    return ServerFault(f"{lead}: {detail} (from {where})", f"server_error:{what}")


def bad_value(where: str, what: str, value: object, expected: str,
              lead: str = "the server sent a bad value") -> ServerFault:
    return server_error(where, what, value_detail(what, value, expected), lead)


def bad_count(where: str, what: str, value: object, low: int, high: int,
              lead: str = "the server sent a bad value") -> ServerFault:
    return server_error(where, what, count_detail(what, value, low, high), lead)


def value_detail(what: str, value: object, expected: str) -> str:
    return f"{what} is {short(value)}; allowed: {expected}"


def count_detail(what: str, value: object, low: int, high: int) -> str:
    """A count that is not an integer (exactly: not a boolean, a float or a string) or not in [low, high]."""
    kind = "out of range" if isinstance(value, int) and not isinstance(value, bool) else "not an integer"
    return f"{what}: {short(value)} is {kind}; allowed: an integer >= {low} and <= {high}"


def is_count(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


@contextlib.asynccontextmanager
async def deadline(seconds: float, what: str) -> AsyncIterator[None]:
    """Everything inside must finish within `seconds` (`what`: "GET http://.../metrics", for the message); a
    transport error inside is a ServerFault too."""
    import httpx

    try:
        async with asyncio.timeout(seconds):
            yield
    except (TimeoutError, httpx.TimeoutException):
        raise ServerFault(f"{what}: no complete answer within {seconds:g} s (the deadline covers connecting, the "
                          "headers and the whole body)", "timeout") from None
    except httpx.HTTPError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ServerFault(f"{what}: {type(exc).__name__}{': ' + reason[:120] if reason else ''}",
                          "transport") from None


@dataclass(slots=True)
class Reply:
    """A whole answer: its status and body (an error body: only its first MAX_ERROR_BYTES)."""

    what: str  # "GET http://host/path"
    status: int
    body: bytes

    def json(self) -> object:
        """The body as JSON (kvplan.strict_json); a body that is not is the server's fault."""
        try:
            return loads(self.body)
        except UserError as exc:
            raise server_error(self.what, "body", f"the body is {exc}") from None

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


async def read(response: httpx.Response, what: str, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body of `response`: at most `limit` bytes of a success (more is a ServerFault), the first
    MAX_ERROR_BYTES of an error (the rest is not read)."""
    keep = limit if response.status_code < 400 else MAX_ERROR_BYTES
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += chunk
        if len(body) > keep:
            if response.status_code >= 400:
                return bytes(body[:keep])
            raise ServerFault(f"{what}: a body larger than {limit} bytes", "too_large")
    return bytes(body)


async def request(client: httpx.AsyncClient, method: str, url: str, seconds: float, *, limit: int = MAX_BODY_BYTES,
                  json: object = None) -> Reply:
    """One exchange, whole, within `seconds`."""
    what = f"{method} {url}"
    async with deadline(seconds, what), client.stream(method, url, json=json, headers=HEADERS,
                                                      timeout=seconds) as response:
        return Reply(what, response.status_code, await read(response, what, limit))


async def lines(response: httpx.Response, what: str, limit: int) -> AsyncIterator[str]:
    """The body's lines (without their ending), each at most MAX_LINE_BYTES, the whole body at most `limit`
    bytes; a line or body past its bound is a ServerFault. The caller's `deadline` bounds the time."""
    buffer, total = bytearray(), 0
    async for chunk in response.aiter_raw():
        total += len(chunk)
        if total > limit:
            raise ServerFault(f"{what}: a streamed body larger than {limit} bytes", "too_large")
        buffer += chunk
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            if end - start > MAX_LINE_BYTES:
                break
            yield buffer[start:end].rstrip(b"\r").decode("utf-8", errors="replace")
            start = end + 1
        del buffer[:start]
        if len(buffer) > MAX_LINE_BYTES:
            raise ServerFault(f"{what}: a line longer than {MAX_LINE_BYTES} bytes", "too_large")
    if buffer:
        yield buffer.decode("utf-8", errors="replace")


@functools.cache
def tls() -> ssl.SSLContext:
    """httpx's default TLS context, built once: building it reads the CA bundle (~40 ms), and every call makes a
    client."""
    import httpx

    return httpx.create_ssl_context()


def client(**options) -> httpx.AsyncClient:
    """The client every exchange goes through: uncompressed bodies (module doc), the shared TLS context."""
    import httpx

    return httpx.AsyncClient(headers=HEADERS, verify=tls(), **options)


def run(coroutine: Coroutine[object, object, T]) -> T:
    """`asyncio.run` without its wait for the default executor's threads at the end: a name lookup still hanging
    in one (a DNS server that never answers) would hold the caller past the deadline its coroutine kept."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()  # shuts the executor down without waiting


def fetch(method: str, url: str, seconds: float, *, limit: int = MAX_BODY_BYTES, json: object = None) -> Reply:
    """`request` from synchronous code: its own client and event loop, the same deadline and bounds."""

    async def one() -> Reply:
        async with client() as http:
            return await request(http, method, url, seconds, limit=limit, json=json)

    return run(one())


@dataclass(slots=True)
class Scrapes:
    """Shared by the load generators of one command (the replay, its drift probes, validate's repeats): a
    /metrics that missed its deadline or size once is not scraped again (each later scrape is counted as
    given up), so a hanging /metrics costs one deadline per command, not one per scrape."""

    given_up: str | None = None  # the failure that made it give up


@dataclass(slots=True)
class Faults:
    """Bad values a server sent that were excluded from a result rather than refusing the run (a /metrics
    sample, a counter): how many of each kind, and the first one's message."""

    counts: dict[str, int] = field(default_factory=dict)
    first: dict[str, str] = field(default_factory=dict)

    def add(self, fault: ServerFault) -> None:
        self.counts[fault.reason] = self.counts.get(fault.reason, 0) + 1
        self.first.setdefault(fault.reason, str(fault))

    def to_json(self) -> dict:
        return {key: {"count": n, "first": self.first[key]} for key, n in sorted(self.counts.items())}
