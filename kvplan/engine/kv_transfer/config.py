"""`--kv-transfer-config`: vLLM 0.34's `KVTransferConfig` JSON, parsed once into `KVTransferConfig`.

The field names, defaults and checks mirror vLLM 0.34.0 (vllm/config/kv_transfer.py). The transports are kvplan's
own (two processes on one machine, KV bytes over a loopback TCP socket); each connector name kvplan accepts follows
one vLLM connector's semantics:

- `NixlConnector` and `NixlPullConnector` (in vLLM 0.34 the first is an alias of the second): pull. The prefill
  instance finishes the request (one sampled token, discarded by the proxy), keeps its KV for the lease
  (`kv_connector_extra_config.kv_lease_duration`, vLLM's 30 s) and answers with `kv_transfer_params` naming where
  the KV is; the decode instance allocates blocks, reads the prefill side's blocks into them, tells the prefill
  side it is done (the prefill side then frees them), and recomputes only the last prompt token.

The KV always crosses host memory here (`kv_buffer_device` is accepted as `cuda` or `cpu` and changes nothing:
vLLM NIXL's `cpu` means a host staging buffer). `kv_port` is where a prefill instance serves its KV (loopback).

Every other name vLLM 0.34 registers is refused with a line saying kvplan does not implement it; a name vLLM 0.34
does not have is refused with the allowed names. Like vLLM's NIXL connector, kvplan's roles are placeholders for
who serves which side: each request's `kv_transfer_params` decides (`do_remote_decode`: this instance prefills;
`do_remote_prefill`: this instance decodes); `kv_producer` refuses requests that ask it to decode from remote KV,
`kv_consumer` refuses requests that ask it to keep KV for a remote decode, `kv_both` takes both.

This module imports only the standard library and kvplan's leaves: the simulator may read the same setting.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field

from kvplan.errors import UserError, listed, short_repr
from kvplan.strict_json import loads, why

FLAG = "--kv-transfer-config"
VLLM_VERSION = "0.34.0"  # the vLLM whose KVTransferConfig and connector registry this mirrors

# the connectors kvplan implements -> the vLLM connector whose semantics it follows
IMPLEMENTED = {"NixlConnector": "NixlPullConnector", "NixlPullConnector": "NixlPullConnector"}
# every name vLLM 0.34.0 registers (kv_connector/factory.py) that kvplan does not implement
NOT_IMPLEMENTED = ("ExampleConnector", "ExampleHiddenStatesConnector", "LMCacheConnectorV1", "LMCacheMPConnector",
                   "NixlPushConnector", "MultiConnector", "HiSparseConnector", "MoRIIOConnector",
                   "OffloadingConnector", "DecodeBenchConnector", "MooncakeConnector", "MooncakeStoreConnector",
                   "UMBPStoreConnector", "FlexKVConnectorV1", "SimpleCPUOffloadConnector", "HF3FSKVConnector")
# removed from vLLM before 0.34 (present around 0.10-0.11): named so that an old command line gets a clear line
REMOVED_CONNECTORS = ("P2pNcclConnector", "SharedStorageConnector", "PyNcclConnector", "LMCacheConnector",
                      "MooncakeStoreConnectorV1")
ROLES = ("kv_producer", "kv_consumer", "kv_both")
PRODUCERS = ("kv_producer", "kv_both")  # vLLM's KVProducer set: may keep KV for a remote decode
CONSUMERS = ("kv_consumer", "kv_both")  # vLLM's KVConsumer set: may decode from remote KV
BUFFER_DEVICES = ("cuda", "cpu")  # vLLM also has xpu; kvplan's engine runs on CUDA or the CPU
LOAD_FAILURE_POLICIES = ("fail",)  # vLLM also has "recompute"; the shared core has no recompute-after-failure path
DEFAULT_KV_PORT = 14579  # vLLM's kv_port default
FIELDS = ("kv_connector", "engine_id", "kv_buffer_device", "kv_role", "kv_port", "kv_connector_extra_config",
          "kv_connector_module_path", "enable_permute_local_kv", "kv_load_failure_policy")
REMOVED_FIELDS = ("kv_rank", "kv_parallel_size", "kv_ip", "kv_buffer_size")  # in vLLM ~0.10, absent in 0.34
# kv_connector_extra_config keys: vLLM NIXL's lease, and kvplan's own transfer deadline
LEASE_DEFAULT_S = 30.0  # vLLM 0.34 nixl/base_scheduler.py kv_lease_duration
TRANSFER_TIMEOUT_DEFAULT_S = 10.0  # kvplan: one pull, connect to last byte, on one machine
EXTRA_KEYS = {"kv_lease_duration": LEASE_DEFAULT_S, "transfer_timeout": TRANSFER_TIMEOUT_DEFAULT_S}
MAX_SECONDS = 3600.0


@dataclass(frozen=True, slots=True)
class KVTransferConfig:
    """A checked `--kv-transfer-config`: every field vLLM 0.34 has, with its default."""

    kv_connector: str
    kv_role: str
    engine_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    kv_buffer_device: str = "cuda"
    kv_port: int = DEFAULT_KV_PORT
    kv_load_failure_policy: str = "fail"
    kv_lease_duration_s: float = LEASE_DEFAULT_S  # the prefill side keeps a request's KV this long for its reader
    transfer_timeout_s: float = TRANSFER_TIMEOUT_DEFAULT_S  # one pull may take this long before it is a failure

    @property
    def is_producer(self) -> bool:
        return self.kv_role in PRODUCERS

    @property
    def is_consumer(self) -> bool:
        return self.kv_role in CONSUMERS

    @property
    def semantics(self) -> str:
        """The vLLM connector whose semantics this one follows."""
        return IMPLEMENTED[self.kv_connector]


def parse_kv_transfer_config(text: str, where: str = FLAG) -> KVTransferConfig:
    """The JSON text of `--kv-transfer-config`, checked field by field; a UserError names the key and what is
    allowed."""
    try:
        doc = loads(text)
    except ValueError as exc:
        raise UserError(f"{where}: not valid JSON ({why(exc)}); allowed: a JSON object such as "
                        '\'{"kv_connector":"NixlConnector","kv_role":"kv_both"}\'') from None
    if not isinstance(doc, dict):
        raise UserError(f"{where}: {short_repr(doc)} is not a JSON object; allowed: an object with the keys "
                        f"{listed(FIELDS)}")
    return from_mapping(doc, where)


def from_mapping(doc: dict, where: str = FLAG) -> KVTransferConfig:
    """A mapping of vLLM's KVTransferConfig fields (JSON or YAML) -> the checked config."""
    for key in doc:
        if key in REMOVED_FIELDS:
            raise UserError(f"{where}: {key} was removed from vLLM's KVTransferConfig before {VLLM_VERSION}; "
                            f"allowed keys: {listed(FIELDS)}")
        if key not in FIELDS:
            raise UserError(f"{where}: unknown key {short_repr(key)}; allowed keys (vLLM {VLLM_VERSION}): "
                            f"{listed(FIELDS)}")
    connector = doc.get("kv_connector")
    if connector is None:
        raise UserError(f"{where}: kv_connector is missing; allowed: {listed(IMPLEMENTED)}")
    _connector(connector, where)
    role = doc.get("kv_role")
    if role is None:  # vLLM: "Please specify kv_role when kv_connector is set"
        raise UserError(f"{where}: kv_role is missing (vLLM requires it when kv_connector is set); allowed: "
                        f"{', '.join(ROLES)}")
    if role not in ROLES:
        raise UserError(f"{where}: kv_role {short_repr(role)} is not a vLLM role; allowed: {', '.join(ROLES)}")
    if doc.get("kv_connector_module_path") is not None:
        raise UserError(f"{where}: kv_connector_module_path loads an out-of-tree vLLM connector class, which "
                        "kvplan cannot run; allowed: null (leave it out)")
    if doc.get("enable_permute_local_kv", False) is not False:
        raise UserError(f"{where}: enable_permute_local_kv: kvplan's prefill and decode caches share one layout, "
                        "so there is nothing to permute; allowed: false")
    device = doc.get("kv_buffer_device", "cuda")
    if device not in BUFFER_DEVICES:
        raise UserError(f"{where}: kv_buffer_device {short_repr(device)}; allowed: {', '.join(BUFFER_DEVICES)}")
    policy = doc.get("kv_load_failure_policy", "fail")
    if policy == "recompute":
        raise UserError(f"{where}: kv_load_failure_policy recompute (vLLM's local recompute after a failed load) is "
                        "not modelled by kvplan's scheduler; allowed: fail")
    if policy not in LOAD_FAILURE_POLICIES:
        raise UserError(f"{where}: kv_load_failure_policy {short_repr(policy)} is not a vLLM policy; allowed: fail")
    port = doc.get("kv_port", DEFAULT_KV_PORT)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise UserError(f"{where}: kv_port {short_repr(port)}; allowed: an integer port in [1, 65535]")
    engine_id = doc.get("engine_id")
    if engine_id is not None and (not isinstance(engine_id, str) or not engine_id):
        raise UserError(f"{where}: engine_id {short_repr(engine_id)}; allowed: a non-empty string (default: a "
                        "random uuid4, as vLLM)")
    extra = _extra(doc.get("kv_connector_extra_config", {}), where)
    fields: dict = {} if engine_id is None else {"engine_id": engine_id}
    return KVTransferConfig(connector, role, kv_buffer_device=device, kv_port=port, kv_load_failure_policy=policy,
                            kv_lease_duration_s=extra["kv_lease_duration"],
                            transfer_timeout_s=extra["transfer_timeout"], **fields)


def _connector(name: object, where: str) -> None:
    if name in IMPLEMENTED:
        return
    allowed = listed(IMPLEMENTED)
    if name in NOT_IMPLEMENTED:
        raise UserError(f"{where}: kv_connector {name} is a vLLM {VLLM_VERSION} connector that kvplan's live engine "
                        f"does not implement; allowed: {allowed}")
    if name in REMOVED_CONNECTORS:
        raise UserError(f"{where}: kv_connector {name} is not registered in vLLM {VLLM_VERSION} (removed or "
                        f"renamed); allowed: {allowed}")
    raise UserError(f"{where}: kv_connector {short_repr(name)} is not a vLLM {VLLM_VERSION} connector; allowed: "
                    f"{allowed}")


def _extra(extra: object, where: str) -> dict[str, float]:
    """kv_connector_extra_config: the lease and the transfer deadline, in seconds, each in (0, MAX_SECONDS]."""
    key = f"{where}: kv_connector_extra_config"
    if not isinstance(extra, dict):
        raise UserError(f"{key}: {short_repr(extra)} is not an object; allowed: an object with the keys "
                        f"{listed(EXTRA_KEYS)}")
    out = dict(EXTRA_KEYS)
    for name, value in extra.items():
        if name not in EXTRA_KEYS:
            raise UserError(f"{key}: unknown key {short_repr(name)}; allowed: {listed(EXTRA_KEYS)}")
        if (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
                or not 0 < value <= MAX_SECONDS):
            raise UserError(f"{key}.{name}: {short_repr(value)}; allowed: seconds in (0, {MAX_SECONDS:g}]")
        out[name] = float(value)
    return out


def check_tp_pair(prefill_tp: int, decode_tp: int, where: str) -> None:
    """vLLM <= 0.12's NIXL rule, which the issue keeps: each decode rank reads from one prefill rank, so the
    decode TP must be a multiple of the prefill TP (`tp_ratio = decode_tp // prefill_tp > 0`); a decode TP smaller
    than the prefill TP is refused. (vLLM 0.34 also reads several prefill ranks per decode rank; kvplan does not.)"""
    if decode_tp < prefill_tp or decode_tp % prefill_tp:
        raise UserError(f"{where}: decode tensor_parallel_size {decode_tp} with prefill tensor_parallel_size "
                        f"{prefill_tp}; allowed: a decode TP that is a multiple of the prefill TP (at least "
                        f"{prefill_tp})")
