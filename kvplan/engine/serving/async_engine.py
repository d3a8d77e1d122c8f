"""`AsyncEngine`: one engine thread steps the `LLM` continuously while an asyncio server adds and aborts requests.

The `LLM` (scheduler, block pool, KV tensors) is touched by the engine thread only. Handlers talk to it through
one command queue and hear back through a per-request asyncio queue:

    handler ──add / abort──▶ commands ──▶ engine thread: drain commands → llm.step() → publish deltas
       ▲                                                         │
       └──── Accepted | ValueError, then TokenDelta…, None ◀─────┘  (call_soon_threadsafe into the handler's loop)

Invariants: a request the engine accepted gets exactly one final delta (a finish reason) or is aborted by its
handler, whose stream then ends; an aborted request's blocks are freed in the engine thread before the next
step; the engine blocks on the queue only when it has nothing to run, so it steps while requests arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvplan.engine.llm import LLM
from kvplan.engine.sampling import SamplingParams
from kvplan.engine.serving.metrics import ServingMetrics

# an idle prefill instance holding KV for decode instances wakes this often to free what they have read (or what
# outlived its lease): otherwise those blocks would stay held until the next request arrives
HELD_KV_POLL_S = 0.05


class EngineDied(RuntimeError):
    """Delivered to every open stream when the engine thread has crashed (a bug): the answer is incomplete."""


class RequestFailed(EngineDied):
    """Delivered to one request's stream when it failed in the engine (P/D: its KV never arrived)."""


class QueueFull(Exception):
    """More requests wait for admission than the server accepts (the HTTP layer answers 503)."""


@dataclass(slots=True)
class TokenDelta:
    index: int  # the sequence (choice) within the request
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" on the last delta of a sequence
    cached_tokens: int | None = None  # on the last delta: prompt tokens the prefix cache served at admission
    kv_transfer_params: dict | None = None  # on the last delta of a remote-decode request: where its KV waits


@dataclass(slots=True)
class _Stream:
    """The engine thread's view of one request: where to send its deltas and what it has sent."""

    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue  # receives (key, TokenDelta) and (key, None) when the request has ended
    key: object
    accepted: asyncio.Future  # None, or the exception that refused the request
    arrival_s: float
    sent: dict[int, int] = field(default_factory=dict)  # sequence index -> tokens delivered
    first_token_s: float | None = None
    last_token_s: dict[int, float] = field(default_factory=dict)

    def deliver(self, item: TokenDelta | EngineDied | None) -> None:  # EngineDied includes RequestFailed
        self._call(self.events.put_nowait, (self.key, item))

    def answer(self, error: BaseException | None) -> None:
        self._call(self.accepted.set_exception if error else self.accepted.set_result, error)

    def _call(self, fn, arg) -> None:
        # RuntimeError: the handler's event loop has closed (server shutting down): nobody listens
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(fn, arg)


class RequestStream:
    """A handler's handle on one accepted request. Its deltas go to the queue given to `AsyncEngine.add`, tagged
    with its key, ending with (key, None); `abort()` ends it early and frees its blocks."""

    def __init__(self, engine: AsyncEngine, request_id: str) -> None:
        self.engine, self.request_id = engine, request_id
        self.finished = False

    def abort(self, reason: str = "abort") -> None:
        if not self.finished:
            self.finished = True
            self.engine.abort(self.request_id, reason)


class AsyncEngine:
    def __init__(self, llm: LLM, metrics: ServingMetrics | None = None, *, max_queue_len: int = 1024) -> None:
        self.llm, self.metrics, self.max_queue_len = llm, metrics, max_queue_len
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}  # engine thread only
        self._pending_lock = threading.Lock()
        self._pending = 0  # adds submitted but not yet taken by the engine thread
        self.num_waiting = 0  # published by the engine thread after each step
        self.num_running = 0
        self.error: BaseException | None = None  # what killed the engine thread, if anything
        self._thread = threading.Thread(target=self._run, name="kvplan-engine", daemon=True)

    # -- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._commands.put(("stop",))
            self._thread.join()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    # -- called from handlers (any thread) ------------------------------------------------------------------
    async def add(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams,
                  events: asyncio.Queue, key: object = None, kv_transfer_params: dict | None = None,
                  lora: str | None = None) -> RequestStream:
        """Submit a request; returns once the engine accepted it. Raises ValueError (a request that cannot run:
        the message says why), QueueFull, or RuntimeError when the engine thread is gone."""
        if not self.alive:
            raise RuntimeError(f"the engine loop has stopped: {self.error!r}")
        with self._pending_lock:
            if self.num_waiting + self._pending >= self.max_queue_len:
                raise QueueFull(f"{self.num_waiting + self._pending} requests are waiting (max_queue_len "
                                f"{self.max_queue_len})")
            self._pending += 1
        loop = asyncio.get_running_loop()
        stream = _Stream(loop, events, key, loop.create_future(), time.perf_counter())
        self._commands.put(("add", request_id, list(prompt_token_ids), params, stream, kv_transfer_params, lora))
        await stream.accepted
        return RequestStream(self, request_id)

    def abort(self, request_id: str, reason: str = "abort") -> None:
        self._commands.put(("abort", request_id, reason))

    async def reset_prefix_cache(self) -> int:
        """Forget every cached free block (in the engine thread, between steps); returns how many were dropped."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._commands.put(("reset", lambda n: loop.call_soon_threadsafe(done.set_result, n)))
        return await done

    # -- the engine thread ----------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._drain(block=not self.llm.has_unfinished_requests(),
                              timeout=HELD_KV_POLL_S if self.llm.holds_kv_for_remote else None):
                if self.llm.has_unfinished_requests():
                    finished = self.llm.step()
                    self._publish(finished)
                elif self.llm.holds_kv_for_remote:
                    self.llm.release_read_kv()
                self._observe()
        except BaseException as exc:  # a bug: every open stream gets the error, and /health reports it
            self.error = exc
            for stream in self._streams.values():
                stream.deliver(EngineDied(f"the engine loop stopped: {exc!r}"))
            traceback.print_exc()  # a bug in kvplan: its traceback goes to the server's log

    def _drain(self, block: bool, timeout: float | None = None) -> bool:
        """Apply queued commands (waiting for one when idle, at most `timeout` if given); False once told to
        stop."""
        while True:
            try:
                command = self._commands.get(block=block, timeout=timeout if block else None)
            except queue.Empty:
                return True
            block = False
            if command[0] == "stop":
                return False
            if command[0] == "add":
                self._add(*command[1:])
            elif command[0] == "abort":
                self._abort(*command[1:])
            else:
                command[1](self.llm.scheduler.reset_prefix_cache())

    def _add(self, request_id: str, tokens: list[int], params: SamplingParams, stream: _Stream,
             kv_transfer_params: dict | None, lora: str | None = None) -> None:
        with self._pending_lock:
            self._pending -= 1
        try:
            self.llm.add_request(tokens, params, request_id=request_id, arrival_s=stream.arrival_s,
                                 kv_transfer_params=kv_transfer_params, lora=lora)
        except ValueError as exc:
            stream.answer(exc)
            return
        self._streams[request_id] = stream
        self.num_waiting += 1  # visible to the queue limit before the next step publishes the count
        if self.metrics is not None:
            self.metrics.prompt_tokens.inc(len(tokens))
        stream.answer(None)

    def _abort(self, request_id: str, reason: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is None:  # already finished
            return
        self.llm.abort(request_id)
        if self.metrics is not None:
            self.metrics.finished(reason, stream.arrival_s, time.perf_counter())
        stream.deliver(None)

    def _publish(self, finished: list) -> None:
        now = time.perf_counter()
        for output in finished:
            stream = self._streams.pop(output.request_id)
            if output.error is not None:
                if self.metrics is not None:
                    self.metrics.finished("error", stream.arrival_s, now)
                stream.deliver(RequestFailed(output.error))
                continue
            for completion in output.outputs:
                self._send(stream, completion.index, completion.token_ids[stream.sent.get(completion.index, 0):],
                           now, completion.finish_reason, output.metrics.num_cached_tokens, output.kv_transfer_params)
            if self.metrics is not None:
                reasons = {c.finish_reason for c in output.outputs}
                self.metrics.finished("length" if reasons == {"length"} else "stop", stream.arrival_s, now)
            stream.deliver(None)
        for request_id, stream in self._streams.items():
            for index, new in self.llm.new_output_tokens(request_id, stream.sent):
                self._send(stream, index, new, now, None)

    def _send(self, stream: _Stream, index: int, new: list[int], now: float, reason: str | None,
              cached: int | None = None, kv_transfer_params: dict | None = None) -> None:
        """Deliver a sequence's new tokens (and, on its last delta, why it ended)."""
        if not new and reason is None:
            return
        stream.sent[index] = stream.sent.get(index, 0) + len(new)
        stream.deliver(TokenDelta(index, new, reason, cached, kv_transfer_params))
        if self.metrics is None or not new:
            return
        self.metrics.generation_tokens.inc(len(new))
        if stream.first_token_s is None:
            stream.first_token_s = now
            self.metrics.ttft.observe(now - stream.arrival_s)
        last = stream.last_token_s.get(index)
        if last is not None:
            self.metrics.itl.observe(now - last)
        stream.last_token_s[index] = now

    def _observe(self) -> None:
        sched = self.llm.scheduler
        self.num_waiting, self.num_running = len(sched.waiting), len(sched.running)
        if self.metrics is not None:
            self.metrics.observe_scheduler(sched)
