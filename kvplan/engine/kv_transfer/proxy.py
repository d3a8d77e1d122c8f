"""`kvplan serve --pd-proxy`: vLLM's toy P/D proxy flow (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py)
with deadlines and retries.

Per request on /v1/completions or /v1/chat/completions:
1. prefill: the request, with `max_tokens` (and `max_completion_tokens`) 1, `stream` false, `stream_options` and
   `min_tokens` dropped, and `kv_transfer_params` {do_remote_decode: true, ...}, goes to the next prefill instance
   (round robin); its answer's `kv_transfer_params` say where the KV waits; its one sampled token is discarded.
2. decode: the original request, with those `kv_transfer_params`, goes to the next decode instance (round robin);
   its answer (streamed or whole) goes back to the client as it comes.
Both calls carry one `X-Request-Id`. GET /v1/models answers as the first decode instance that answers; /health is
the proxy's own.

Deadlines: every wait on an upstream - connecting, sending, each read of its answer (a whole answer arrives only
when it is computed, so that is its first read; a stream's chunks are each one read) - has `timeout_s` (httpx's
per-operation timeouts); nothing waits longer for the next byte.

Retries: an instance that refuses the connection (dead, not started) is skipped and the request goes to the next
one of its pool, each tried at most once; an instance that accepted the request and then failed is not retried
(the request may have run there). Failures reach the client as one JSON error: 503 when no instance of a pool
could be reached, 502 when an instance failed or broke a deadline mid-request, the upstream's own status for a
4xx; a stream already started ends with an error event.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kvplan.errors import UserError
from kvplan.strict_json import loads

PREFILL_FIELDS_DROPPED = ("stream_options", "min_tokens", "min_completion_tokens")
REMOTE_DECODE = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                 "remote_block_ids": None, "remote_host": None, "remote_port": None}


class UpstreamError(Exception):
    """A failed upstream step: `status` is what the client gets (502, 503, or the upstream's 4xx)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def parse_urls(text: str, flag: str) -> list[str]:
    """`http://host:port[,http://host:port...]` -> the base URLs (no trailing slash)."""
    urls = [u.strip().rstrip("/") for u in text.split(",")]
    for url in urls:
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
            raise UserError(f"{flag}: {url!r} is not a server URL; allowed: http://HOST:PORT, comma-separated")
    if len(set(urls)) != len(urls):
        raise UserError(f"{flag}: a URL is listed twice; allowed: distinct URLs")
    return urls


class Pool:
    """One pool's instances, handed out round robin."""

    def __init__(self, name: str, urls: list[str]) -> None:
        self.name, self.urls = name, urls
        self._next = itertools.cycle(range(len(urls)))

    def order(self) -> list[str]:
        """Every instance once, starting at the round robin's next one."""
        start = next(self._next)
        return self.urls[start:] + self.urls[:start]


def error_body(message: str, status: int) -> dict:
    return {"error": {"message": message, "type": "BadGateway" if status == 502 else "ServiceUnavailable"
                      if status == 503 else "BadRequestError", "code": status}}


class PDProxy:
    def __init__(self, prefill: list[str], decode: list[str], timeout_s: float) -> None:
        self.prefill, self.decode, self.timeout_s = Pool("prefill", prefill), Pool("decode", decode), timeout_s
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=httpx.Limits(max_connections=256))

    async def _open(self, pool: Pool, path: str, body: dict | None, headers: dict, method: str = "POST"):
        """A response from the first instance of `pool` (round robin) that accepts the connection; the caller
        closes it. Connection refusals move on to the next instance; anything else is final."""
        refused = []
        for url in pool.order():
            request = self.client.build_request(method, url + path, json=body, headers=headers)
            try:
                return url, await self.client.send(request, stream=True)
            except httpx.ConnectError as exc:
                refused.append(f"{url} ({str(exc) or 'refused'})")
            except httpx.TimeoutException:
                raise UpstreamError(f"{pool.name} instance {url} did not answer within {self.timeout_s:g} s",
                                    502) from None
            except httpx.HTTPError as exc:
                raise UpstreamError(f"{pool.name} instance {url} failed: {exc!r}", 502) from None
        raise UpstreamError(f"no {pool.name} instance could be reached: {'; '.join(refused)}", 503)

    async def _whole(self, url: str, response, pool: Pool) -> dict:
        try:
            raw = await response.aread()
        except httpx.HTTPError as exc:
            raise UpstreamError(f"{pool.name} instance {url} broke off its answer: {exc!r}", 502) from None
        finally:
            await response.aclose()
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        if response.status_code != 200:
            message = doc.get("error", {}).get("message") if isinstance(doc, dict) and isinstance(
                doc.get("error"), dict) else raw[:200].decode(errors="replace")
            status = response.status_code if 400 <= response.status_code < 500 else 502
            raise UpstreamError(f"{pool.name} instance {url} answered {response.status_code}: {message}", status)
        if not isinstance(doc, dict):
            raise UpstreamError(f"{pool.name} instance {url} answered something that is not a JSON object", 502)
        return doc

    async def prefill_step(self, path: str, body: dict, request_id: str) -> dict | None:
        """Step 1: the prefill instance's `kv_transfer_params`; None when it holds no KV for the decode side (its
        one token ended the request - an end-of-sequence token - as vLLM's pull connector keeps only length-capped
        requests' blocks): the decode instance then computes the prompt itself, as behind vLLM's proxy."""
        request = {k: v for k, v in body.items() if k not in PREFILL_FIELDS_DROPPED}
        request.update(max_tokens=1, stream=False, kv_transfer_params=dict(REMOTE_DECODE))
        if "max_completion_tokens" in request:
            request["max_completion_tokens"] = 1
        url, response = await self._open(self.prefill, path, request, {"X-Request-Id": request_id})
        params = (await self._whole(url, response, self.prefill)).get("kv_transfer_params")
        if params is not None and not isinstance(params, dict):
            raise UpstreamError(f"prefill instance {url} returned kv_transfer_params that are not an object", 502)
        return params

    async def decode_step(self, path: str, body: dict, params: dict | None, request_id: str):
        """Step 2: (the decode instance, its open response)."""
        request = {k: v for k, v in body.items() if k != "kv_transfer_params"}
        if params is not None:
            request["kv_transfer_params"] = params
        return await self._open(self.decode, path, request, {"X-Request-Id": request_id})

    async def handle(self, path: str, body: dict):
        """-> (status, JSON body) for a whole answer, or (200, an async iterator of SSE bytes) for a stream."""
        request_id = str(uuid.uuid4())
        try:
            params = await self.prefill_step(path, body, request_id)
            url, response = await self.decode_step(path, body, params, request_id)
            if not body.get("stream"):
                return 200, await self._whole(url, response, self.decode)
            if response.status_code != 200:
                await self._whole(url, response, self.decode)  # raises with the upstream's message
            return 200, self._relay(url, response)
        except UpstreamError as exc:
            return exc.status, error_body(str(exc), exc.status)

    async def _relay(self, url: str, response: httpx.Response) -> AsyncIterator[bytes]:
        """The decode instance's SSE bytes as they come; a broken or stalled stream ends with an error event."""
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        except httpx.TimeoutException:
            yield _event(f"decode instance {url} sent nothing for {self.timeout_s:g} s; the answer is incomplete")
        except httpx.HTTPError as exc:
            yield _event(f"decode instance {url} broke off the stream ({exc!r}); the answer is incomplete")
        finally:
            await response.aclose()

    async def models(self) -> tuple[int, dict]:
        """GET /v1/models of the first decode instance that answers (the model the pair serves, and its limits:
        a replay reads max_model_len and vocab_size there)."""
        try:
            url, response = await self._open(self.decode, "/v1/models", None, {}, method="GET")
            return 200, await self._whole(url, response, self.decode)
        except UpstreamError as exc:
            return exc.status, error_body(str(exc), exc.status)

    async def close(self) -> None:
        await self.client.aclose()


def _event(message: str) -> bytes:
    return f"data: {json.dumps(error_body(message, 502))}\n\n".encode()


def build_proxy_app(proxy: PDProxy) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        await proxy.close()

    app = FastAPI(title="kvplan P/D proxy", docs_url=None, redoc_url=None, lifespan=lifespan)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    async def forward(request: Request, path: str) -> Response:
        try:
            body = loads(await request.body())
        except (ValueError, UnicodeDecodeError) as exc:
            return JSONResponse(error_body(f"the request body is not valid JSON: {exc}", 400), status_code=400)
        if not isinstance(body, dict):
            return JSONResponse(error_body("the request body must be a JSON object", 400), status_code=400)
        status, answer = await proxy.handle(path, body)
        if isinstance(answer, dict):
            return JSONResponse(answer, status_code=status)
        return StreamingResponse(answer, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.get("/v1/models")
    async def models() -> Response:
        status, body = await proxy.models()
        return JSONResponse(body, status_code=status)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await forward(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await forward(request, "/v1/chat/completions")

    return app


def serve_proxy(prefill: list[str], decode: list[str], *, host: str, port: int, timeout_s: float,
                log_level: str) -> None:
    import uvicorn

    app = build_proxy_app(PDProxy(prefill, decode, timeout_s))
    uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                                  timeout_graceful_shutdown=5)).run()
