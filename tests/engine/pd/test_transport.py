"""The KV transport over a real loopback socket, in one process: blocks of every cache dtype (quantized ones with
their scales) arrive byte for byte in other block ids, from a given first block on; an export ends once read and
acknowledged, when its lease ends, or when the decode side releases it (a heartbeat restarts the lease); a silent or
absent peer is an error within the deadline."""

from __future__ import annotations

import socket
import time

import pytest
import torch

from kvplan.engine.kv_cache import KVLayout, PagedKVCache
from kvplan.engine.kv_transfer.transport import (
    KVExports,
    KVExportServer,
    KVTransferError,
    lease_op,
    pull,
    scatter,
)

CPU = torch.device("cpu")


def filled_cache(layout: KVLayout, seed: int) -> PagedKVCache:
    cache = PagedKVCache(layout, 12, 0, CPU)
    g = torch.Generator().manual_seed(seed)
    for layer in cache.layers:
        for t in layer.tensors():
            raw = t.view(torch.uint8)
            raw.copy_(torch.randint(0, 120, raw.shape, dtype=torch.uint8, generator=g))  # < 0x7f: no fp8 NaNs
    return cache


def poll(condition, timeout_s: float = 5.0) -> bool:
    end = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8, torch.float8_e4m3fn])
def test_blocks_arrive_byte_for_byte_in_other_block_ids(dtype):
    layout = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, block_size=4, dtype=dtype)
    source, target = filled_cache(layout, 1), PagedKVCache(layout, 12, 0, CPU)
    exports = KVExports(source, lease_s=30)
    exports.add("r1", [4, 7, 2, 9])
    server = KVExportServer(exports, "127.0.0.1", 0, timeout_s=5)
    server.start()
    try:
        # the reader has the first block locally (a prefix hit): it asks from the second on
        scatter(target, [0, 1, 5], pull("127.0.0.1", server.port, "r1", layout, timeout_s=5, first_block=1))
        pairs = [(a, b) for la, lb in zip(source.layers, target.layers, strict=True)
                 for a, b in zip(la.tensors(), lb.tensors(), strict=True)]
        assert len(pairs) == (8 if layout.quantized else 4)  # K, V (and their scales) of both layers
        for a, b in pairs:
            assert torch.equal(a.view(torch.uint8)[[7, 2, 9]], b.view(torch.uint8)[[0, 1, 5]])
            assert not b.view(torch.uint8)[[2, 3, 4]].any()  # nothing else written
        assert poll(lambda: len(exports) == 0) and [t for t, _ in exports.done()] == ["r1"] and exports.done() == []
        with pytest.raises(KVTransferError, match="no KV exported under transfer id 'r1'"):
            pull("127.0.0.1", server.port, "r1", layout, timeout_s=5)
        exports.add("r2", [1])
        with pytest.raises(KVTransferError, match=r"the decode cache layout .* differs from the prefill"):
            pull("127.0.0.1", server.port, "r2", KVLayout(2, 2, 8, 8, dtype), timeout_s=5)
        assert len(exports) == 1  # a refused read acknowledges nothing
    finally:
        server.stop()


def test_a_lease_ends_an_unread_export():
    exports = KVExports(filled_cache(KVLayout(1, 1, 4, 2, torch.float32), 2), lease_s=0.05)
    exports.add("a", [0])
    exports.add("b", [1, 2])
    assert exports.read("a", 0) is not None
    assert poll(lambda: exports.read("a", 0) is None)  # the lease ended
    assert sorted(t for t, _ in exports.done()) == ["a", "b"] and len(exports) == 0


def test_a_heartbeat_restarts_the_leases_it_names_and_a_release_ends_them():
    exports = KVExports(filled_cache(KVLayout(1, 1, 4, 2, torch.float32), 3), lease_s=60)
    exports.add("a", [0])
    exports.add("b", [1])
    before = {t: e.expires_s for t, e in exports._exports.items()}
    server = KVExportServer(exports, "127.0.0.1", 0, timeout_s=5)
    server.start()
    try:
        assert lease_op("127.0.0.1", server.port, "extend", ["a", "gone"], timeout_s=5) == 1  # "gone": none such
        assert exports._exports["a"].expires_s > before["a"] and exports._exports["b"].expires_s == before["b"]
        assert lease_op("127.0.0.1", server.port, "release", ["b"], timeout_s=5) == 1  # its reader was aborted
        assert [t for t, _ in exports.done()] == ["b"] and len(exports) == 1
    finally:
        server.stop()


def test_a_silent_or_absent_peer_fails_within_the_deadline():
    layout = KVLayout(1, 1, 4, 2, torch.float32)
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        start = time.monotonic()
        with pytest.raises(KVTransferError, match=r"no answer within 0.3 s"):
            pull("127.0.0.1", silent.getsockname()[1], "r", layout, timeout_s=0.3)
        assert time.monotonic() - start < 2
        port = silent.getsockname()[1]
    with pytest.raises(KVTransferError, match=f"KV pull of 'r' from 127.0.0.1:{port}: "):
        pull("127.0.0.1", port, "r", layout, timeout_s=0.3)  # closed: refused at once
    with pytest.raises(KVTransferError, match=f"KV lease extend at 127.0.0.1:{port}: "):
        lease_op("127.0.0.1", port, "extend", ["r"], timeout_s=0.3)
