"""Prefill/decode disaggregation in the scheduler: vLLM 0.34 V1's remote-KV states (`v1/core/sched/scheduler.py`
with a pull connector such as NIXL), shared by the live engine and the simulator.

How a request is marked. `Request.kv_transfer_params` is vLLM's per-request dict, as its P/D proxy sends it:

* `{"do_remote_decode": True, ...}` - the prefill side's request (the proxy also sets max_tokens = 1). It runs as
  any request; when it finishes by its length (vLLM's FINISHED_LENGTH_CAPPED, the only case its NIXL connector
  delays) its blocks are NOT freed: the request is FINISHED, its blocks stay held (`sending`), and
  `UpdateOutput.kv_sends[request_id]` gives the block ids the decode side must read (the engine returns them in
  the response's kv_transfer_params, vLLM's `remote_block_ids`). `finished_sending([id])` frees them once the
  decode side has read them (vLLM frees them when its worker reports `finished_sending`: the read notification, or
  the lease expiring).
* `{"do_remote_prefill": True, ...}` - the decode side's request. At its admission from the head of the waiting
  queue (it needs a free sequence slot and token budget left, as any admission) it takes its local prefix-cache
  hits, then blocks for the rest of its prompt - the "external" tokens, vLLM's `get_num_new_matched_tokens` -
  computing nothing (vLLM: `allocate_slots` with `num_new_tokens = 0`), with the watermark to spare beside the
  blocks the running requests still mid-prompt need to hold their whole sequence (vLLM 0.34's
  `_inflight_prefill_reserved_blocks`: a load cannot be preempted, so it must not take what they will need). No
  room: it stays at the head and admissions end for the step. It then waits in WAITING_FOR_REMOTE_KVS, holding
  those blocks, counted among the waiting requests (the long-prefill cap's count included), and
  `SchedulerOutput.kv_loads` carries a `KVLoad` telling the engine what to receive into which blocks. The
  connector clears `do_remote_prefill` then (one transfer per request: a preempted request later recomputes
  locally). The engine reports the transfer done with `finished_recving([id])`; at a later `schedule()` the
  request's blocks are keyed in the prefix cache (vLLM delays caching them until the KV has arrived), its
  computed count is set to prompt - 1 (the last prompt token is recomputed to sample the first output token, as
  vLLM does) and it is admitted with that one token, the watermark asked of it, ahead of the waiting queue.

Order (vLLM's `kv_holding_waiting`): requests holding blocks while they wait are served first each step, in the
order they started their loads, each only while a sequence slot and budget are left (vLLM's loop checks them
before it looks at the next holder, so a received holder is not even promoted - its blocks not keyed - without
room); one still receiving is skipped; one received but refused ends the step's admissions, as the head of the
waiting queue does.

An abort while receiving keeps the blocks until `finished_recving` reports the transfer over (the remote side is
still writing them, vLLM's `_aborted_kv_loads`); an abort after it frees them at once.

Checked step for step against vLLM 0.34's scheduler with a pull connector that has NIXL's scheduler-side rules
(tests/core/vllm_parity_remote.py, run by scripts/vllm_parity.sh).

Differences from vLLM, kept out by rejection or documented: n > 1 and beam search with kv_transfer_params are
rejected (vLLM's P/D proxy sends n = 1); a load failure policy does not exist (transfers succeed); vLLM 0.34's
`max_num_inflight_kv_loads` cap (off by default) is not modelled; under the priority policy parked requests are
still served in the order their loads started; a recompute whose chunk ended one token short is not counted as
mid-prompt (`inflight_prefill_blocks`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from kvplan.engine.core.request import Request, RequestStatus

if TYPE_CHECKING:
    from kvplan.engine.core.kv_interface import PrefixHits
    from kvplan.engine.core.outputs import SchedulerOutput, UpdateOutput
    from kvplan.engine.core.scheduler import Scheduler

RECEIVING: Final[RequestStatus] = RequestStatus.WAITING_FOR_REMOTE_KVS


def wants_remote_prefill(request: Request) -> bool:
    """Whether `request` is a decode-side request whose prompt KV is still to be received."""
    params = request.kv_transfer_params
    return params is not None and bool(params.get("do_remote_prefill"))


def wants_remote_decode(request: Request) -> bool:
    """Whether `request` is a prefill-side request whose blocks a remote decode instance will read."""
    params = request.kv_transfer_params
    return params is not None and bool(params.get("do_remote_decode"))


@dataclass(slots=True)
class KVLoad:
    """A receive the engine starts (vLLM's connector metadata `reqs_to_recv`): tokens [first_token, prompt_len)
    of `request`'s prompt into `block_ids`, the request's blocks from the one holding `first_token` on (the blocks
    before it are local prefix-cache hits; `first_token` is a block multiple)."""

    request: Request
    first_token: int
    block_ids: list[int]

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_tokens(self) -> int:
        return self.request.prompt_len - self.first_token

    @property
    def kv_transfer_params(self) -> dict[str, Any]:
        """The proxy's parameters (the remote engine, its block ids): where to read from."""
        assert self.request.kv_transfer_params is not None  # a load exists only for such a request
        return self.request.kv_transfer_params


class RemoteKV:
    """The scheduler's remote-KV states (see the module), owned by one `Scheduler`.

    Invariants: `holding` lists, in load order, the live requests that hold blocks while not running - each
    RECEIVING, or WAITING once received and not yet admitted - and none of them is in `waiting`; `received` is the
    RECEIVING requests whose transfer is reported done; `sending` maps each finished prefill-side request still
    holding its blocks; `aborted_loads` the aborted requests whose blocks a transfer still writes."""

    __slots__ = ("aborted_loads", "holding", "received", "sched", "sending")

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.holding: list[Request] = []
        self.received: set[str] = set()
        self.sending: dict[str, Request] = {}
        self.aborted_loads: dict[str, Request] = {}

    # -- the engine's reports ------------------------------------------------------------------------------
    def finished_recving(self, request_ids: list[str] | set[str] | tuple[str, ...]) -> None:
        """Transfers into these requests' blocks are done (vLLM's `finished_recving`)."""
        for rid in request_ids:
            aborted = self.aborted_loads.pop(rid, None)
            if aborted is not None:
                self.sched.kv.free(aborted)
                continue
            request = self.sched.requests.get(rid)
            if request is None or request.status is not RECEIVING:
                raise ValueError(f"finished_recving: request {rid!r} is not waiting for remote KV")
            self.received.add(rid)

    def finished_sending(self, request_ids: list[str] | set[str] | tuple[str, ...]) -> None:
        """The decode side has read these finished requests' blocks: free them (vLLM's `finished_sending`)."""
        for rid in request_ids:
            request = self.sending.pop(rid, None)
            if request is None:
                raise ValueError(f"finished_sending: request {rid!r} holds no blocks for a remote decode")
            self.sched.kv.free(request)

    @property
    def pending(self) -> bool:
        """Whether anything waits on the engine's reports (a load, or blocks held for a remote decode)."""
        return bool(self.holding or self.sending or self.aborted_loads)

    # -- the scheduler's hooks -----------------------------------------------------------------------------
    def admission_due(self) -> bool:
        """Whether a holder could be admitted at the next step (received, or refused before): the decode fast
        path stops then. A holder still receiving changes only at the engine's report, an external event the
        caller bounds a stretch by, as it does arrivals."""
        return bool(self.received) or any(r.status is not RECEIVING for r in self.holding)

    def park(self, request: Request, out: SchedulerOutput, admitted: dict[str, int]) -> bool:
        """Admit the waiting queue's head, a remote-prefill request: blocks for its prompt beyond its prefix
        hits, then RECEIVING (see the module). False, changing nothing, when the blocks do not fit beside the
        blocks in-flight prefills still need (`inflight_prefill_blocks`; `admitted`: the requests admitted from
        the queue earlier in this step, with their tokens); the caller checked the sequence slot and budget,
        and pops the request from `waiting` on True."""
        sched = self.sched
        kv = sched.kv
        hits: PrefixHits = kv.find_cached_prefix(request)  # capped below the prompt: at least one token is external
        first = len(hits) * sched.block_size
        reserve = sched.admission_reserve() + self.inflight_prefill_blocks(admitted)
        copies = kv.allocate(request, request.prompt_len - first, hits, reserve)
        if copies is None:
            return False
        assert not copies, "a load's blocks follow block-aligned hits: nothing is shared to copy"
        kv.record_admission(request, len(hits))
        request.num_cached_tokens = first
        request.num_computed_tokens = request.prompt_len  # provisional, as vLLM sets it: nothing reads it yet
        assert request.kv_transfer_params is not None
        request.kv_transfer_params["do_remote_prefill"] = False  # the connector's: one transfer per request
        request.status = RECEIVING
        self.holding.append(request)
        ids: Any = kv.block_ids[request.request_id]  # (a list: a hybrid cache's, one per group, never loads)
        out.kv_loads.append(KVLoad(request, first, list(ids[first // sched.block_size:])))
        return True

    def inflight_prefill_blocks(self, admitted: dict[str, int]) -> int:
        """vLLM 0.34's reservation for an async load (`_inflight_prefill_reserved_blocks`): the blocks the
        running requests still mid-prompt need to hold their whole sequence (a parked load holds its prompt's
        already: none). Mid-prompt: admitted in this step with a chunk that ends short of its tokens, or, from an
        earlier step, its computed tokens short of its tokens - less the one token a request that sampled in its
        last step has pending. (A recompute whose chunk ended one token short looks like that too: vLLM counts
        it, this does not.)"""
        sched = self.sched
        bs, limit, ids = sched.block_size, sched.cache_config.max_model_len, sched.kv.block_ids
        total = 0
        for r in sched.running:
            n = admitted.get(r.request_id)
            pending = r.num_tokens - r.num_computed_tokens
            if (pending > n) if n is not None else (pending > (1 if r.num_output_tokens else 0)):
                total += max(0, -(-min(r.num_tokens, limit) // bs) - len(ids[r.request_id]))
        return total

    def admit_held(self, out: SchedulerOutput, budget: int) -> int | None:
        """Admit the received holders in load order (see the module): the budget left, or None when one was
        refused (admissions end for the step)."""
        sched = self.sched
        for request in list(self.holding):
            # (vLLM's loop checks the slot and budget before it looks at the next holder: a received one is not
            # promoted, its blocks not keyed, until there is room to admit it)
            if budget <= 0 or not sched.has_seq_room(request.seq_slots):
                return None
            if request.status is RECEIVING:
                rid = request.request_id
                if rid not in self.received:
                    continue
                self.received.discard(rid)
                self._promote(request)
            # vLLM asks the watermark of it even though its blocks are held (`allocate` would not: it needs none)
            reserve = sched.admission_reserve()
            copies = sched.kv.allocate(request, 1, None, reserve) if sched.kv.num_free_blocks >= reserve else None
            if copies is None:
                return None
            self.holding.remove(request)
            sched.start_running(request)
            budget -= 1
            sched.emit(out, request, 1, copies, request.num_cached_tokens)
        return budget

    def _promote(self, request: Request) -> None:
        """vLLM's `_update_waiting_for_remote_kv`: key the received blocks, recompute the last prompt token."""
        sched = self.sched
        if sched.keys_wanted:
            sched.kv.commit(request, request.prompt_len)
        request.num_computed_tokens = request.prompt_len - 1
        request.status = RequestStatus.WAITING

    def hold_finished(self, request: Request, reason: str, result: UpdateOutput | None) -> bool:
        """At a request's finish: keep its blocks for a remote decode (True) when it is a prefill-side request
        that finished by length (vLLM's NIXL rule); the caller frees them otherwise."""
        if reason != "length" or not wants_remote_decode(request):
            return False
        rid = request.request_id
        self.sending[rid] = request
        if result is not None:
            ids: Any = self.sched.kv.block_ids[rid]  # (a list, as above)
            result.kv_sends[rid] = list(ids)
        return True

    def abort(self, request: Request) -> None:
        """Drop an aborted holder; while a transfer still writes its blocks they wait in `aborted_loads` for
        `finished_recving` (the caller frees the blocks of any other)."""
        self.holding.remove(request)
        rid = request.request_id
        if request.status is RECEIVING and rid not in self.received:
            self.aborted_loads[rid] = request
        self.received.discard(rid)
