"""The prefill side of a disaggregated request on the live engine (vLLM's NIXL pull scheduler, prefill half).

A request whose `kv_transfer_params` say `do_remote_decode: true` runs as any other (the proxy sends it with
max_tokens 1). When it finishes, its KV blocks are staged (`transport.KVExports`) and its output carries the
`kv_transfer_params` a decode instance needs - the keys vLLM 0.34's pull scheduler returns: `do_remote_prefill`,
`remote_block_ids`, `remote_engine_id`, `remote_request_id`, `remote_host`, `remote_port`, `tp_size`, `pp_size`,
`remote_num_tokens`, `remote_blocks_expiry_time` (Unix time), `transfer_mode` "pull".

The block ids are read before the step's `scheduler.update` (which frees a finished request's blocks) and the
blocks copied right after it, before the next forward can write them.
"""

from __future__ import annotations

import time

from kvplan.engine.core.outputs import SchedulerOutput
from kvplan.engine.kv_cache import PagedKVCache
from kvplan.engine.kv_transfer.config import KVTransferConfig
from kvplan.engine.kv_transfer.transport import KVExports, KVExportServer, KVTransferError, gather
from kvplan.errors import UserError

TP_SIZE = 1  # the live engine runs one device per instance (engine.core.settings.SHAPE_SETTINGS)


def remote_decode(params: object, config: KVTransferConfig | None) -> bool:
    """Whether a request's `kv_transfer_params` ask this instance to prefill for a remote decode; a UserError
    (the HTTP layer's 400) for params this instance cannot honour."""
    if params is None:
        return False
    if not isinstance(params, dict):
        raise UserError(f"kv_transfer_params: {type(params).__name__} is not an object; allowed: an object with "
                        "do_remote_decode / do_remote_prefill")
    if params.get("do_remote_prefill"):
        raise UserError("kv_transfer_params.do_remote_prefill: decoding from a remote prefill's KV needs the "
                        "scheduler's remote-KV states, which this build of the live engine lacks; allowed: "
                        "do_remote_decode (this instance prefills)")
    if not params.get("do_remote_decode"):
        return False
    if config is None or not config.is_producer:
        role = "no --kv-transfer-config" if config is None else f"kv_role {config.kv_role}"
        raise UserError(f"kv_transfer_params.do_remote_decode: this instance has {role}; allowed on an instance "
                        "started with kv_role kv_producer or kv_both")
    return True


class KVProducer:
    """Stages finished remote-decode requests' KV and serves it on `config.kv_port` (loopback)."""

    def __init__(self, config: KVTransferConfig, cache: PagedKVCache, host: str = "127.0.0.1") -> None:
        self.config, self.cache = config, cache
        capacity = cache.num_blocks * cache.layout.bytes_per_block
        self.exports = KVExports(config.kv_lease_duration_s, capacity)
        try:
            self.server = KVExportServer(self.exports, cache.layout, host, config.kv_port,
                                         config.transfer_timeout_s)
        except OSError as exc:
            raise UserError(f"--kv-transfer-config: kv_port {config.kv_port}: cannot listen on {host} "
                            f"({exc.strerror}); allowed: a free port (each prefill instance needs its own)") from None
        self.server.start()
        self.wanted: set[str] = set()  # request ids whose KV goes to a remote decode
        self._blocks: dict[str, list[int]] = {}

    def before_update(self, out: SchedulerOutput) -> None:
        """Remember the blocks of this step's remote-decode requests (a finishing one loses them in update)."""
        for item in out.scheduled:
            if item.request_id in self.wanted:
                self._blocks[item.request_id] = list(item.block_ids)

    def finished(self, request_id: str, num_tokens: int) -> dict | None:
        """Stage a finished remote-decode request's KV; its `kv_transfer_params` (None when staging is refused:
        the staging capacity is full, or the cache is windowed)."""
        self.wanted.discard(request_id)
        blocks = self._blocks.pop(request_id, None)
        if blocks is None:
            return None
        try:
            expires = self.exports.add(request_id, gather(self.cache, blocks))
        except KVTransferError:
            return None
        return {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": blocks,
                "remote_engine_id": self.config.engine_id, "remote_request_id": request_id,
                "remote_host": self.server.host, "remote_port": self.server.port, "tp_size": TP_SIZE, "pp_size": 1,
                "remote_num_tokens": num_tokens, "remote_blocks_expiry_time": time.time() + expires - time.monotonic(),
                "transfer_mode": "pull"}

    def aborted(self, request_id: str) -> None:
        self.wanted.discard(request_id)
        self._blocks.pop(request_id, None)

    def close(self) -> None:
        self.server.stop()
