"""Waiting queues: FCFS, or by priority (smaller value first, then arrival).

A request preempted by recompute goes back to the head under FCFS - it has already waited its turn - and back
in priority order under the priority policy.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from itertools import islice

from kvplan.engine.core.request import Request


class FCFSQueue:
    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def push(self, request: Request) -> None:
        self._q.append(request)

    def push_front(self, request: Request) -> None:
        self._q.appendleft(request)

    def peek(self) -> Request:
        return self._q[0]

    def pop(self) -> Request:
        return self._q.popleft()

    def remove(self, request: Request) -> None:
        self._q.remove(request)

    def head(self, n: int) -> list[Request]:
        """The first `n` requests (fewer when fewer wait), in order."""
        return list(islice(self._q, n))

    def replace_head(self, requests: list[Request]) -> None:
        """Put `requests` (the same requests as `head(len(requests))`, reordered) in place of the queue's head."""
        for _ in requests:
            self._q.popleft()
        self._q.extendleft(reversed(requests))

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._q)


class PriorityQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []

    def push(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.priority, request.arrival_s, request.seq, request))

    def push_front(self, request: Request) -> None:
        """A preempted request goes back by its priority like any other (a method, not an alias: mypyc compiles no
        class attribute bound to a function)."""
        self.push(request)

    def peek(self) -> Request:
        return self._heap[0][3]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove(self, request: Request) -> None:
        self._heap = [e for e in self._heap if e[3] is not request]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (e[3] for e in sorted(self._heap, key=lambda e: e[:3]))


def make_queue(policy: str) -> FCFSQueue | PriorityQueue:
    return PriorityQueue() if policy == "priority" else FCFSQueue()
