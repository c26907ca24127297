"""Fetches of one offset range, several in flight, answered in offset order.

A Spark task reads its range [start, end) as consecutive chunks of at most
`fetch_records_max` offsets. Up to `FETCHES_IN_FLIGHT_MAX` chunks are asked for at once, so
that while the task turns one answer into Arrow columns (and Spark takes them) the next
answer is on its way and the node is already serving the one after: on a busy machine a
round trip to a node process costs as much as decoding the answer, and with one fetch at
a time the task (and the Spark task thread behind it) waited for each.

Answers are taken strictly in order, chunk after chunk, and a chunk is asked for exactly
its offsets, so the records handed on are the same as with one fetch at a time:

- an answer that stops short of its chunk's end (the node's `bytes_max`, or a replica
  behind the leader) is followed by a fetch of the chunk's rest before any later chunk
  is taken (the window holds one fetch more until then);
- an answer that brings records past its chunk's end (an entry across the boundary) is
  cut at the boundary; the next chunk's answer starts with that entry again (the cost of
  asking before knowing where entries end: one entry per chunk travels twice; with
  `fetchRecordsMax` 10,000 and the bench's entries of 2,000-6,000 records the worker's CPU
  was the same as with chunks of 50,000, measured);
- after an error (offsets lost to retention), chunks still in flight are cancelled and
  the window starts again from where the caller says.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

from quorumlog.codec.wire import FetchResult
from quorumlog.raft.invariants import require

FETCHES_IN_FLIGHT_MAX = 2
"""Chunks a task has asked for and not yet taken: one being answered while the task works
on the other (measured on the 2-core bench machine: see `bench/stream.py`)."""

FetchStarter = Callable[[int, int], "Future[FetchResult]"]
"""Starts a fetch of at most `records_max` records from `offset`: (offset, records_max)."""


class ChunkFetch:
    """One chunk [start, end) asked for, and its answer to come."""

    __slots__ = ("end", "future", "start")

    def __init__(self, start: int, end: int, future: Future[FetchResult]) -> None:
        self.start = start
        self.end = end
        self.future = future


class RangeFetches:
    """The fetch window over [start, end); see the module docstring."""

    def __init__(
        self,
        start: int,
        end: int,
        chunk_records_max: int,
        start_fetch: FetchStarter,
        in_flight_max: int = FETCHES_IN_FLIGHT_MAX,
    ) -> None:
        require(chunk_records_max >= 1, "chunks of %d records", chunk_records_max)
        require(in_flight_max >= 1, "%d fetches in flight", in_flight_max)
        self.end = end
        self.chunk_records_max = chunk_records_max
        self.start_fetch = start_fetch
        self.in_flight_max = in_flight_max
        self.in_flight: deque[ChunkFetch] = deque()
        self.next_start = start
        """Where the next chunk not yet asked for begins."""

    def restart_at(self, offset: int) -> None:
        """Forget every chunk in flight; ask again from `offset` (after lost offsets)."""
        self.cancel()
        self.next_start = offset

    def next_answer(self) -> tuple[int, int, FetchResult]:
        """(chunk start, chunk end, answer) of the next chunk in offset order; raises what
        the fetch raised. The window is topped up before waiting, so the node serves the
        following chunks while the caller works on this answer."""
        self.fill()
        require(bool(self.in_flight), "no chunk left to fetch before %d", self.end)
        chunk = self.in_flight.popleft()
        answer = chunk.future.result()
        self.fill()
        return chunk.start, chunk.end, answer

    def ask_again(self, offset: int, chunk_end: int) -> None:
        """The chunk ending at `chunk_end` was answered only up to `offset`: fetch its rest
        next, ahead of the chunks already in flight."""
        require(offset < chunk_end <= self.end, "rest [%d, %d) of a chunk", offset, chunk_end)
        future = self.start_fetch(offset, chunk_end - offset)
        self.in_flight.appendleft(ChunkFetch(offset, chunk_end, future))

    def fill(self) -> None:
        while len(self.in_flight) < self.in_flight_max and self.next_start < self.end:
            start = self.next_start
            end = min(start + self.chunk_records_max, self.end)
            self.in_flight.append(ChunkFetch(start, end, self.start_fetch(start, end - start)))
            self.next_start = end

    def cancel(self) -> None:
        """Cancel the fetches still in flight (a reader stopped early, or restarting)."""
        for chunk in self.in_flight:
            chunk.future.cancel()
        self.in_flight.clear()
