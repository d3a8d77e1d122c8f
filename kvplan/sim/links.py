"""The links prefix-tier transfers cross, and how a step with promotions is priced over them.

Each tier is reached over its own link:

* `cpu`: the GPU's host link (PCIe, or NVLink-C2C), one per GPU - `HardwareSpec.host_link_bandwidth`;
* `disk`: the local NVMe drive, then the host link, pipelined - the slower of the two (`disk_bandwidth`);
* `shared`: the node's network to the cluster-shared store (Mooncake Store's RDMA transfer engine) - all the
  node's NICs, `internode_bandwidth` per GPU times `gpus_per_node` (one 200 Gb/s HDR adapter per A100 = 25 GB/s,
  one 400 Gb/s ConnectX-7 per H100/H200 = 50 GB/s: the DGX user guides, `sim.specs.hardware`), shared by every
  replica on the node, plus `NETWORK_LATENCY_S` per fetch.

How concurrent transfers share a link, simply: the host link and the drive serve one replica whose steps run one
after another, so its promotions never overlap there and cost blocks x bytes / bandwidth inside the step (as
before this module). The node's network is one FIFO `Link` with a busy-until clock: a replica's fetch starts when
the link is free of the fetches other replicas of the node asked for earlier, so replicas that fetch at once
queue behind each other (together they get the link's bandwidth, as a fair split would give them in total).
Stores (a demotion, or write-through) are asynchronous, as LMCache's and vLLM's offloading stores are: they
never delay the step that made them, but a store into the shared store holds the node's link for its bytes from
the time its step starts (`Link.reserve`), so a fetch asked for while the link carries stores waits behind them.
The local tiers' stores hold nothing: their links are the replica's own, and its steps never wait on them.

Layer-wise loading (`kv_offloading_layerwise`, LMCache's layer-wise KV connector): a promotion's copy overlaps
the step's compute layer by layer, so the step costs max(copy, compute) + one layer's copy instead of the sum.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, cast

from kvplan.engine.core.config import CacheConfig
from kvplan.engine.core.prefix_tiers import PrefixTier
from kvplan.errors import UserError
from kvplan.sim.cost import CostModel, StepLaw, step_parts
from kvplan.sim.shared_store import SharedView, StoreQueue
from kvplan.sim.specs.arch import ModelSpec
from kvplan.sim.specs.models import get_model

if TYPE_CHECKING:
    import simpy

    from kvplan.sim.cost.analytic import AnalyticCost
    from kvplan.sim.replica import Replica

# Per fetch from the shared store: an RDMA READ is ~2-5 us on ConnectX NICs (perftest's ib_read_lat), and
# Mooncake's transfer engine first looks the keys up in its metadata service and submits a batch; 20 us in all,
# hand-set (no published per-fetch figure for the store).
NETWORK_LATENCY_S = 20e-6
# A box the hardware table gives no network (the rtx-4090, one GPU): a 25 GbE NIC, hand-set.
UNLISTED_NIC_BANDWIDTH = 25e9 / 8


@dataclass(slots=True)
class Link:
    """A link that carries one transfer at a time, first come first served: a transfer asked for at `now` starts
    at max(now, busy_until) and holds the link for latency + blocks x seconds_per_block. `busy_until` never
    decreases; `blocks` counts what it carried."""

    seconds_per_block: float
    latency_s: float = 0.0
    busy_until: float = 0.0
    blocks: int = 0

    def fetch(self, now: float, blocks: int) -> float:
        """Seconds from `now` until `blocks` have crossed (waiting for the link included)."""
        end = max(now, self.busy_until) + self.latency_s + blocks * self.seconds_per_block
        self.busy_until = end
        self.blocks += blocks
        return end - now

    def reserve(self, when: float, blocks: int) -> None:
        """Hold the link for an asynchronous store of `blocks` made at `when`: nobody waits for it, but what is
        asked for later queues behind it (stores are pipelined: no per-store latency)."""
        self.busy_until = max(when, self.busy_until) + blocks * self.seconds_per_block
        self.blocks += blocks


@dataclass(slots=True)
class TierPricing:
    """How one replica's steps with promotions are priced: the local tiers' copies from the cost model, the
    shared tier's over its node's `network` link, overlapped with compute layer by layer when `layers` > 0."""

    network: Link | None = None
    layers: int = 0  # layer-wise loading: the model's layers (0: off, the copy precedes the compute)

    def step_seconds(self, cost: CostModel, step, start: float, block_size: int, attended_limit: int = 0,
                     window: int = 0, law: StepLaw | None = None) -> float:
        compute, transfers, copy = step_parts(cost, step, block_size, attended_limit, window, law)
        shared = sum(1 for tier, _ in step.promotions if tier == "shared")
        if shared:
            assert self.network is not None  # `wire_tiers` gives a link to every replica with a shared tier
            copy += self.network.fetch(start, shared)
        if self.layers and copy and compute:
            return transfers + max(compute, copy) + copy / self.layers
        return compute + transfers + copy


def network_link(cost: CostModel, replicas: int) -> tuple[Link, int]:
    """A node's link to the shared store for this cost model, and how many replicas share one node: the node's
    GPUs over one replica's (a calibrated profile measured one device: its swap cost per block, every replica on
    one node, a lower bound)."""
    hardware, shape = getattr(cost, "hardware", None), getattr(cost, "shape", None)
    if hardware is None or shape is None:  # (a recorded cost prices steps by id: a live run has no shared store)
        return Link(getattr(cost, "swap_seconds_per_block", 0.0)), replicas
    node = hardware.internode_bandwidth * hardware.gpus_per_node or UNLISTED_NIC_BANDWIDTH
    # every rank fetches its share over the node's NICs (a cost model naming its hardware and shape is analytic)
    per_block = cast("AnalyticCost", cost).bytes_per_block * shape.gpus
    return Link(per_block / node, NETWORK_LATENCY_S), max(hardware.gpus_per_node // shape.gpus, 1)


def block_bytes(cost: CostModel, block_size: int) -> float | None:
    """KV bytes of one block of one replica (every rank's share), or None when the cost model does not say."""
    shape = getattr(cost, "shape", None)
    if shape is not None and hasattr(cost, "bytes_per_block"):
        return cost.bytes_per_block * shape.gpus
    model = profiled_model(cost)
    return None if model is None else model.kv_bytes_per_token() * block_size


def model_layers(cost: CostModel) -> int:
    """The model's layers, for layer-wise loading (1 when the cost model does not name its model)."""
    model = getattr(cost, "model", None) or profiled_model(cost)
    return 1 if model is None else model.num_layers


def profiled_model(cost: CostModel) -> ModelSpec | None:
    """The spec of the model a calibrated profile names, or None (no name, or one this checkout has no spec of)."""
    name = getattr(cost, "meta", {}).get("model")
    try:
        return get_model(name) if name else None
    except UserError:
        return None


def without_shared(cache: CacheConfig) -> CacheConfig:
    """A replica's own cache config: the cluster's shared tier is built once (`wire_tiers`), not per replica."""
    return replace(cache, kv_shared_blocks=0) if cache.kv_shared_blocks else cache


def clock_of(env: simpy.Environment) -> Callable[[], float]:
    """The simulated time of `env`, as a function of nothing (a shared view's clock)."""
    return lambda: env.now


def wire_tiers(replicas: list[Replica], cache: CacheConfig, cost: CostModel, layerwise: bool) -> PrefixTier | None:
    """Build the cluster's one shared store (when `cache.kv_shared_blocks`), put a view of it under each
    replica's local tiers, give the replicas of a node one network link to it, and set each replica's step
    pricing and block bytes. Returns the store (None without one)."""
    layers = model_layers(cost) if layerwise else 0
    shared, links, per_node, queue = None, [], 1, StoreQueue()
    if cache.kv_shared_blocks:
        shared = PrefixTier("shared", cache.kv_shared_blocks, cache.block_size, cache.kv_shared_eviction)
        link, per_node = network_link(cost, len(replicas))
        links = [replace(link) for _ in range(-(-len(replicas) // per_node))]
    size = block_bytes(cost, cache.block_size)
    for replica in replicas:
        replica.block_bytes = size
        if shared is not None:
            replica.shared_view = SharedView(shared, queue, clock_of(replica.env), links[replica.index // per_node])
            replica.sched.kv.share_tier(replica.shared_view)
        if shared is not None or (layers and replica.sched.kv.tiers):
            replica.pricing = TierPricing(links[replica.index // per_node] if links else None, layers)
    return shared
