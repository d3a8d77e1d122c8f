"""The OpenAI-compatible HTTP API of `kvplan serve` (FastAPI): completions and chat completions, streamed over SSE
or whole, plus `/v1/models`, `/health` and `/metrics`.

One HTTP request becomes one engine request per prompt (n samples each). A client that disconnects — mid-stream,
or while a whole answer is being computed — aborts its engine requests, so their blocks are freed at once.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from kvplan.engine.serving.async_engine import AsyncEngine, EngineDied, QueueFull, RequestStream, TokenDelta
from kvplan.engine.serving.protocol import BadRequest, ParsedRequest, chat_prompt, completion_prompts, parse_common
from kvplan.strict_json import loads

DISCONNECT_POLL_S = 0.25  # how often a whole-answer request checks that its client is still there
RETRY_AFTER_S = 1


@dataclass(slots=True)
class _Choice:
    """One output sequence as the client sees it: its tokens, the text sent so far, why it ended."""

    index: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None


class _Detokenizer:
    """Incremental text of a choice. Text that may still change is held back: a trailing partial UTF-8
    character, and with stop strings the tail that could be the start of one."""

    def __init__(self, tokenizer, stops: tuple[str, ...]) -> None:
        self.tokenizer, self.stops = tokenizer, stops
        self.hold = max((len(s) for s in stops), default=1) - 1

    def advance(self, choice: _Choice, final: bool) -> tuple[str, bool]:
        """(new text to send, whether a stop string ended the choice)."""
        if self.tokenizer is None:
            return "", False
        text = self.tokenizer.decode(choice.token_ids, skip_special_tokens=True)
        for stop in self.stops:
            at = text.find(stop, max(0, len(choice.text) - len(stop)))
            if at >= 0:
                return self._emit(choice, text[:at]), True
        if not final:
            text = text.rstrip("\ufffd")
            text = text[:max(len(choice.text), len(text) - self.hold)]
        return self._emit(choice, text), False

    @staticmethod
    def _emit(choice: _Choice, text: str) -> str:
        new = text[len(choice.text):] if text.startswith(choice.text) else ""
        choice.text += new
        return new


def build_app(engine: AsyncEngine, model_name: str) -> FastAPI:
    app = FastAPI(title="kvplan serve", docs_url=None, redoc_url=None)
    llm = engine.llm
    ids = itertools.count()
    created = int(time.time())

    @app.exception_handler(BadRequest)
    async def bad_request(_request: Request, exc: BadRequest) -> JSONResponse:
        headers = {"Retry-After": str(RETRY_AFTER_S)} if exc.status == 503 else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(EngineDied)
    async def engine_died(_request: Request, exc: EngineDied) -> JSONResponse:
        return JSONResponse(BadRequest(str(exc), status=500).body(), status_code=500)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if engine.alive else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> dict:
        """vLLM's endpoint of the same name: replays start from a cold prefix cache, as a simulation does."""
        return {"dropped_blocks": await engine.reset_prefix_cache()}

    # LoRA adapters (engine.lora): a request names one in `model`; listed after the base model, as vLLM does
    adapters = {} if llm.lora is None else {name: str(a.path) for name, a in llm.lora.adapters.items()}

    @app.get("/v1/models")
    async def models() -> dict:
        base = {"id": model_name, "object": "model", "created": created, "owned_by": "kvplan",
                "max_model_len": llm.max_model_len, "vocab_size": llm.loaded.vocab_size}  # replay draws ids below it
        return {"object": "list", "data": [base, *({**base, "id": name, "root": path, "parent": model_name}
                                                   for name, path in adapters.items())]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await _body(request)
        prompts = completion_prompts(body, llm.encode, llm.loaded.vocab_size)
        parsed = parse_common(body, prompts, 16, llm.max_model_len, llm.loaded.vocab_size)
        parsed.lora = body.get("model") if body.get("model") in adapters else None
        if parsed.kv_transfer_params is not None and len(prompts) > 1:
            raise BadRequest("kv_transfer_params: one prompt per request (its KV is held under the request's id); "
                             f"got {len(prompts)} prompts", "kv_transfer_params")
        return await _serve(request, parsed, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await _body(request)
        prompt = chat_prompt(body, llm.tokenizer)
        parsed = parse_common(body, [prompt], max(1, llm.max_model_len - len(prompt)), llm.max_model_len,
                              llm.loaded.vocab_size)
        parsed.lora = body.get("model") if body.get("model") in adapters else None
        return await _serve(request, parsed, chat=True)

    async def _body(request: Request) -> dict:
        try:
            raw = await request.body()
        except ClientDisconnect:  # the client left mid-body: nobody to answer, and nothing worth a traceback
            raise BadRequest("the client disconnected before sending the whole body", status=400) from None
        try:
            # strict: NaN/Infinity refused, nesting bounded (a body nested 100,000 deep is a 400, not a
            # RecursionError and a 500)
            body = loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadRequest(f"the request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        if body.get("model") not in (None, model_name) and body.get("model") not in adapters:
            served = ", ".join(f"`{name}`" for name in (model_name, *adapters))
            raise BadRequest(f"The model `{body['model']}` does not exist; this server serves {served}",
                             "model", status=404)
        return body

    async def _serve(request: Request, parsed: ParsedRequest, chat: bool) -> Response:
        if parsed.stream and (parsed.kv_transfer_params or {}).get("do_remote_decode"):
            raise BadRequest("kv_transfer_params.do_remote_decode: the answer carrying the params is a whole one; "
                             "allowed: stream false (as vLLM's P/D proxy sends the prefill request)",
                             "kv_transfer_params")
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{next(ids)}"
        events: asyncio.Queue = asyncio.Queue()
        streams = await _add_all(rid, parsed, events)
        n = parsed.params.n
        choices = {(p, j): _Choice(p * n + j) for p in range(len(streams)) for j in range(n)}
        reply = _Reply(rid, parsed.lora or model_name, created, chat, parsed, llm.tokenizer, choices, streams, events)
        if parsed.stream:
            return StreamingResponse(reply.sse(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await reply.whole(request)

    async def _add_all(rid: str, parsed: ParsedRequest, events: asyncio.Queue) -> list[RequestStream]:
        streams: list[RequestStream] = []
        try:
            for p, tokens in enumerate(parsed.prompts):
                streams.append(await engine.add(f"{rid}-{p}", tokens, parsed.params, events, key=p,
                                                kv_transfer_params=parsed.kv_transfer_params, lora=parsed.lora))
        except BaseException as exc:
            for stream in streams:
                stream.abort()
            where = f"prompt[{len(streams)}]: " if len(parsed.prompts) > 1 else ""
            if isinstance(exc, QueueFull):
                raise BadRequest(f"the server is at capacity ({exc}); retry later", status=503) from None
            if isinstance(exc, ValueError):
                raise BadRequest(f"{where}{exc}", "prompt") from None
            if isinstance(exc, RuntimeError):  # the engine thread is gone: the server can no longer serve
                raise BadRequest(str(exc), status=503) from None
            raise
        return streams

    return app


class _Reply:
    """Turns one HTTP request's engine deltas into OpenAI response objects."""

    def __init__(self, rid: str, model: str, created: int, chat: bool, parsed: ParsedRequest, tokenizer,
                 choices: dict, streams: list[RequestStream], events: asyncio.Queue) -> None:
        self.rid, self.model, self.created, self.chat, self.parsed = rid, model, created, chat, parsed
        self.detok = _Detokenizer(tokenizer, parsed.stop)
        self.choices, self.streams, self.events = choices, streams, events
        self.open = len(streams)
        self.cached: dict[int, int] = {}  # prompt -> its tokens served from the prefix cache
        self.kv_transfer_params: dict | None = None  # a remote-decode request's (vLLM puts it in the response)

    async def deltas(self):
        """(choice, new text, new token ids) per engine delta, until every engine request has ended."""
        while self.open:
            key, delta = await self.events.get()
            if isinstance(delta, EngineDied):
                raise delta
            if delta is None:
                self.open -= 1
                self.streams[key].finished = True
                continue
            choice = self.choices[(key, delta.index)]
            if choice.finish_reason is not None:  # already ended by a stop string
                continue
            yield choice, self._apply(key, choice, delta), delta.token_ids

    def _apply(self, key: int, choice: _Choice, delta: TokenDelta) -> str:
        choice.token_ids += delta.token_ids
        if delta.cached_tokens is not None:
            self.cached[key] = delta.cached_tokens
        if delta.kv_transfer_params is not None:
            self.kv_transfer_params = delta.kv_transfer_params
        text, stopped = self.detok.advance(choice, final=delta.finish_reason is not None)
        choice.finish_reason = "stop" if stopped else delta.finish_reason
        n = self.parsed.params.n
        if stopped and all(self.choices[(key, j)].finish_reason for j in range(n)):
            self.streams[key].abort("stop")  # every sample of this prompt is done: free its blocks now
        return text

    def close(self) -> None:
        for stream in self.streams:
            stream.abort()  # no-op for requests that ended

    async def sse(self):
        try:
            async for choice, text, new_ids in self.deltas():
                yield _sse({**self._head(chunk=True), "choices": [self._choice(choice, text, new_ids, whole=False)]})
            if self.parsed.include_usage:
                yield _sse({**self._head(chunk=True), "choices": [], "usage": self._usage()})
            yield "data: [DONE]\n\n"
        except EngineDied as exc:  # the headers are sent: the stream ends with an error event instead
            yield _sse(BadRequest(str(exc), status=500).body())
        finally:
            self.close()

    async def whole(self, request: Request) -> Response:
        task = asyncio.ensure_future(self._collect())
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
                if not task.done() and await request.is_disconnected():
                    task.cancel()
                    return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
            task.result()
        finally:
            self.close()
        ordered = sorted(self.choices.values(), key=lambda c: c.index)
        choices = [self._choice(c, c.text, c.token_ids, whole=True) for c in ordered]
        body = {**self._head(chunk=False), "choices": choices, "usage": self._usage()}
        if self.kv_transfer_params is not None:
            body["kv_transfer_params"] = self.kv_transfer_params
        return JSONResponse(body)

    async def _collect(self) -> None:
        async for _delta in self.deltas():
            pass

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.rid, "object": kind, "created": self.created, "model": self.model}

    def _choice(self, choice: _Choice, text: str, token_ids: list[int], whole: bool) -> dict:
        out: dict = {"index": choice.index}
        if self.chat:
            out["message" if whole else "delta"] = {"role": "assistant", "content": text}
        else:
            out.update(text=text, logprobs=None)
        out["finish_reason"] = choice.finish_reason
        if self.parsed.return_token_ids:
            out["token_ids"] = token_ids  # vLLM's extension: the tokens behind this text
        return out

    def _usage(self) -> dict:
        prompt = sum(len(p) for p in self.parsed.prompts)
        completion = sum(len(c.token_ids) for c in self.choices.values())
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": sum(self.cached.values())}}


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
