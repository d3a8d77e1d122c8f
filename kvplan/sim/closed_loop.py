"""Closed-loop load: `users` users, each sending its next request `think_s` after its previous one finished.

A user works through one session of the trace's population at a time (`traces.steady.SessionDraws`: copies of
the trace's sessions, shared prefixes kept shared): turn j + 1 is sent only once turn j has finished (every
sample of it), as a chat user waits for the answer; after its last turn the user draws its next session. Users
stop sending at `send_until_s`. This is the concurrency mode of GuideLLM and AIConfigurator: the load adapts to
the server, so the question it answers is "how many concurrent users", not "how many requests per second".

Exactness with the fast path: a send is scheduled when a completion is known, which in a fast-path stretch is
at the stretch's start, before the step that finishes it has run in simulated time. Three rules make the two
paths agree: a stretch ends at its first completion (`Replica.stop_at_finish`); a send fires after every
ordinary event of its instant (priority below SimPy's NORMAL), so a replica finishing a step at that instant
schedules its next step before the new request arrives, on either path; and a replica's stretch ends with the
step running across the earliest moment another replica could send (`next_arrival`: the earliest scheduled
send, or another busy replica's current step end plus the think time) - a send routed to it, or a router
reading its state, must find it where stepping one step at a time would have it (a step under way shows its
allocations and prefix registrations either way; one in which a request finishes does not join). With several
busy replicas and no think time that keeps stretches short; the results are exact either way.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

import numpy as np
import simpy
from simpy.events import EventPriority

from kvplan.engine.core import make_request
from kvplan.errors import UserError
from kvplan.sim.lora import adapter_of
from kvplan.traces.schema import Trace
from kvplan.traces.steady import Population, SessionDraws

if TYPE_CHECKING:
    from kvplan.sim.cluster import Cluster

LATE = EventPriority(2)  # event priority after SimPy's URGENT (0) and NORMAL (1)
MAX_UNSERVABLE_DRAWS = 10_000  # consecutive failed requests (0 tokens) drawn before giving up


class _Late(simpy.events.Event):
    """An event `delay` from now that fires after every ordinary event of that instant."""

    def __init__(self, env: simpy.Environment, delay: float) -> None:
        super().__init__(env)
        self._ok, self._value = True, None
        env.schedule(self, LATE, delay)


class ClosedLoop:
    def __init__(self, pop: Population, users: int, think_s: float, send_until_s: float, seed: int, *,
                 max_requests: int | None = None) -> None:
        if users < 1:
            raise UserError(f"concurrency {users}; allowed: an integer >= 1")
        if not (math.isfinite(think_s) and think_s >= 0):
            raise UserError(f"think_s {think_s!r}; allowed: a finite number of seconds >= 0")
        servable = pop.trace.servable
        if not servable.any():
            raise UserError("the trace has no servable request (every one has 0 prompt or output tokens)")
        self.pop, self.users, self.think_s, self.send_until_s = pop, users, think_s, send_until_s
        # a benchmark's fixed count of requests (`vllm bench serve --max-concurrency`): no send after that many
        self.max_requests, self.scheduled = max_requests, 0
        self.draws = SessionDraws(pop, seed)
        self.turns: list[list[int]] = [[] for _ in range(users)]  # each user's remaining turns (entries)
        self.copy_of_user = [0] * users
        self.pending: list[float] = []  # heap of scheduled send times
        self.entries: list[int] = []  # per sent row: its entry into pop.order, its copy, its send time
        self.copies: list[int] = []
        self.sent_at: list[float] = []
        self.user_of_row: list[int] = []
        self.samples_left: list[int] = []
        self.cluster: Cluster  # set by `start`, before any send

    def start(self, cluster: Cluster) -> None:
        self.cluster = cluster
        for replica in cluster.replicas:
            replica.on_close = self.on_close
            replica.stop_at_finish = True
        for user in range(self.users):
            self._schedule(user, 0.0)

    def next_arrival(self, index: int) -> float:
        """The earliest moment a request may reach replica `index` or a router may look at it: the earliest
        scheduled send, or the earliest another replica may finish a request and its user send the next."""
        soonest = self.pending[0] if self.pending else math.inf
        for replica in self.cluster.replicas:
            if replica.index != index and replica.busy_until + self.think_s < soonest:
                soonest = replica.busy_until + self.think_s
        return soonest

    def _schedule(self, user: int, at: float) -> None:
        if at >= self.send_until_s or (self.max_requests is not None and self.scheduled >= self.max_requests):
            return  # this user is done
        self.scheduled += 1
        env = self.cluster.env
        heapq.heappush(self.pending, at)
        _Late(env, max(at - env.now, 0.0)).callbacks.append(lambda _event: self._send(user, at))

    def _send(self, user: int, at: float) -> None:
        heapq.heappop(self.pending)
        pop, trace = self.pop, self.pop.trace
        for _ in range(MAX_UNSERVABLE_DRAWS):
            if not self.turns[user]:
                copy, entries = self.draws.next()
                self.copy_of_user[user], self.turns[user] = copy, entries.tolist()[::-1]
            entry = self.turns[user].pop()
            source = int(pop.order[entry])
            if trace.prompt_tokens[source] >= 1 and trace.output_tokens[source] >= 1:
                break
        else:
            raise RuntimeError(f"{MAX_UNSERVABLE_DRAWS} failed requests drawn in a row")
        row, copy = len(self.entries), self.copy_of_user[user]
        self.entries.append(entry)
        self.copies.append(copy)
        self.sent_at.append(at)
        self.user_of_row.append(user)
        self.samples_left.append(int(trace.n[source]))
        hashes = None
        # all three or none: a trace with prefix identity (Trace.has_prefix) and its population's private ids
        trace_hashes, offsets, private = trace.hash_ids, trace.hash_offsets, pop.private
        if trace_hashes is not None and offsets is not None and private is not None:
            lo, hi = offsets[source], offsets[source + 1]
            ids = trace_hashes[lo:hi]
            hashes = np.where(private[lo:hi], ids + (copy + 1) * pop.stride, ids).tolist() or None
        lora_id, lora_name = adapter_of(trace, source)
        request = make_request(str(row), max_tokens=int(trace.output_tokens[source]),
                               prompt_len=int(trace.prompt_tokens[source]), prefix_hashes=hashes,
                               hash_granularity=trace.hash_granularity if hashes else 0,
                               hash_ids_named=pop.hash_ids_named, arrival_s=at,
                               priority=int(trace.priority[source]), n=int(trace.n[source]),
                               lora_id=lora_id, lora_name=lora_name)
        cluster = self.cluster
        if not cluster.router.pick(request, cluster.replicas).submit(request, row):
            self._schedule(user, at + self.think_s)  # rejected (too long for the cache): on to the next

    def on_close(self, row: int, sample: int, end: float) -> None:
        self.samples_left[row] -= 1
        if self.samples_left[row] == 0:
            self._schedule(self.user_of_row[row], end + self.think_s)

    def sent_trace(self) -> Trace:
        """The requests sent, in sending order (row i is the i-th sent)."""
        note = (f"closed loop: {self.users} users, think {self.think_s:g} s, {len(self.entries)} requests of "
                f"{self.draws.drawn} sessions drawn from {self.pop.sessions}")
        return self.pop.materialize(np.asarray(self.entries, dtype=np.int64),
                                    np.asarray(self.copies, dtype=np.int64),
                                    np.asarray(self.sent_at, dtype=np.float64), note)
