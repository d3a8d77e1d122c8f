"""The KV transport between a prefill and a decode process on one machine (NIXL pull semantics, over a loopback
TCP socket).

Prefill side: a request that asked to be decoded elsewhere (`do_remote_decode`) finishes holding its blocks (the
core's `remote_kv`); the engine exports them in `KVExports` under the request id, with a lease
(`kv_lease_duration`), and `KVExportServer` serves them: K and V of every layer, and the per-token scales of a
quantized cache, read out of the paged cache when the decode side asks.

Decode side: `pull` connects, names the transfer id, the first block it needs (after its local prefix hits) and
its own cache layout, receives the tensors, and acknowledges; the prefill side's engine then frees the blocks
(vLLM's `finished_sending`). `scatter` writes them into the blocks the decode engine allocated.

Leases: a decode side renews the leases of its requests still queued (`lease_op` "extend", vLLM 0.34's heartbeat)
and ends those of requests aborted before their pull (`lease_op` "release", vLLM's notification without blocks).

Deadlines: every socket operation on both sides runs under the transfer's remaining time (`transfer_timeout`):
a dead or silent peer is a `KVTransferError` within that bound, never a hang. An export nobody reads ends with
its lease (the blocks are freed as if read).

Wire format (both directions): an 8-byte big-endian length, a JSON header of at most MAX_HEADER bytes, then the
raw bytes the header announces (the tensors in order, C-contiguous).
"""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from kvplan.engine.kv_cache import QUANTIZED_DTYPES, KVLayout, PagedKVCache

MAX_HEADER = 1 << 20  # a header is a few hundred bytes; anything larger is not a kvplan peer
CHUNK = 1 << 20  # bytes per recv/send call
LEASE_OPS = ("extend", "release")  # what a decode side may ask of a prefill side's exports besides a pull


class KVTransferError(RuntimeError):
    """A transfer that failed: the peer is gone, silent past the deadline, or refused (the message says which)."""


def layout_dict(layout: KVLayout) -> dict:
    """What both sides must agree on for blocks to be copied byte for byte."""
    return {"num_layers": layout.num_layers, "num_kv_heads": layout.num_kv_heads, "head_dim": layout.head_dim,
            "block_size": layout.block_size, "dtype": str(layout.dtype).removeprefix("torch.")}


def gather(cache: PagedKVCache, block_ids: list[int]) -> list[torch.Tensor]:
    """Copies of `block_ids` in every layer, in `LayerKV.tensors()` order (K, V, then the scales of a quantized
    cache), on the host: [len(block_ids), block_size, heads, head_dim] (scales without head_dim)."""
    if any(b < 0 for b in block_ids):
        raise KVTransferError("the request's blocks include ones released by sink+window attention; a "
                              "windowed cache cannot be transferred")
    index = torch.tensor(block_ids, dtype=torch.long)
    out = []
    for layer in cache.layers:
        for tensor in layer.tensors():
            out.append(tensor[index.to(tensor.device)].to("cpu").contiguous())
    return out


def scatter(cache: PagedKVCache, block_ids: list[int], tensors: list[torch.Tensor]) -> None:
    """Write `gather`'s tensors into `block_ids` of this cache (one per transferred block, in order)."""
    targets = [t for layer in cache.layers for t in layer.tensors()]
    if len(targets) != len(tensors):
        raise KVTransferError(f"received {len(tensors)} tensors for a cache of {len(targets)}")
    index = torch.tensor(block_ids, dtype=torch.long)
    for target, source in zip(targets, tensors, strict=True):
        if source.shape[0] != len(block_ids) or source.shape[1:] != target.shape[1:] or source.dtype != target.dtype:
            raise KVTransferError(f"received {tuple(source.shape)} {source.dtype} for {len(block_ids)} blocks of "
                                  f"{tuple(target.shape[1:])} {target.dtype}")
        if target.dtype in QUANTIZED_DTYPES:  # CPU indexing lacks float8: move the bytes
            target, source = target.view(torch.uint8), source.view(torch.uint8)
        target[index.to(target.device)] = source.to(target.device)


@dataclass(slots=True)
class _Export:
    block_ids: list[int]
    expires_s: float  # time.monotonic() at which the lease ends


class KVExports:
    """The prefill side's held blocks, by transfer id (the request id), each with a lease; thread-safe: the engine
    thread adds and drains, the server's threads read.

    A read copies the blocks out under the lock, and the engine frees a request's blocks only after draining it
    from `done()` - which happens only once its lease has ended or its reader acknowledged, both under the same
    lock: so no block is read after the engine may have reused it."""

    def __init__(self, cache: PagedKVCache, lease_s: float) -> None:
        self.cache, self.lease_s = cache, lease_s
        self._lock = threading.Lock()
        self._exports: dict[str, _Export] = {}
        # (transfer id, time.perf_counter() when it ended): read and acknowledged, or expired - the engine frees
        # their blocks; the time is taken under the lock that publishes it (see `done`)
        self._done: list[tuple[str, float]] = []

    def add(self, transfer_id: str, block_ids: list[int]) -> float:
        """Serve `block_ids` under `transfer_id` until its lease ends; returns when that is (time.monotonic())."""
        with self._lock:
            if transfer_id in self._exports:
                raise KVTransferError(f"transfer id {transfer_id!r} is already exported")
            expires = time.monotonic() + self.lease_s
            self._exports[transfer_id] = _Export(list(block_ids), expires)
            return expires

    def read(self, transfer_id: str, first_block: int) -> list[torch.Tensor] | None:
        """`gather` of the export's blocks from `first_block` on (the reader's local prefix hits skipped); None
        when there is no such export (never made, already acknowledged, or expired)."""
        with self._lock:
            self._expire()
            export = self._exports.get(transfer_id)
            if export is None:
                return None
            return gather(self.cache, export.block_ids[first_block:])

    def extend(self, transfer_ids: list[str]) -> int:
        """Restart the lease of each live export named (vLLM 0.34's heartbeat from a decode side whose request
        still waits there); how many were extended."""
        with self._lock:
            self._expire()
            expires = time.monotonic() + self.lease_s
            live = [self._exports[t] for t in transfer_ids if t in self._exports]
            for export in live:
                export.expires_s = expires
            return len(live)

    def release(self, transfer_ids: list[str]) -> int:
        """End the exports named (read and acknowledged, or their request aborted on the decode side before it
        read them: vLLM's notification with no blocks); how many there were."""
        with self._lock:
            gone = [t for t in transfer_ids if self._exports.pop(t, None) is not None]
            now = time.perf_counter()
            self._done.extend((t, now) for t in gone)
            return len(gone)

    def done(self, cut_s: float | None = None) -> list[tuple[str, float]]:
        """(transfer id, when it ended) of the exports whose blocks may be freed now (acknowledged or expired),
        each once; with `cut_s` (a
        time.perf_counter() in the past) only those that ended by then - all of them: each end is stamped under
        the lock this reads under."""
        with self._lock:
            self._expire()
            done = [(t, at) for t, at in self._done if cut_s is None or at <= cut_s]
            self._done = [(t, at) for t, at in self._done if cut_s is not None and at > cut_s]
            return done

    def first_end_s(self) -> float | None:
        """When the earliest export not yet drained by `done` ended (time.perf_counter()), or None."""
        with self._lock:
            self._expire()
            return min((at for _, at in self._done), default=None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._exports)

    def _expire(self) -> None:
        now = time.monotonic()
        for transfer_id in [t for t, e in self._exports.items() if e.expires_s <= now]:
            del self._exports[transfer_id]
            self._done.append((transfer_id, time.perf_counter()))


class _Deadline:
    def __init__(self, timeout_s: float, what: str) -> None:
        self.end, self.timeout_s, self.what = time.monotonic() + timeout_s, timeout_s, what

    def arm(self, sock: socket.socket) -> None:
        left = self.end - time.monotonic()
        if left <= 0:
            raise KVTransferError(f"{self.what}: no answer within {self.timeout_s:g} s")
        sock.settimeout(left)


def _send(sock: socket.socket, header: dict, tensors: list[torch.Tensor], deadline: _Deadline) -> None:
    raw = json.dumps(header).encode()
    deadline.arm(sock)
    sock.sendall(struct.pack(">Q", len(raw)) + raw)
    for tensor in tensors:
        view = tensor.view(torch.uint8).numpy().data.cast("B")
        for start in range(0, len(view), CHUNK):
            deadline.arm(sock)
            sock.sendall(view[start:start + CHUNK])


def _recv_exact(sock: socket.socket, size: int, deadline: _Deadline) -> bytearray:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        deadline.arm(sock)
        n = sock.recv_into(view[got:], min(CHUNK, size - got))
        if n == 0:
            raise KVTransferError(f"{deadline.what}: the peer closed the connection after {got} of {size} bytes")
        got += n
    return buffer


def _recv_header(sock: socket.socket, deadline: _Deadline) -> dict:
    (size,) = struct.unpack(">Q", _recv_exact(sock, 8, deadline))
    if size > MAX_HEADER:
        raise KVTransferError(f"{deadline.what}: a {size}-byte header; not a kvplan KV transfer peer")
    header = json.loads(_recv_exact(sock, size, deadline))
    if not isinstance(header, dict):
        raise KVTransferError(f"{deadline.what}: a header that is not a JSON object")
    return header


class KVExportServer:
    """Serves `KVExports` on host:port: one thread per connection, each bounded by `timeout_s`."""

    def __init__(self, exports: KVExports, host: str, port: int, timeout_s: float) -> None:
        self.exports, self.layout, self.timeout_s = exports, layout_dict(exports.cache.layout), timeout_s
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                with contextlib.suppress(KVTransferError, OSError, ValueError):
                    outer._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((host, port), Handler)
        self.host, self.port = self._server.server_address[:2]
        # poll_interval: how long `stop` may wait for the serving loop to notice (socketserver's default is 0.5 s)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="kvplan-kv-export", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _serve(self, sock: socket.socket) -> None:
        deadline = _Deadline(self.timeout_s, "KV export")
        request = _recv_header(sock, deadline)
        op, ids = request.get("op"), request.get("transfer_ids")
        if op in LEASE_OPS:  # a decode side's heartbeat for its queued requests, or its abort of some of them
            names = [str(i) for i in ids] if isinstance(ids, list) else []
            count = self.exports.extend(names) if op == "extend" else self.exports.release(names)
            _send(sock, {"count": count}, [], deadline)
            return
        if request.get("layout") != self.layout:
            _send(sock, {"error": f"the decode cache layout {request.get('layout')} differs from the prefill "
                                  f"cache layout {self.layout}"}, [], deadline)
            return
        transfer_id, first_block = str(request.get("transfer_id")), request.get("first_block", 0)
        tensors = self.exports.read(transfer_id, first_block) if isinstance(first_block, int) else None
        if tensors is None:
            _send(sock, {"error": f"no KV exported under transfer id {transfer_id!r} (never exported, already "
                                  "read, or its lease ended)"}, [], deadline)
        else:
            meta = [[str(t.dtype).removeprefix("torch."), list(t.shape)] for t in tensors]
            _send(sock, {"tensors": meta}, tensors, deadline)
            if _recv_header(sock, deadline).get("done") is True:
                self.exports.release([transfer_id])


@contextlib.contextmanager
def _connection(host: str, port: int, timeout_s: float, what: str) -> Iterator[tuple[socket.socket, _Deadline]]:
    """A connection to a KV server with the exchange's deadline; every failure is a KVTransferError."""
    deadline = _Deadline(timeout_s, what)
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            yield sock, deadline
    except TimeoutError:
        raise KVTransferError(f"{what}: no answer within {timeout_s:g} s") from None
    except OSError as exc:
        raise KVTransferError(f"{what}: {exc.strerror or exc}") from None


def pull(host: str, port: int, transfer_id: str, layout: KVLayout, timeout_s: float,
         first_block: int = 0) -> list[torch.Tensor]:
    """The blocks exported under `transfer_id` on host:port from `first_block` on, as `gather` returns them;
    acknowledged, so the prefill side frees them. Any failure, including running past `timeout_s` in all, is a
    KVTransferError."""
    what = f"KV pull of {transfer_id!r} from {host}:{port}"
    with _connection(host, port, timeout_s, what) as (sock, deadline):
        _send(sock, {"transfer_id": transfer_id, "first_block": first_block, "layout": layout_dict(layout)}, [],
              deadline)
        header = _recv_header(sock, deadline)
        if "error" in header:
            raise KVTransferError(f"{what}: {header['error']}")
        tensors = []
        for dtype_name, shape in header["tensors"]:
            dtype = getattr(torch, dtype_name)
            count = 1
            for dim in shape:
                count *= dim
            raw = _recv_exact(sock, count * torch.empty((), dtype=dtype).element_size(), deadline)
            tensors.append(torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape))
        _send(sock, {"done": True}, [], deadline)
        return tensors


def lease_op(host: str, port: int, op: str, transfer_ids: list[str], timeout_s: float) -> int:
    """Ask the prefill side on host:port to `extend` (restart) or `release` (end) the leases of `transfer_ids`;
    how many it still held. A KVTransferError when it cannot be reached within `timeout_s`."""
    assert op in LEASE_OPS
    with _connection(host, port, timeout_s, f"KV lease {op} at {host}:{port}") as (sock, deadline):
        _send(sock, {"op": op, "transfer_ids": transfer_ids}, [], deadline)
        return int(_recv_header(sock, deadline).get("count", 0))
