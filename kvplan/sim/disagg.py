"""A disaggregated deployment simulated: prefill replicas and decode replicas behind vLLM's P/D proxy, in one
SimPy environment, each replica the shared core (`engine.core.remote_kv`) priced by its pool's cost model.

A request's path, as vLLM's toy proxy drives it (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py):

1. at its arrival the proxy sends it to a prefill replica (the prefill router) with max_tokens = 1 and
   kv_transfer_params do_remote_decode; the replica prefills it and samples one token (discarded), and keeps its
   blocks (`remote_kv`);
2. at that token - the prefill replica's TTFT - the proxy sends the original request with do_remote_prefill to a
   decode replica (the decode router); with the API servers modelled (`sim.pd_frontend`) its engine sees it
   after the hop and that instance's API server (recorded: when the live one did), else at once;
3. the decode replica admits it when a sequence slot and blocks for its prompt are free (after its local prefix
   hits), at the start of a step: the transfer starts then (NIXL's pull: the decode worker reads when that step
   runs), over the decode replica's KV link (`pd_transfer`); when it is over the prefill replica frees its
   blocks (the read notification) and the decode replica schedules the request at its next step with the last
   prompt token, which samples the client's first token;
4. it decodes there to its end.

So the client's TTFT is, exactly: prefill_ttft (queueing + prefill) + decode_admission_wait (from the handoff to
the transfer's start, and from the transfer's end to the step that schedules it) + transfer + first_decode_step
(that step). The per-request table keeps each part (`*_ms`) and the summary their means and percentiles.

The decode replicas' fast path (whole decode stretches at once) is bounded, as by an arrival, by the earliest
moment anything can reach them: a transfer's end, a delayed handoff, or a prefill replica's next completion (no
earlier than the end of its step under way, or the next arrival when it is idle).

Recorded (`RecordedHandoffs`, `kvplan validate` against a live pair): what happens between the instances is taken
from the live run instead of modelled - when each request reached each instance (the proxy's hops), how long its
pull took from the start of the decode step that began it, and when the prefill instance's export of it ended.
Priced by each instance's own recorded steps, the cluster then reproduces the live pair's timeline.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import simpy

from kvplan.engine.core import CacheConfig, Request, SchedulerConfig, SchedulerOutput, make_request
from kvplan.results.itl import ItlLog
from kvplan.results.request_table import RequestLog
from kvplan.sim.cluster import UNSERVABLE
from kvplan.sim.cost import CostModel
from kvplan.sim.lora import adapter_of
from kvplan.sim.pd_transfer import KVLink
from kvplan.sim.replica import Replica
from kvplan.sim.routers import Router
from kvplan.sim.stopping import Stoppable
from kvplan.traces import Trace

if TYPE_CHECKING:
    from kvplan.sim.pd_frontend import PDFrontend


@dataclass(slots=True)
class RecordedHandoffs:
    """A live pair's record per trace row, seconds on its trace clock (see the module): when the request reached
    the prefill instance and the decode instance, its pull's duration from the start of the decode step that began
    it, and when the prefill instance's export of it ended (read)."""

    prefill_arrival_s: list[float]
    decode_arrival_s: list[float]
    transfer_s: list[float]
    release_s: list[float]


class Pool:
    """One pool's replicas, router and cost (the replicas are numbered across both pools: prefill first)."""

    def __init__(self, cluster: DisaggCluster, first_index: int, count: int, router: Router, cache: CacheConfig,
                 config: SchedulerConfig, cost: CostModel, next_arrival, fast_path: bool,
                 record_tokens: bool = False) -> None:
        self.router = router
        self.log = RequestLog()
        self.replicas = [Replica(cluster.env, first_index + i, cache, config, cost, self.log, next_arrival,
                                 sample_interval_s=cluster.sample_interval_s, fast_path=fast_path,
                                 record_tokens=record_tokens) for i in range(count)]


class DisaggCluster(Stoppable):
    """x prefill and y decode replicas and the links between them (see the module). Per trace row it records
    the prefill replica, the handoff time, the transfer's start and end, and the bytes moved."""

    def __init__(self, trace: Trace, prefill: tuple[int, Router, CacheConfig, SchedulerConfig, CostModel],
                 decode: tuple[int, Router, CacheConfig, SchedulerConfig, CostModel], links: list[KVLink],
                 block_bytes_moved: float, *, sample_interval_s: float = 1.0, fast_path: bool = True,
                 record_tokens: bool = False, recorded: RecordedHandoffs | None = None,
                 decode_entry: Callable[[int, int, float], float] | None = None) -> None:
        self.env = simpy.Environment()
        self.trace = trace
        self.closed_loop = None  # (a steady-state probe reads it: P/D runs open-loop arrivals only)
        self.stopped = self.env.event()
        self.stop_reason = ""
        self.sample_interval_s = sample_interval_s
        self.recorded = recorded
        # when each request reaches a prefill replica: at its arrival, or when the live pair's proxy got it there
        self.arrivals = trace.arrival_s.tolist() if recorded is None else list(recorded.prefill_arrival_s)
        self.next_row = 0
        self.unservable: list[tuple[int, str]] = []
        x, y = prefill[0], decode[0]
        fast_path = fast_path and not record_tokens  # every token time is stamped step by step
        self.prefill = Pool(self, 0, x, *prefill[1:], self._prefill_bound, fast_path, record_tokens)
        self.decode = Pool(self, x, y, *decode[1:], self._decode_bound, fast_path, record_tokens)
        self.links = links  # one per decode replica, in its order
        self.block_bytes_moved = block_bytes_moved  # every rank's bytes per block moved
        n = len(trace)
        nan = [math.nan] * n
        self.prefill_replica = [-1] * n
        self.handoff_s, self.transfer_start_s, self.transfer_end_s = list(nan), list(nan), list(nan)
        # decode_entry(decode position, row, handoff) -> when the decode engine sees the request (None: at once)
        self.decode_entry = decode_entry if recorded is None else lambda _, row, end: recorded.decode_arrival_s[row]
        self.decode_arrival_s = list(nan)
        self.frontend: PDFrontend | None = None  # the API servers (set by sim.pd_run; its tables read it)
        self.transfer_bytes = [0.0] * n
        self._pending: list[float] = []  # transfer ends and delayed handoffs not yet reached (a heap)
        for replica in self.replicas:
            replica.stopped = self.stopped
        for replica in self.prefill.replicas:
            replica.on_close = self._handoff(replica)
        for replica in self.decode.replicas:
            replica.on_schedule = self._loads(replica)
        for replica in self.prefill.replicas:
            replica.on_schedule = _ignore  # its idle steps (blocks held for reads) wait to be woken
        self.env.process(self._arrivals())

    @property
    def replicas(self) -> list[Replica]:
        return self.prefill.replicas + self.decode.replicas

    # -- bounds for the fast path --------------------------------------------------------------------------
    def _next_transfer_end(self) -> float:
        pending, now = self._pending, self.env.now
        while pending and pending[0] < now:
            heapq.heappop(pending)
        return pending[0] if pending else math.inf

    def _next_arrival(self) -> float:
        return self.arrivals[self.next_row] if self.next_row < len(self.arrivals) else math.inf

    def _prefill_bound(self, index: int) -> float:
        return min(self._next_arrival(), self._next_transfer_end())

    def _decode_bound(self, index: int) -> float:
        busy = min((r.busy_until for r in self.prefill.replicas if r.sched.has_unfinished()), default=math.inf)
        return min(self._next_arrival(), busy, self._next_transfer_end())

    # -- the proxy -----------------------------------------------------------------------------------------
    def _arrivals(self):
        t = self.trace
        for row, arrival in enumerate(self.arrivals):
            self.next_row = row
            if arrival > self.env.now:
                yield self.env.timeout(arrival - self.env.now)
            if t.prompt_tokens[row] < 1 or t.output_tokens[row] < 1:
                self.unservable.append((row, UNSERVABLE))
                continue
            request = self._request(row, arrival, 1, {"do_remote_decode": True})
            replica = self.prefill.router.pick(request, self.prefill.replicas)
            if replica.submit(request, row):
                self.prefill_replica[row] = replica.index
        self.next_row = len(self.arrivals)

    def _request(self, row: int, arrival: float, max_tokens: int, params: dict) -> Request:
        t = self.trace
        hashes = t.hashes_of(row).tolist() if t.has_prefix else None
        lora_id, lora_name = adapter_of(t, row)
        return make_request(str(row), max_tokens=max_tokens, prompt_len=int(t.prompt_tokens[row]),
                            prefix_hashes=hashes or None, hash_granularity=t.hash_granularity if hashes else 0,
                            arrival_s=arrival, priority=int(t.priority[row]), n=int(t.n[row]),
                            kv_transfer_params=params, lora_id=lora_id, lora_name=lora_name)

    def _handoff(self, prefill: Replica):
        def close(row: int, sample: int, end: float) -> None:
            """The prefill replica's one token: the proxy sends the request on to a decode replica, whose engine
            sees it at once, or when `decode_entry` says (its API server's hop, queue and work; or the live
            pair's recorded hop)."""
            self.handoff_s[row] = end
            params = {"do_remote_prefill": True, "remote_engine_id": prefill.index}
            request = self._request(row, end, int(self.trace.output_tokens[row]), params)
            replica = self.decode.router.pick(request, self.decode.replicas)  # (the proxy picks, then sends)
            reach = end if self.decode_entry is None else \
                max(end, self.decode_entry(replica.index - len(self.prefill.replicas), row, end))
            self.decode_arrival_s[row] = request.arrival_s = reach
            if reach > end:
                heapq.heappush(self._pending, reach)  # (the decode fast path's bound: something reaches it then)
                self.env.process(self._submit_later(request, row, reach, replica, prefill))
            else:
                self._submit(request, row, replica, prefill)
        return close

    def _submit_later(self, request: Request, row: int, reach: float, replica: Replica, prefill: Replica):
        yield self.env.timeout(reach - self.env.now)
        self._submit(request, row, replica, prefill)

    def _submit(self, request: Request, row: int, replica: Replica, prefill: Replica) -> None:
        if not replica.submit(request, row):
            # refused by the decode side: it still tells the prefill side to free (vLLM's empty notify)
            prefill.sched.finished_sending([str(row)])
            prefill.wake(request.arrival_s)

    def _loads(self, decode: Replica):
        link = self.links[decode.index - len(self.prefill.replicas)]

        def start(step: SchedulerOutput, now: float) -> None:
            for load in step.kv_loads:
                row = int(load.request_id)
                recorded = self.recorded
                end = link.transfer(now, len(load.block_ids)) if recorded is None else now + recorded.transfer_s[row]
                self.transfer_start_s[row], self.transfer_end_s[row] = now, end
                self.transfer_bytes[row] = len(load.block_ids) * self.block_bytes_moved
                heapq.heappush(self._pending, end)
                prefill = self.prefill.replicas[self.prefill_replica[row]]
                self.env.process(self._received(load.request_id, end, decode))
                self.env.process(self._read(load.request_id, end if recorded is None else recorded.release_s[row],
                                            prefill))
        return start

    def _received(self, request_id: str, end: float, decode: Replica):
        yield self.env.timeout(max(end - self.env.now, 0.0))
        if request_id in decode.sched.requests:  # (nothing aborts in a simulation)
            decode.sched.finished_recving([request_id])
            decode.wake(end)

    def _read(self, request_id: str, end: float, prefill: Replica):
        """The prefill side learns its export was read (at the transfer's end; recorded: when the live one did)."""
        yield self.env.timeout(max(end - self.env.now, 0.0))
        prefill.sched.finished_sending([request_id])
        prefill.wake(end)

    def run(self, until_s: float | None = None) -> str:
        """Run to the end (every request finished), to `until_s`, or to a `stop()`; returns why it stopped
        ("" when everything finished) - as `sim.cluster.Cluster.run`, which a steady-state probe also drives."""
        self.run_to(until_s)
        return self.stop_reason

    # -- results -------------------------------------------------------------------------------------------
    def itl(self) -> ItlLog:
        return ItlLog().merge(r.itl for r in self.decode.replicas)

    def token_times(self, pool: Pool) -> dict[tuple[int, int], list[float]] | None:
        """Every token time per (row, sample) of a pool's replicas (None: not recorded)."""
        if pool.replicas[0].token_times is None:
            return None
        return {key: times for r in pool.replicas for key, times in (r.token_times or {}).items()}

    def series_rows(self) -> list[tuple]:
        return [row for r in self.replicas for row in r.series]

    def counters(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for replica in self.replicas:
            for key, value in replica.counters().items():
                totals[key] = totals.get(key, 0) + value
        totals["num_rejected"] = len(self.rejected())
        return totals

    def rejected(self) -> list[tuple[int, str]]:
        return sorted([*self.unservable, *(x for r in self.replicas for x in r.rejected)])


def _ignore(step: SchedulerOutput, now: float) -> None:
    """A prefill replica starts no loads; its hook only marks it as one that may idle on pending reads."""
