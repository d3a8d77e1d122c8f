"""A live prefill/decode pair serving a trace: two engine processes on this machine, KV over the real kvplan transport
(`engine.kv_transfer`), this process acting as vLLM's P/D proxy - the input of `kvplan validate` with P/D flags.

    parent (proxy)  --request at its arrival: max_tokens 1, do_remote_decode-->  prefill process (LiveReplay)
                    <--its one token's output: kv_transfer_params------------
                    --the request with those kv_transfer_params------------->  decode process (LiveReplay)
                                                                                 pulls the KV from the prefill process

Each instance runs the co-located replay discipline (`engine.replay.LiveReplay`, one mechanism with a role: its
requests come from its inbox as the proxy sends them, `InboxArrivals`) and writes its own step profile. One clock:
`time.perf_counter()` is CLOCK_MONOTONIC on Linux, the same in every process of the machine; the parent fixes the
trace clock's origin on it and hands it to both. Recorded per request on that clock: when it reached each instance
(the instance's receiving thread stamps it, under the lock the engine reads under, so the engine takes it at the
first step boundary at or after that time), when the decode step that began its pull started, when the pull began
and ended, and when the prefill instance's export of it ended.

Each instance runs torch on its own half of the machine's cores (as each instance of a real pair has its own GPU).

Deadlines: loading is bounded by `LOAD_S`, the run by `stall_s` without any message from an instance; an instance that
dies, raises or stalls fails the run (`PairFailed`, one line) and both processes are ended - never a hang.
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing as mp
import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from kvplan.errors import UserError
from kvplan.traces import Trace

LOAD_S = 600.0  # an instance's model load (a first run may build the CPU decode kernel)
BEAT_S = 1.0  # a stepping instance tells the parent it is alive this often
POLL_S = 0.0002  # how often an idle instance looks for its next event
ROLES = ("prefill", "decode")


class PairFailed(UserError):
    """The live pair could not serve the trace (an instance died, raised or stalled); nothing was published."""


@dataclass(slots=True)
class InstanceRun:
    """One instance's part of a pair's run (times on the trace clock, seconds; by trace row)."""

    role: str
    log: object  # engine.replay.ReplayLog
    meta: dict
    steps_path: str
    arrived_s: dict[int, float] = field(default_factory=dict)  # when the request reached this instance
    parked_s: dict[int, float] = field(default_factory=dict)  # decode: start of the step that began its pull
    pull_blocks: dict[int, int] = field(default_factory=dict)  # decode: the blocks it pulled
    pull_s: dict[int, tuple[float, float]] = field(default_factory=dict)  # decode: the pull's start and end
    released_s: dict[int, float] = field(default_factory=dict)  # prefill: when its export ended (read)


@dataclass(slots=True)
class PairRun:
    prefill: InstanceRun
    decode: InstanceRun
    kv_bytes_per_block: int  # the live transport's bytes per block (every layer's K and V)


class InboxArrivals:
    """`engine.replay.Arrivals` from a pipe: a receiving thread stamps each request (its arrival_s) as it comes, on
    the trace clock, under the lock `due` reads under; None closes the inbox."""

    def __init__(self, inbox: Connection, origin: float, stall_s: float) -> None:
        self.origin_s, self.stall_s = origin, stall_s
        self._lock = threading.Lock()
        self._pending: list = []
        self._closed = False
        self._error: str | None = None
        self.arrived_s: dict[int, float] = {}
        threading.Thread(target=self._receive, args=(inbox,), daemon=True, name="kvplan-pd-inbox").start()

    def _receive(self, inbox: Connection) -> None:
        while True:
            try:
                request = inbox.recv()
            except (EOFError, OSError):
                with self._lock:
                    self._error, self._closed = "the proxy (the parent process) is gone", True
                return
            with self._lock:
                if request is None:
                    self._closed = True
                    return
                request.arrival_s = time.perf_counter() - self.origin_s
                self.arrived_s[request.row] = request.arrival_s
                self._pending.append(request)

    def origin(self, clock: Callable[[], float]) -> tuple[float, float]:
        return self.origin_s, -math.inf

    def closed(self) -> bool:
        with self._lock:
            if self._error is not None:
                raise RuntimeError(self._error)
            return self._closed and not self._pending

    def wait(self, now: float, now_s: Callable[[], float], events: Callable[[], float | None] | None) -> float | None:
        give_up = time.monotonic() + self.stall_s
        while True:
            with self._lock:
                if self._error is not None:
                    raise RuntimeError(self._error)
                times = [self._pending[0].arrival_s] if self._pending else []
                nothing_more = self._closed and not self._pending
            event = events() if events is not None else None
            times += [] if event is None else [event]
            if times:
                return max(now, min(times))
            if nothing_more and events is None:
                return None
            if time.monotonic() > give_up:
                raise RuntimeError(f"waited {self.stall_s:g} s for a request or a KV transfer")
            time.sleep(POLL_S)

    def due(self, until: float) -> list:
        with self._lock:
            taken = [r for r in self._pending if r.arrival_s <= until]
            self._pending = self._pending[len(taken):]
            return taken


def kv_config(role: str, port: int, timeout_s: float) -> str:
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_producer" if role == "prefill" else
                       "kv_consumer", "kv_port": port, "kv_connector_extra_config": {"transfer_timeout": timeout_s}})


def _worker(role: str, model: str, options: dict, seed: int, temperature: float, config: str, inbox: Connection,
            outbox: Connection, steps_path: str, interval: float, stall_s: float) -> None:
    """One instance (a spawned process): load, say ready, serve its inbox under the replay discipline, send its run."""
    try:
        import torch

        from kvplan.engine.kv_transfer.config import parse_kv_transfer_config
        from kvplan.engine.llm import LLM
        from kvplan.engine.models import resolve_model
        from kvplan.engine.replay import LiveReplay

        # Each instance its own half of the machine's cores, as each instance of a real pair has its own GPU: two
        # engines each spinning up every core's threads fight for them (torch's OpenMP threads spin while waiting).
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // len(ROLES)))
        llm = LLM(model, seed=seed, kv_transfer=parse_kv_transfer_config(config), **options)
        layout = llm.kv_cache.layout
        meta = {**llm.profile_meta, "model_path": str(resolve_model(model)), "max_model_len": llm.max_model_len,
                "vocab_size": llm.loaded.vocab_size,
                "kv_bytes_per_block": sum(t[0].numel() * t.element_size() for layer in llm.kv_cache.layers
                                          for t in layer.tensors()), "block_size": layout.block_size}
        outbox.send(("ready", meta))
        if not inbox.poll(LOAD_S + stall_s):
            raise RuntimeError("no start from the proxy")
        source = InboxArrivals(inbox, inbox.recv(), stall_s)
        run = InstanceRun(role, None, meta, steps_path)
        origin = source.origin_s
        connector = llm.kv_connector
        assert connector is not None

        beat = [time.monotonic()]

        def on_step(outputs: list, start: float, end: float) -> None:
            if time.monotonic() - beat[0] > BEAT_S:  # alive and stepping (the parent's stall deadline)
                beat[0] = time.monotonic()
                outbox.send(("beat",))
            assert llm.last_step is not None  # (a step has run)
            for load in llm.last_step.output.kv_loads:
                run.parked_s[int(load.request_id)] = start
                run.pull_blocks[int(load.request_id)] = len(load.block_ids)
            for out in outputs:
                if out.error:
                    raise RuntimeError(f"request {out.request_id}: {out.error}")
                if role == "prefill":
                    outbox.send(("handoff", int(out.request_id), out.kv_transfer_params))
                elif out.metrics.kv_load_start_s is not None and out.metrics.kv_load_end_s is not None:
                    run.pull_s[int(out.request_id)] = (out.metrics.kv_load_start_s - origin,
                                                       out.metrics.kv_load_end_s - origin)

        run.log = LiveReplay(llm, temperature=temperature, seed=seed, sample_interval_s=interval,
                             profile_path=steps_path, on_step=on_step).run(source)
        run.arrived_s = dict(source.arrived_s)
        run.released_s = {int(rid): at - origin for rid, at in connector.released_s.items()}
        outbox.send(("done", run))
    except BaseException as exc:  # reported to the parent, which fails the run with it
        with contextlib.suppress(OSError):  # (the parent is gone: nobody to tell)
            outbox.send(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=4)))
        raise SystemExit(1) from None


def run_pair(model: str, trace: Trace, options, out: Path, *, seed: int = 0,
             temperature: float = 1.0, stall_s: float = 60.0, transfer_timeout_s: float = 30.0,
             load_s: float = LOAD_S) -> PairRun:
    """Serve `trace` on a live prefill/decode pair (see the module); each instance's step profile goes to
    out/ROLE.steps.jsonl."""
    from kvplan.endpoint.local_server import free_port
    from kvplan.live import replay_requests, sample_interval

    ctx = mp.get_context("spawn")
    port = free_port()
    out.mkdir(parents=True, exist_ok=True)
    procs, inboxes, outboxes = {}, {}, {}
    for role in ROLES:
        inbox_r, inbox_w = ctx.Pipe(duplex=False)
        outbox_r, outbox_w = ctx.Pipe(duplex=False)
        procs[role] = ctx.Process(target=_worker, name=f"kvplan-pd-{role}", daemon=True, args=(
            role, model, asdict(options), seed, temperature, kv_config(role, port, transfer_timeout_s), inbox_r,
            outbox_w, str(out / f"{role}.steps.jsonl"), sample_interval(trace), stall_s))
        inboxes[role], outboxes[role] = inbox_w, outbox_r
        procs[role].start()
        inbox_r.close()  # the child's ends: closed here, so that a dead child is an EOF on its outbox
        outbox_w.close()
    ok = False
    try:
        result = _proxy(trace, procs, inboxes, outboxes, stall_s, load_s, seed, replay_requests)
        ok = True
        return result
    finally:
        for p in procs.values():  # done: they are exiting; failed: end them now
            p.join(timeout=5 if ok else 0)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for conn in (*inboxes.values(), *outboxes.values()):
            conn.close()


def _proxy(trace: Trace, procs: dict, inboxes: dict, outboxes: dict, stall_s: float, load_s: float, seed: int,
           replay_requests) -> PairRun:
    """The parent's loop: every message from either instance, and each request sent at its arrival."""
    from kvplan.engine.replay import ReplayRequest

    metas: dict[str, dict] = {}
    done: dict[str, InstanceRun] = {}
    by_conn = {outboxes[r]: r for r in ROLES}

    def receive(timeout: float) -> int:
        """Handle what came within `timeout`; how many messages."""
        ready = wait(list(by_conn), timeout)
        for conn in ready:
            role = by_conn[conn]
            try:
                message: Any = conn.recv()  # type: ignore[union-attr, call-arg]
            except (EOFError, OSError):
                del by_conn[conn]
                procs[role].join(timeout=5)
                raise PairFailed(f"live P/D pair: the {role} instance (pid {procs[role].pid}) exited with code "
                                 f"{procs[role].exitcode} before it finished") from None
            kind = message[0]
            if kind == "error":
                raise PairFailed(f"live P/D pair: the {role} instance failed: {message[1]}")
            if kind == "beat":
                continue
            if kind == "ready":
                metas[role] = message[1]
            elif kind == "done":
                done[role] = message[1]
                del by_conn[conn]
                if role == "prefill":
                    inboxes["decode"].send(None)  # every request it prefilled has been handed on (and read)
            else:  # handoff: the proxy's second step
                row, params = message[1], message[2]
                if params is None:
                    raise PairFailed(f"live P/D pair: the prefill instance kept no KV for request row {row}")
                original = requests[row]
                inboxes["decode"].send(ReplayRequest(row, math.nan, original.prompt_token_ids, original.max_tokens,
                                                     kv_transfer_params=params))
        return len(ready)

    def check_alive() -> None:
        for role, p in procs.items():
            if role not in done and not p.is_alive() and p.exitcode is not None:
                if outboxes[role] in by_conn:
                    receive(0.1)  # its last words, if any
                raise PairFailed(f"live P/D pair: the {role} instance (pid {p.pid}) exited with code {p.exitcode} "
                                 "before it finished")

    give_up = time.monotonic() + load_s
    while len(metas) < len(ROLES):
        if time.monotonic() > give_up:
            raise PairFailed(f"live P/D pair: the instances did not load within {load_s:g} s")
        receive(0.5)
        check_alive()
    meta = metas["decode"]
    requests = replay_requests(trace, meta["vocab_size"], meta["max_model_len"], seed)
    if any(r.n != 1 for r in requests):
        raise UserError("--trace: a request with n > 1; allowed with P/D flags: n = 1 (vLLM's P/D proxy sends n = 1)")
    origin = time.perf_counter() + 0.2 - (requests[0].arrival_s if requests else 0.0)
    for role in ROLES:
        inboxes[role].send(origin)
    sent = 0
    heard = time.monotonic()
    while len(done) < len(ROLES):
        now = time.perf_counter() - origin
        while sent < len(requests) and requests[sent].arrival_s <= now:
            r = requests[sent]
            inboxes["prefill"].send(ReplayRequest(r.row, math.nan, r.prompt_token_ids, 1, priority=r.priority,
                                                  kv_transfer_params={"do_remote_decode": True}))
            sent += 1
            if sent == len(requests):
                inboxes["prefill"].send(None)
        wait_s = 0.05 if sent == len(requests) else min(0.05, max(requests[sent].arrival_s - now, 0.0))
        if receive(wait_s) or sent < len(requests):
            heard = time.monotonic()
        check_alive()
        if time.monotonic() - heard > stall_s:
            raise PairFailed(f"live P/D pair: stalled: nothing from either instance for {stall_s:g} s (prefill "
                             f"{'done' if 'prefill' in done else 'running'}, decode "
                             f"{'done' if 'decode' in done else 'running'})")
    return PairRun(done["prefill"], done["decode"], int(meta["kv_bytes_per_block"]))
