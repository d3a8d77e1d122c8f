"""The KV transport between a prefill and a decode process on one machine (NIXL pull semantics, over a loopback
TCP socket).

Prefill side: when a request that asked to be decoded elsewhere (`do_remote_decode`) finishes, the engine copies
its KV blocks - K and V of every layer, and the per-token scales of a quantized cache - out of the paged cache
into `KVExports` under a transfer id, with a lease (`kv_lease_duration`); `KVExportServer` serves them. That is
vLLM NIXL's `kv_buffer_device: cpu` (a host staging buffer). The copy is taken in the engine thread between the
step's update and the next forward, the only moment nothing writes those blocks.

Decode side: `pull` connects, names the transfer id and its own cache layout, receives the tensors, and
acknowledges; the prefill side then drops the export (vLLM's `finished_sending`). `scatter` writes them into the
blocks the decode engine allocated.

Deadlines: every socket operation on both sides runs under the transfer's remaining time (`transfer_timeout`):
a dead or silent peer is a `KVTransferError` within that bound, never a hang. An export nobody reads is dropped
when its lease ends; the staged bytes are bounded (`capacity_bytes`, the paged cache's size by default: the
prefill side never holds more than its own cache could).

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
from dataclasses import dataclass

import torch

from kvplan.engine.kv_cache import QUANTIZED_DTYPES, KVLayout, PagedKVCache

MAX_HEADER = 1 << 20  # a header is a few hundred bytes; anything larger is not a kvplan peer
CHUNK = 1 << 20  # bytes per recv/send call


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
    tensors: list[torch.Tensor]
    num_bytes: int
    expires_s: float  # time.monotonic() at which the lease ends


class KVExports:
    """The prefill side's staged KV, by transfer id, each with a lease; thread-safe (the engine thread adds, the
    server's threads read and drop)."""

    def __init__(self, lease_s: float, capacity_bytes: int) -> None:
        self.lease_s, self.capacity_bytes = lease_s, capacity_bytes
        self._lock = threading.Lock()
        self._exports: dict[str, _Export] = {}
        self.num_bytes = 0
        self.finished_sending: list[str] = []  # read and acknowledged, or expired: the engine may forget them

    def add(self, transfer_id: str, tensors: list[torch.Tensor]) -> float:
        """Stage `tensors`; returns when the lease ends (time.monotonic()). Refused when the staged bytes would
        exceed the capacity."""
        size = sum(t.numel() * t.element_size() for t in tensors)
        with self._lock:
            self._expire()
            if transfer_id in self._exports:
                raise KVTransferError(f"transfer id {transfer_id!r} is already staged")
            if self.num_bytes + size > self.capacity_bytes:
                raise KVTransferError(f"staging {size} bytes of KV would exceed the prefill side's staging capacity "
                                      f"({self.num_bytes} of {self.capacity_bytes} bytes held for decode instances "
                                      "that have not read them yet)")
            expires = time.monotonic() + self.lease_s
            self._exports[transfer_id] = _Export(tensors, size, expires)
            self.num_bytes += size
            return expires

    def get(self, transfer_id: str) -> list[torch.Tensor] | None:
        with self._lock:
            self._expire()
            export = self._exports.get(transfer_id)
            return None if export is None else export.tensors

    def drop(self, transfer_id: str) -> None:
        with self._lock:
            self._drop(transfer_id)

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._exports)

    def _drop(self, transfer_id: str) -> None:
        export = self._exports.pop(transfer_id, None)
        if export is not None:
            self.num_bytes -= export.num_bytes
            self.finished_sending.append(transfer_id)

    def _expire(self) -> None:
        now = time.monotonic()
        for transfer_id in [t for t, e in self._exports.items() if e.expires_s <= now]:
            self._drop(transfer_id)


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
        view = memoryview(tensor.view(torch.uint8).numpy()).cast("B")
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

    def __init__(self, exports: KVExports, layout: KVLayout, host: str, port: int, timeout_s: float) -> None:
        self.exports, self.layout, self.timeout_s = exports, layout_dict(layout), timeout_s
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
        transfer_id = str(request.get("transfer_id"))
        tensors = self.exports.get(transfer_id)
        if request.get("layout") != self.layout:
            _send(sock, {"error": f"the decode cache layout {request.get('layout')} differs from the prefill "
                                  f"cache layout {self.layout}"}, [], deadline)
        elif tensors is None:
            _send(sock, {"error": f"no KV staged under transfer id {transfer_id!r} (never staged, already read, "
                                  "or its lease ended)"}, [], deadline)
        else:
            meta = [[str(t.dtype).removeprefix("torch."), list(t.shape)] for t in tensors]
            _send(sock, {"tensors": meta}, tensors, deadline)
            if _recv_header(sock, deadline).get("done") is True:
                self.exports.drop(transfer_id)


def pull(host: str, port: int, transfer_id: str, layout: KVLayout, timeout_s: float) -> list[torch.Tensor]:
    """The KV staged under `transfer_id` on host:port, as `gather` returned it there; acknowledged, so the
    prefill side frees it. Any failure, including running past `timeout_s` in all, is a KVTransferError."""
    what = f"KV pull of {transfer_id!r} from {host}:{port}"
    deadline = _Deadline(timeout_s, what)
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            _send(sock, {"transfer_id": transfer_id, "layout": layout_dict(layout)}, [], deadline)
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
    except TimeoutError:
        raise KVTransferError(f"{what}: no answer within {timeout_s:g} s") from None
    except OSError as exc:
        raise KVTransferError(f"{what}: {exc.strerror or exc}") from None
