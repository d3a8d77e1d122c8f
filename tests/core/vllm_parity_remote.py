"""The remote-KV family of the vLLM parity harness (`vllm_parity`): `make_scenario`'s requests and settings, some of
them decode-side P/D requests (kv_transfer_params do_remote_prefill: their prompt's KV arrives a seeded number of
steps after they start loading) and some prefill-side ones (do_remote_decode, max_tokens 1: their blocks are held
until a seeded number of steps after they finish), driven through kvplan's core (`remote_kv`) and vLLM's real V1
scheduler with a minimal pull connector (`ParityConnector`: NIXL's scheduler-side rules, no transfer at all).

Each step also compares the requests holding blocks while they wait (kvplan's `remote.holding`, vLLM's
`kv_holding_waiting`), and the loads started and the transfers reported are each side's own: a side reports a
receive `recv_delay` steps after it saw the load start, and a send `send_delay` steps after the request finished.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from tests.core.vllm_parity import Arrival, KvplanSide, Scenario, StepRecord, VllmSide, make_scenario, sample_token

CONNECTOR_MODULE = "tests.core.vllm_parity_remote"


@dataclass(slots=True)
class RemoteScenario:
    base: Scenario
    role: dict[str, str] = field(default_factory=dict)  # request id -> "recv" (decode side) or "send" (prefill side)
    delay: dict[str, int] = field(default_factory=dict)  # request id -> steps until its transfer is reported


def make_remote_scenario(seed: int) -> RemoteScenario:
    s = make_scenario(seed)
    rng = random.Random(seed * 49979687 + 11)
    remote = RemoteScenario(s)
    for a in s.arrivals:
        roll = rng.random()
        if roll < 0.5:
            remote.role[a.request_id] = "recv"
        elif roll < 0.7:
            remote.role[a.request_id] = "send"
            a.max_tokens = 1  # the proxy's prefill request
        delay = rng.choice((0, 0, 1, 2, 3, 6))
        # a send is reported with a later step's output at the earliest (the worker sees the finish after it)
        remote.delay[a.request_id] = max(delay, 1) if remote.role.get(a.request_id) == "send" else delay
    return remote


def params_of(remote: RemoteScenario, request_id: str) -> dict[str, Any] | None:
    role = remote.role.get(request_id)
    if role is None:
        return None
    return {"do_remote_prefill": True} if role == "recv" else {"do_remote_decode": True}


@dataclass(slots=True)
class RemoteRecord:
    step: StepRecord
    holding: list[str]


class _Reports:
    """A side's transfer reports: what was seen at step k is reported after step k + delay's update."""

    def __init__(self, remote: RemoteScenario) -> None:
        self.remote = remote
        self.step = 0
        self.due: dict[int, tuple[list[str], list[str]]] = {}

    def saw(self, request_id: str, kind: int) -> None:
        at = self.step + self.remote.delay[request_id]
        self.due.setdefault(at, ([], []))[kind].append(request_id)

    def take(self) -> tuple[list[str], list[str]]:
        recv, send = self.due.pop(self.step, ([], []))
        self.step += 1
        return recv, send


class KvplanRemoteSide(KvplanSide):
    def __init__(self, remote: RemoteScenario) -> None:
        super().__init__(remote.base)
        self.remote = remote
        self.reports = _Reports(remote)

    def add(self, a: Arrival) -> None:
        from kvplan.engine.core import make_request

        request = make_request(a.request_id, prompt_token_ids=a.prompt, max_tokens=a.max_tokens,
                               arrival_s=float(a.step), kv_transfer_params=params_of(self.remote, a.request_id))
        if not self.sched.add_request(request):
            raise AssertionError(f"kvplan rejected {a.request_id}: {request.finish_reason}")

    def step(self) -> RemoteRecord:  # type: ignore[override]
        sched = self.sched
        waiting = {r.request_id for r in sched.waiting}
        out = sched.schedule()
        scheduled = {item.request_id: item.num_new_tokens for item in out.scheduled}
        hits = {item.request_id: item.start_pos for item in out.scheduled if item.request_id in waiting}
        free_mid = sched.kv.num_free_blocks
        sampled = [sample_token(item.request_id, item.request.num_output_tokens) if item.samples else None
                   for item in out.scheduled]
        result = sched.update(out, sampled)
        for load in out.kv_loads:
            self.reports.saw(load.request_id, 0)
        for rid in result.kv_sends:
            self.reports.saw(rid, 1)
        recv, send = self.reports.take()
        # as sets, built as vLLM's side builds its own: the same iteration order (the order sends free blocks in)
        sched.finished_recving(set(recv))
        sched.finished_sending(set(send))
        record = StepRecord(scheduled, hits, sorted(out.preempted), sorted(r.request_id for r in result.finished),
                            free_mid, sched.kv.num_free_blocks, [r.request_id for r in sched.running],
                            [r.request_id for r in sched.waiting])
        return RemoteRecord(record, [r.request_id for r in sched.remote.holding])


def _connector_base() -> type:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    return KVConnectorBase_V1


def __getattr__(name: str) -> Any:
    """`ParityConnector`, built on first use (importing this module must not import vLLM: kvplan's side runs
    without it)."""
    if name != "ParityConnector":
        raise AttributeError(name)
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
    from vllm.v1.request import RequestStatus as VStatus

    class ParityConnector(_connector_base()):  # type: ignore[misc]
        """NIXL's scheduler-side rules (vLLM 0.34 nixl/pull_scheduler.py), nothing moved: a do_remote_prefill
        request loads its prompt beyond the local hits asynchronously, once; a do_remote_decode request that
        finished by length keeps its blocks until the send is reported."""

        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            params = request.kv_transfer_params
            if params and params.get("do_remote_prefill"):
                return len(request.prompt_token_ids) - num_computed_tokens, True
            return 0, False

        def update_state_after_alloc(self, request, blocks, num_external_tokens):
            params = request.kv_transfer_params
            if params and params.get("do_remote_prefill"):
                params["do_remote_prefill"] = False

        def build_connector_meta(self, scheduler_output):
            return KVConnectorMetadata()

        def request_finished(self, request, block_ids):
            params = request.kv_transfer_params
            held = bool(params and params.get("do_remote_decode")
                        and request.status == VStatus.FINISHED_LENGTH_CAPPED)
            return held, None

        def start_load_kv(self, forward_context, **kwargs):
            return None

        def wait_for_layer_load(self, layer_name):
            return None

        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
            return None

        def wait_for_save(self):
            return None

    globals()["ParityConnector"] = ParityConnector
    return ParityConnector


class VllmRemoteSide(VllmSide):
    """vLLM's scheduler with `ParityConnector` (kv_role kv_both, as vLLM's P/D examples run both roles)."""

    def __init__(self, remote: RemoteScenario) -> None:
        from vllm.config import KVTransferConfig, VllmConfig

        self.remote = remote
        self.reports = _Reports(remote)
        original = VllmConfig.__init__

        def with_connector(config, *args, **kwargs):  # the parent builds its VllmConfig inline: add ours to it
            kwargs["kv_transfer_config"] = KVTransferConfig(kv_connector="ParityConnector", kv_role="kv_both",
                                                            kv_connector_module_path=CONNECTOR_MODULE)
            original(config, *args, **kwargs)

        VllmConfig.__init__ = with_connector  # type: ignore[method-assign]
        try:
            super().__init__(remote.base)
        finally:
            VllmConfig.__init__ = original  # type: ignore[method-assign]
        self.finished: set[str] = set()

    def add(self, a: Arrival) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        params = params_of(self.remote, a.request_id)
        sampling = SamplingParams(max_tokens=a.max_tokens, ignore_eos=True,
                                  extra_args={"kv_transfer_params": params} if params else None)
        self.sched.add_request(Request(a.request_id, list(a.prompt), sampling, None, arrival_time=float(a.step),
                                       block_hasher=self.hasher))

    def step(self) -> RemoteRecord:  # type: ignore[override]
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
        from vllm.v1.request import RequestStatus as VStatus

        sched = self.sched
        waiting = {r.request_id for r in sched.waiting}
        loading = {rid for rid, r in sched.requests.items() if r.status == VStatus.WAITING_FOR_REMOTE_KVS}
        out = sched.schedule()
        scheduled = dict(out.num_scheduled_tokens)
        hits = {rid: sched.requests[rid].num_computed_tokens - n for rid, n in scheduled.items() if rid in waiting}
        free_mid = self._free()
        for rid, r in sched.requests.items():
            if r.status == VStatus.WAITING_FOR_REMOTE_KVS and rid not in loading:
                self.reports.saw(rid, 0)
        ids = list(scheduled)
        sampled = []
        for rid in ids:
            request = sched.requests[rid]
            done = request.num_computed_tokens >= request.num_tokens
            sampled.append([sample_token(rid, request.num_output_tokens)] if done else [])
        recv, send = self.reports.due.get(self.reports.step, ([], []))
        # this step's own finishes are reported by their delay from now: 0 means with this very output
        kv_out = KVConnectorOutput(finished_recving=set(recv), finished_sending=set(send))
        sched.update_from_output(out, ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled,
                                                        kv_connector_output=kv_out))
        finished = sorted(rid for rid in ids if rid not in self.finished and (
            rid not in sched.requests or VStatus.is_finished(sched.requests[rid].status)))
        self.finished.update(finished)
        for rid in finished:
            if self.remote.role.get(rid) == "send":
                self.reports.saw(rid, 1)
        self.reports.take()
        record = StepRecord(scheduled, hits, sorted(out.preempted_req_ids), finished, free_mid, self._free(),
                            [r.request_id for r in sched.running], [r.request_id for r in sched.waiting])
        return RemoteRecord(record, [r.request_id for r in sched.kv_holding_waiting])


def run_remote(side: KvplanRemoteSide | VllmRemoteSide, remote: RemoteScenario) -> list[RemoteRecord]:
    from tests.core.vllm_parity import run_side

    return run_side(side, remote.base)  # type: ignore[arg-type,return-value]


def remote_difference(a: list[RemoteRecord], b: list[RemoteRecord]) -> str | None:
    """Where two runs first differ, in words; None when they are identical."""
    from tests.core.vllm_parity import first_difference

    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x.holding != y.holding:
            return f"step {i}: holding: kvplan {x.holding!r} != vLLM {y.holding!r}"
        step = first_difference([x.step], [y.step])
        if step is not None:
            return step.replace("step 0", f"step {i}", 1)
    return None if len(a) == len(b) else f"kvplan ran {len(a)} steps, vLLM {len(b)}"
