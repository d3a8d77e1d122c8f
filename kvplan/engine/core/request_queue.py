"""Waiting queues: FCFS, or by priority (smaller value first, then arrival).

A request preempted by recompute goes back to the head under FCFS - it has already waited its turn - and back
in priority order under the priority policy.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from itertools import islice

from kvplan.engine.core.request import Request


class FCFSQueue:
    """A list and the index of its head: the requests from `_head` on wait, in order (a deque's methods are Python
    method calls in the compiled build, and the queue is read at every admission). The consumed front is dropped
    once it is longer than the rest."""

    def __init__(self) -> None:
        self._items: list[Request] = []
        self._head = 0

    def push(self, request: Request) -> None:
        self._items.append(request)

    def push_front(self, request: Request) -> None:
        if self._head:
            self._head -= 1
            self._items[self._head] = request
        else:
            self._items.insert(0, request)

    def peek(self) -> Request:
        return self._items[self._head]

    def pop(self) -> Request:
        request = self._items[self._head]
        self._head += 1
        if 2 * self._head > len(self._items):
            del self._items[:self._head]
            self._head = 0
        return request

    def remove(self, request: Request) -> None:
        del self._items[self._items.index(request, self._head)]

    def head(self, n: int) -> list[Request]:
        """The first `n` requests (fewer when fewer wait), in order."""
        return self._items[self._head:self._head + n]

    def replace_head(self, requests: list[Request]) -> None:
        """Put `requests` (the same requests as `head(len(requests))`, reordered) in place of the queue's head."""
        self._items[self._head:self._head + len(requests)] = requests

    def __len__(self) -> int:
        return len(self._items) - self._head

    def __iter__(self) -> Iterator[Request]:
        return islice(self._items, self._head, None)


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
