"""A cluster: N replicas behind a router, fed by an arrival process that replays a trace - or, with a
`ClosedLoop`, by users each sending their next request once the previous one has finished.

A run ends when every request has finished, or at `stop()` (a probe's horizon, or its overload check): what is
still running then stays unfinished, and `run` says why it stopped.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import simpy

from kvplan.engine.core import CacheConfig, Request, SchedulerConfig, make_request
from kvplan.results.itl import ItlLog
from kvplan.results.request_table import RequestLog
from kvplan.sim.closed_loop import ClosedLoop
from kvplan.sim.cost import CostModel
from kvplan.sim.links import wire_tiers, without_shared
from kvplan.sim.lora import adapter_of
from kvplan.sim.replica import Replica
from kvplan.sim.routers import Router
from kvplan.sim.stopping import Stoppable
from kvplan.traces import Trace

# A BurstGPT failure kept with --keep-failed: 0 output tokens (and often 0 prompt tokens) leave nothing to run.
UNSERVABLE: Final = "a failed request in the trace (0 prompt or 0 output tokens): nothing to serve"


class Cluster(Stoppable):
    def __init__(self, trace: Trace, num_replicas: int, router: Router, cache: CacheConfig, config: SchedulerConfig,
                 cost: CostModel, *, sample_interval_s: float = 1.0, fast_path: bool = True,
                 record_tokens: bool = False, closed_loop: ClosedLoop | None = None, layerwise: bool = False,
                 hash_ids_named: bool = False) -> None:
        self.env = simpy.Environment()
        self.trace = trace  # a closed loop: the requests its users have sent so far (set when the run ends)
        self.closed_loop = closed_loop
        self.stopped = self.env.event()
        self.stop_reason = ""
        self.router = router
        # a router that places arrivals in advance (round robin) says whose the next ones are (looked up once: each
        # replica asks at every step)
        self._arrivals_before = getattr(router, "arrivals_before", None)
        self.log = RequestLog()
        self.unservable: list[tuple[int, str]] = []  # failed requests of the trace: nothing to serve
        self.arrivals = trace.arrival_s.tolist() if closed_loop is None else []
        # What an arrival reads of its row (`_request`), as memoryviews of the trace's columns: indexing one gives a
        # Python int (~50 ns), where indexing the array gives a numpy scalar for int() to convert (~200 ns); and,
        # unlike a list, it copies nothing (a million rows)
        self._prompt_tokens, self._output_tokens = trace.prompt_tokens.data, trace.output_tokens.data
        self._priority, self._n = trace.priority.data, trace.n.data
        self._hashes = (trace.hash_ids, trace.hash_offsets.data) if (
            trace.hash_ids is not None and trace.hash_offsets is not None) else None
        self._adapters = trace.lora is not None  # (else every row is the base model's: no call per arrival)
        self.hash_ids_named = hash_ids_named  # the caller checked that the trace's ids name prefixes (block_keys)
        # Failed rows take no router turn; a round robin's next arrival for a replica counts servable rows only.
        servable = trace.servable
        self._servable = None if servable.all() else np.flatnonzero(servable).tolist()
        self.next_row = 0  # the next trace row to arrive
        # The rows' names in a larger trace this one was cut from (`sim.parallel`: one replica's share of a round
        # robin); requests are named, and their prefix-cache salts drawn, by those, as in the whole run.
        self.row_names: list[int] | None = None
        # A closed loop's arrivals come from completions: no stretch may run past one (see ClosedLoop).
        next_arrival = self._next_arrival if closed_loop is None else closed_loop.next_arrival
        self.replicas = [Replica(self.env, i, without_shared(cache), config, cost, self.log, next_arrival,
                                 sample_interval_s=sample_interval_s, fast_path=fast_path,
                                 record_tokens=record_tokens)
                         for i in range(num_replicas)]
        for replica in self.replicas:
            replica.stopped = self.stopped
        # the one shared prefix store every replica's chain ends in, and the links the tiers' transfers cross
        self.shared_tier = wire_tiers(self.replicas, cache, cost, layerwise)
        if closed_loop is None:
            self.env.process(self._arrivals())
        else:
            closed_loop.start(self)

    def _next_arrival(self, index: int) -> float:
        """When replica `index` may next see a request: the next arrival, or, under a router that decides
        placement in advance (round robin), the next arrival that router will hand to this replica."""
        ahead = self._arrivals_before
        row = self.next_row
        if ahead is not None:
            turns = ahead(index, len(self.replicas))
            if self._servable is None:
                row += turns
            else:
                at = bisect_left(self._servable, row) + turns
                row = self._servable[at] if at < len(self._servable) else len(self.arrivals)
        return self.arrivals[row] if row < len(self.arrivals) else math.inf

    def run(self, until_s: float | None = None) -> str:
        """Run to the end (every request finished), to `until_s`, or to a `stop()`; returns why it stopped
        ("" when everything finished)."""
        self.run_to(until_s)
        if self.closed_loop is not None:
            self.trace = self.closed_loop.sent_trace()
        return self.stop_reason

    def _arrivals(self):
        timeout = self.env.timeout  # (bound once: an attribute of the interpreted environment)
        for row, arrival in enumerate(self.arrivals):
            self.next_row = row
            now = self.env.now  # (a SimPy property: an interpreted call)
            if arrival > now:
                yield timeout(arrival - now)
            prompt, output = self._prompt_tokens[row], self._output_tokens[row]
            if prompt < 1 or output < 1:
                self.unservable.append((row, UNSERVABLE))
                continue
            request = self._request(row, arrival, prompt, output)
            self.router.pick(request, self.replicas).submit(request, row)
        self.next_row = len(self.arrivals)

    def _request(self, row: int, arrival: float, prompt: int, output: int) -> Request:
        t, prefix = self.trace, self._hashes
        hashes = None
        if prefix is not None:  # (`hashes_of`)
            ids, offsets = prefix
            hashes = ids[offsets[row]:offsets[row + 1]].tolist()
        name = row if self.row_names is None else self.row_names[row]
        lora_id, lora_name = adapter_of(t, row) if self._adapters else (0, "")
        return make_request(str(name), max_tokens=output, prompt_len=prompt, prefix_hashes=hashes or None,
                            hash_granularity=t.hash_granularity if hashes else 0,
                            hash_ids_named=self.hash_ids_named, arrival_s=arrival,
                            priority=self._priority[row], n=self._n[row], lora_id=lora_id, lora_name=lora_name)

    # -- results -------------------------------------------------------------------------------------------
    def itl(self) -> ItlLog:
        return merged_itl(self.replicas)

    def series_rows(self) -> list[tuple]:
        return series_rows(self.replicas)

    def counters(self) -> dict[str, int]:
        return counter_totals(self.replicas, self.unservable)

    def rejected(self) -> list[tuple[int, str]]:
        """(trace row, reason) of every request never served: rejected by a replica's scheduler (longer than
        max_model_len, too large for the KV cache) or failed in the trace itself."""
        return rejected_rows(self.replicas, self.unservable)


# What a cluster's results sum over its replicas: functions of the replicas (`Replica`s here, the parts a worker
# process sends back in `sim.parallel`: anything with `itl`, `series`, `counters()` and `rejected`), so that both
# kinds of cluster share them.
def merged_itl(replicas: Sequence[Any]) -> ItlLog:
    return ItlLog().merge(r.itl for r in replicas)


def series_rows(replicas: Sequence[Any]) -> list[tuple]:
    return [row for r in replicas for row in r.series]


def counter_totals(replicas: Sequence[Any], unservable: list[tuple[int, str]]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for replica in replicas:
        for key, value in replica.counters().items():
            totals[key] = totals.get(key, 0) + value
    totals["num_rejected"] = len(unservable) + sum(len(r.rejected) for r in replicas)
    return totals


def rejected_rows(replicas: Sequence[Any], unservable: list[tuple[int, str]]) -> list[tuple[int, str]]:
    return sorted([*unservable, *(x for r in replicas for x in r.rejected)])
