"""The KV transfer of a disaggregated deployment: how many bytes a request's prompt KV is, per rank, and how long
it takes over the link from its prefill instance to its decode instance.

Bytes (the model's real layout, `ModelSpec.kv_bytes_per_token`, in the run's KV dtype): NIXL reads whole blocks,
so a load of b blocks moves b x block_size tokens per rank. Each decode rank reads its KV from one prefill rank
(`Disaggregation.tp`: decode TP = k x prefill TP):

* GQA/MHA: a decode rank holds max(1, H_kv / TP_d) heads and reads them; a prefill rank serves k decode ranks, so
  it sends k x that - all of its own heads unless the decode side replicates them (TP_d > H_kv);
* MLA: the latent is whole on every rank: each of the TP_d decode ranks reads all of it, a prefill rank sends it
  k times.

Ranks move their shares in parallel, each over its own GPU's link, so a transfer takes latency + the busiest
rank's bytes / the per-GPU bandwidth; the busiest is a prefill rank (it sends k shares, k >= 1) - unless the
pools have different pipeline stages: a rank holds its stage's layers, and a decode rank of fewer stages than the
prefill side reads more layers than any one prefill rank sends.

Time (`KVLink`): a decode instance's ingress is `concurrency` first-come-first-served lanes (`links.Link`), each
at bandwidth / concurrency; a transfer takes the lane free first, waits for it, then holds it for latency +
blocks x seconds per block. Concurrency 1 is one transfer at a time at the full bandwidth.

Default link figures: the hardware table's per-GPU bandwidth (the decode pool's; nvlink: `link_bandwidth`, rdma:
`internode_bandwidth`) times the fraction transfers achieve - NVLink 4: ~378 of 450 GB/s one direction measured
with p2pBandwidthLatencyTest (NVIDIA/nccl issue #1264), 0.84; RDMA: Mooncake's transfer engine, 87 GB/s on 4 x 200
Gb/s RoCE (kvcache-ai/Mooncake README), 0.87. Latency per transfer, hand-set: 20 us over RDMA (`links`'s
per-fetch figure), 5 us over NVLink. A user's --kv-link-bandwidth is taken as achieved. Not modelled yet: the
per-descriptor cost of fragmented transfers and the first-contact handshake (docs: notes-issue49-research.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvplan.errors import UserError
from kvplan.sim.links import NETWORK_LATENCY_S, Link
from kvplan.sim.pd_spec import Disaggregation
from kvplan.sim.specs.arch import ModelSpec
from kvplan.sim.specs.hardware import get_hardware
from kvplan.sim.specs.profiles import PROFILED_DEVICES

if TYPE_CHECKING:
    from kvplan.sim.spec import SimSpec

ACHIEVED = {"nvlink": 0.84, "rdma": 0.87}  # see the module
LATENCY_S = {"nvlink": 5e-6, "rdma": NETWORK_LATENCY_S}


def rank_bytes_per_token(model: ModelSpec, kv_dtype_bytes: float | None, prefill_tp: int, decode_tp: int,
                         prefill_pp: int = 1, decode_pp: int | None = None) -> tuple[float, float]:
    """(bytes a decode rank reads, bytes the busiest rank moves) per token of a load (see the module). With the
    pools' own pipeline stages (decode_pp: prefill_pp's when None), a rank holds its stage's layers: a prefill
    rank sends its layers' shares to k decode ranks, a decode rank reads its own layers' share; the busiest is
    the larger (a decode rank with fewer stages than the prefill side reads more than any prefill rank sends)."""
    decode_pp = prefill_pp if decode_pp is None else decode_pp
    per_decode_rank = model.kv_bytes_per_token(kv_dtype_bytes, decode_tp, decode_pp)
    sent = model.kv_bytes_per_token(kv_dtype_bytes, decode_tp, prefill_pp) * (decode_tp // prefill_tp)
    return per_decode_rank, max(sent, per_decode_rank)


def model_layout(spec: SimSpec) -> tuple[ModelSpec, float | None]:
    """The run's model and its KV bytes per element (None: the model's own dtype), as a cost measured on one
    device leaves them: the model's layout in the run's KV cache dtype (an analytic cost carries its own)."""
    from kvplan.sim.specs.models import DTYPE_BYTES, get_model, sim_kv_dtype

    kv_dtype = sim_kv_dtype(spec.kv_cache_dtype)
    return get_model(spec.model), None if kv_dtype is None else DTYPE_BYTES[kv_dtype]


def link_figures(pd: Disaggregation, prefill_hardware: str, decode_hardware: str) -> tuple[float, float]:
    """(achieved bytes/s per GPU, latency s) of the KV link between the pools' hardware (see the module); a
    profiled device (`cpu-local`: this machine, through a calibrated profile) has no table entry, so its link
    is given (`kvplan validate` measures this machine's)."""
    if pd.kv_link == "nvlink" and prefill_hardware != decode_hardware:
        raise UserError(f"--kv-link: nvlink joins GPUs of one node, and the pools run on {prefill_hardware} and "
                        f"{decode_hardware}; allowed: rdma, or one hardware for both pools")
    latency = LATENCY_S[pd.kv_link] if pd.kv_link_latency_ms is None else pd.kv_link_latency_ms / 1e3
    if pd.kv_link_bandwidth is not None:
        return pd.kv_link_bandwidth, latency
    for name in (prefill_hardware, decode_hardware):
        if name in PROFILED_DEVICES:
            raise UserError(f"--kv-link-bandwidth: needed with {name} (this machine, through a calibrated profile: "
                            "the hardware table has no link for it); allowed: --kv-link-bandwidth BYTES_PER_S "
                            "(and --kv-link-latency-ms; `kvplan validate --prefill-replicas 1 --decode-replicas 1` "
                            "measures this machine's)")
    prefill_hw, decode_hw = get_hardware(prefill_hardware), get_hardware(decode_hardware)
    raw = min(getattr(hw, "link_bandwidth" if pd.kv_link == "nvlink" else "internode_bandwidth")
              for hw in (prefill_hw, decode_hw))
    if raw <= 0:
        raise UserError(f"--kv-link: {pd.kv_link}: the hardware table gives {prefill_hw.name} / {decode_hw.name} no "
                        f"{pd.kv_link} bandwidth; allowed: --kv-link-bandwidth BYTES_PER_S, or the other link")
    return raw * ACHIEVED[pd.kv_link], latency


@dataclass(slots=True)
class KVLink:
    """One decode instance's ingress (see the module): `lanes` FIFO lanes of one block-time each."""

    seconds_per_block: float  # per lane: the busiest rank's block bytes / (bandwidth / lanes)
    latency_s: float
    concurrency: int
    lanes: list[Link] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lanes = [Link(self.seconds_per_block, self.latency_s) for _ in range(self.concurrency)]

    def transfer(self, now: float, blocks: int) -> float:
        """When a transfer of `blocks` asked for at `now` is over: on the lane free first (lowest index of equal)."""
        lane = min(self.lanes, key=lambda link: max(link.busy_until, now))
        lane.fetch(now, blocks)
        return lane.busy_until


def make_link(pd: Disaggregation, bandwidth: float, latency_s: float, busiest_block_bytes: float) -> KVLink:
    lane_bandwidth = bandwidth / pd.kv_link_concurrency
    return KVLink(busiest_block_bytes / lane_bandwidth, latency_s, pd.kv_link_concurrency)
