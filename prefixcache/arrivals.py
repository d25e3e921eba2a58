"""Requests in order of arrival, read lazily from their source.

A long trace never sits in memory as token lists: a request is built only when the clock
reaches its arrival (or when an earlier-listed one is read). A source that is not sorted by
arrival still works: a late-listed early request joins as soon as it is read.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from prefixcache.request import Request


class Arrivals:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Request]] = []  # added, not yet arrived
        self._added = 0
        self._source: Iterator[Request] | None = None
        self._peeked: Request | None = None

    def read_from(self, requests: Iterable[Request]) -> None:
        self._source = iter(requests)
        self._peeked = None

    def add(self, req: Request) -> None:
        heapq.heappush(self._heap, (req.arrival_time, self._added, req))
        self._added += 1

    def __bool__(self) -> bool:
        """Requests still to arrive (added, or unread in the source)."""
        return bool(self._heap) or self._source is not None

    def next_time(self) -> float | None:
        """Arrival time of the earliest added request (None if none is added)."""
        return self._heap[0][0] if self._heap else None

    def read(self, clock: float) -> Iterator[Request]:
        """Take requests from the source until one arrives after ``clock`` and the heap
        already holds a request arriving no later (kept for a later call); yields each read
        request for the caller to add (or reject)."""
        while self._source is not None:
            if self._peeked is None:
                self._peeked = next(self._source, None)
                if self._peeked is None:
                    self._source = None
                    return
            t = self._peeked.arrival_time
            if self._heap and t > clock and t >= self._heap[0][0]:
                return  # the heap already holds the next arrival; read on when the clock gets there
            req, self._peeked = self._peeked, None
            yield req

    def pending(self) -> list[Request]:
        """Added requests that have not arrived yet (in no particular order)."""
        return [entry[2] for entry in self._heap]

    def pop_arrived(self, clock: float) -> Iterator[Request]:
        """Added requests that have arrived by ``clock``, in arrival order."""
        while self._heap and self._heap[0][0] <= clock:
            yield heapq.heappop(self._heap)[2]
