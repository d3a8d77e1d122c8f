"""The live engine's KV connector (vLLM NIXL pull semantics) between the engine loop and the core's remote-KV
states (`engine.core.remote_kv`): one object per `LLM`, called at fixed points of `LLM.step`, in the engine thread.

    step: reports()        -> finished_sending (read or expired exports) and finished_recving (arrived pulls: their
                              tensors are written into the request's blocks here, between two forwards)
          schedule()
          start(out)        -> one pull per `out.kv_loads`, each on a worker thread (the engine keeps stepping)
          forward, sample, update
          exported(result)  -> export `result.kv_sends` (the prefill side's held blocks) under the request id

Prefill side (`kv_producer`/`kv_both`): a finished `do_remote_decode` request's output carries vLLM 0.34's
`kv_transfer_params` for the decode side: `do_remote_prefill`, `remote_block_ids`, `remote_engine_id`,
`remote_request_id`, `remote_host`, `remote_port`, `tp_size`, `pp_size`, `remote_num_tokens`,
`remote_blocks_expiry_time` (Unix time), `transfer_mode` "pull".

Decode side (`kv_consumer`/`kv_both`): while a `do_remote_prefill` request waits in this instance's queue (before
its blocks are allocated and its pull starts), the connector renews its lease on the prefill side every
lease / 6 (vLLM 0.34's heartbeat), so a long queue here does not lose the KV there. A pull that fails (the
prefill side gone, silent past `transfer_timeout`, or its export expired) fails its request - vLLM's
`kv_load_failure_policy: fail`: the request is aborted in the core (its blocks freed once the transfer is over)
and its output says why.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time

from kvplan.engine.core import Scheduler, SchedulerOutput, UpdateOutput
from kvplan.engine.kv_cache import PagedKVCache
from kvplan.engine.kv_transfer.config import KVTransferConfig, check_tp_pair
from kvplan.engine.kv_transfer.transport import (
    KVExports,
    KVExportServer,
    KVTransferError,
    lease_op,
    pull,
    scatter,
)
from kvplan.errors import UserError

TP_SIZE = 1  # the live engine runs one device per instance (engine.core.settings.SHAPE_SETTINGS)
MAX_PULLS = 4  # pulls in flight at once (threads); more wait their turn, each still under its own deadline
IDLE_WAIT_S = 0.005  # a step with nothing to compute waits this long for a pull to land instead of spinning
HEARTBEATS_PER_LEASE = 6  # vLLM 0.34 NIXL: a decode side renews its queued requests' leases every lease // 6


def check_params(params: object, config: KVTransferConfig | None) -> None:
    """A request's `kv_transfer_params` this instance can honour; a UserError (the HTTP layer's 400) otherwise."""
    if params is None:
        return
    if not isinstance(params, dict):
        raise UserError(f"kv_transfer_params: {type(params).__name__} is not an object; allowed: an object with "
                        "do_remote_decode or do_remote_prefill")
    role = "no --kv-transfer-config" if config is None else f"kv_role {config.kv_role}"
    if params.get("do_remote_decode") and (config is None or not config.is_producer):
        raise UserError(f"kv_transfer_params.do_remote_decode: this instance has {role}; allowed on an instance "
                        "started with kv_role kv_producer or kv_both")
    if params.get("do_remote_prefill"):
        if config is None or not config.is_consumer:
            raise UserError(f"kv_transfer_params.do_remote_prefill: this instance has {role}; allowed on an "
                            "instance started with kv_role kv_consumer or kv_both")
        for key, kind in (("remote_request_id", str), ("remote_host", str), ("remote_port", int),
                          ("tp_size", int)):
            if not isinstance(params.get(key), kind) or isinstance(params.get(key), bool):
                raise UserError(f"kv_transfer_params.{key}: {params.get(key)!r}; allowed: the {kind.__name__} the "
                                "prefill instance returned")
        check_tp_pair(params["tp_size"], TP_SIZE, "kv_transfer_params.tp_size")


class KVConnector:
    def __init__(self, config: KVTransferConfig, cache: PagedKVCache, host: str = "127.0.0.1") -> None:
        self.config, self.cache = config, cache
        self.exports: KVExports | None = None
        self.server: KVExportServer | None = None
        if config.is_producer:
            self.exports = KVExports(cache, config.kv_lease_duration_s)
            try:
                self.server = KVExportServer(self.exports, host, config.kv_port, config.transfer_timeout_s)
            except OSError as exc:
                raise UserError(f"--kv-transfer-config: kv_port {config.kv_port}: cannot listen on {host} "
                                f"({exc.strerror}); allowed: a free port (each prefill instance needs its own)"
                                ) from None
            self.server.start()
        self._pool = concurrent.futures.ThreadPoolExecutor(MAX_PULLS, thread_name_prefix="kvplan-kv-pull")
        self._pulls: dict[str, tuple[list[int], concurrent.futures.Future]] = {}  # request id -> blocks, pull
        self.sent_params: dict[str, dict] = {}  # prefill side: request id -> its output's kv_transfer_params
        self.failed: dict[str, str] = {}  # decode side: request id -> why its pull failed (until the engine reads it)
        self._queued: dict[str, tuple[str, int, str]] = {}  # decode side, not yet pulling: id -> host, port, theirs
        # decode side, time.perf_counter(): when the core parked a request and its pull was submitted, and when the
        # pull's bytes were in; `load_times` holds both for landed pulls until the engine copies them out
        self._submitted: dict[str, float] = {}
        self._ended: dict[str, float] = {}
        self.load_times: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()  # a pull's end is stamped and published at once (see `cut_s`)
        # A replay's step boundary (time.perf_counter()): when set, an event - a landed pull, an export read or
        # expired - is taken at the first step whose boundary is at or after its end, however soon this thread
        # sees it (engine.replay: the simulator takes it at that boundary too); None (serving): as soon as seen
        self.cut_s: float | None = None
        self.released_s: dict[str, float] = {}  # prefill side: request id -> when its export ended (read/expired)
        self._beat_every_s = config.kv_lease_duration_s / HEARTBEATS_PER_LEASE
        self._next_beat_s = time.monotonic() + self._beat_every_s

    def expect(self, request_id: str, params: dict | None) -> None:
        """A request added to the core: a remote-prefill one's lease is renewed until its pull starts."""
        if params is not None and params.get("do_remote_prefill"):
            self._queued[request_id] = (params["remote_host"], params["remote_port"], params["remote_request_id"])

    def forget(self, request_id: str) -> None:
        """An aborted request: a remote-prefill one still queued here tells the prefill side to free its blocks
        now rather than at its lease's end (vLLM notifies it the same way), off the engine thread."""
        queued = self._queued.pop(request_id, None)
        if queued is not None:
            host, port, theirs = queued
            self._pool.submit(lease_op, host, port, "release", [theirs], self.config.transfer_timeout_s)

    def _heartbeat(self) -> None:
        """Renew the leases of the requests queued here, one message per prefill instance, off the engine thread
        (a failure is ignored: the request's pull will report it)."""
        now = time.monotonic()
        if not self._queued or now < self._next_beat_s:
            return
        self._next_beat_s = now + self._beat_every_s
        by_server: dict[tuple[str, int], list[str]] = {}
        for host, port, theirs in self._queued.values():
            by_server.setdefault((host, port), []).append(theirs)
        for (host, port), ids in by_server.items():
            self._pool.submit(lease_op, host, port, "extend", ids, self.config.transfer_timeout_s)

    # -- the step's hooks ------------------------------------------------------------------------------------
    def reports(self, scheduler: Scheduler) -> None:
        """Tell the core which exports are over and which pulls have landed (writing their blocks now)."""
        cut = self.cut_s
        if self.exports is not None:
            ended = self.exports.done(cut)
            self.released_s.update(ended)
            done = [rid for rid, _ in ended if rid in scheduler.remote.sending]
            if done:
                scheduler.finished_sending(done)
        landed = []
        for rid, (blocks, future) in list(self._pulls.items()):
            if cut is not None:
                with self._lock:
                    end = self._ended.get(rid)
                if end is not None and end > cut:
                    continue  # landed after this step's boundary: the next step takes it
                if end is not None:  # its bytes are in; the worker is returning them
                    concurrent.futures.wait([future], timeout=self.config.transfer_timeout_s)
            if not future.done():
                continue
            del self._pulls[rid]
            landed.append(rid)
            try:
                tensors, self.load_times[rid] = future.result(), (self._submitted.pop(rid), self._ended.pop(rid))
                scatter(self.cache, blocks, tensors)
            except KVTransferError as exc:
                self._submitted.pop(rid, None)
                self.failed[rid] = str(exc)
                if rid in scheduler.requests:
                    scheduler.abort(rid)  # held until the finished_recving below says the transfer is over
        if landed:
            scheduler.finished_recving(landed)
        self._heartbeat()

    def start(self, out: SchedulerOutput) -> None:
        """One pull per new load: the prefill side's blocks from the load's first token on."""
        bs = self.cache.layout.block_size
        for load in out.kv_loads:
            self._queued.pop(load.request_id, None)
            params = load.kv_transfer_params
            rid = load.request_id
            self._submitted[rid] = time.perf_counter()
            future = self._pool.submit(self._pull, rid, params["remote_host"], params["remote_port"],
                                       params["remote_request_id"], load.first_token // bs)
            self._pulls[rid] = (list(load.block_ids), future)

    def _pull(self, rid: str, host: str, port: int, theirs: str, first_block: int) -> list:
        """A worker's pull, noting when its bytes were in (the request's transfer end)."""
        tensors = pull(host, port, theirs, self.cache.layout, self.config.transfer_timeout_s, first_block)
        with self._lock:
            self._ended[rid] = time.perf_counter()
        return tensors

    def next_event_s(self) -> float | None:
        """When the earliest event not yet taken by `reports` happened (time.perf_counter(): a pull that landed or
        failed, an export read or expired), or None: what an idle replay step waits for."""
        times = [] if self.exports is None else [self.exports.first_end_s()]
        with self._lock:
            times += [self._ended.get(rid) for rid in self._pulls]
        times += [time.perf_counter() for _, future in self._pulls.values() if future.done()
                  and future.exception() is not None]  # a failure: take it at once
        return min((t for t in times if t is not None), default=None)

    def idle_wait(self, out: SchedulerOutput) -> None:
        """A step that computed nothing while pulls are in flight waits briefly for one, not spinning the loop."""
        if not out.scheduled and self._pulls:
            concurrent.futures.wait([f for _, f in self._pulls.values()], timeout=IDLE_WAIT_S,
                                    return_when=concurrent.futures.FIRST_COMPLETED)

    def exported(self, result: UpdateOutput, num_tokens: dict[str, int]) -> None:
        """Export the blocks the core holds for remote decodes (`result.kv_sends`), and note their params."""
        if not result.kv_sends:
            return
        exports, server = self.exports, self.server
        assert exports is not None and server is not None  # only a producer's requests may hold blocks
        for rid, blocks in result.kv_sends.items():
            expires = exports.add(rid, blocks)
            self.sent_params[rid] = {
                "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": blocks,
                "remote_engine_id": self.config.engine_id, "remote_request_id": rid,
                "remote_host": server.host, "remote_port": server.port, "tp_size": TP_SIZE, "pp_size": 1,
                "remote_num_tokens": num_tokens[rid], "transfer_mode": "pull",
                "remote_blocks_expiry_time": time.time() + (expires - time.monotonic())}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.server is not None:
            self.server.stop()

