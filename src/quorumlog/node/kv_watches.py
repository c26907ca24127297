"""Watches as long polls: `WatchPoll(from_revision)` answers the events from that revision
on, held up to `wait_ms` while there are none.

Why a long poll rather than a pushed stream: the events come from the replicated history,
so any replica that has applied them answers the same; a client that loses its connection
or its leader asks anyone from its last revision + 1 and misses nothing, without the node
keeping per-watch state that a leader change would lose. The cost is one request per
batch of events, which a watch that is busy fills with many events.
"""

from __future__ import annotations

from collections.abc import Callable

from quorumlog.codec import wire
from quorumlog.kv.machine import KVStateMachine
from quorumlog.kv.mvcc import StoreFailure
from quorumlog.kv.reserved import is_reserved_key, range_touches_reserved
from quorumlog.runtime.handle import GroupHandle
from quorumlog.runtime.resources import Timer

Replier = Callable[[wire.Frame], None]
WATCH_EVENTS_PER_ANSWER_MAX = 1_000
"""About how many events one answer carries (a revision is never split)."""
WATCH_WAIT_MS_MAX = 30_000
WATCHES_WAITING_MAX = 10_000
"""Polls held at once on one node; past it a poll is answered at once, empty."""


class WaitingPoll:
    __slots__ = ("from_revision", "reply", "request", "timer")

    def __init__(self, request: wire.WatchPoll, from_revision: int, reply: Replier) -> None:
        self.request = request
        self.from_revision = from_revision
        self.reply = reply
        self.timer: Timer | None = None


class WatchPolls:
    """The polls waiting on one node for their first event."""

    def __init__(self, group: GroupHandle, machine: Callable[[], KVStateMachine]) -> None:
        self.group = group
        self.machine = machine
        self.waiting: list[WaitingPoll] = []
        self.wake_scheduled = False

    def poll(self, request: wire.WatchPoll, reply: Replier) -> None:
        """Answer now if there are events (or a failure), else hold the poll."""
        store = self.machine().store
        from_revision = request.from_revision or store.revision + 1
        if self.answer(request, from_revision, reply, final=request.wait_ms <= 0):
            return
        if len(self.waiting) >= WATCHES_WAITING_MAX:
            self.answer(request, from_revision, reply, final=True)
            return
        waiting = WaitingPoll(request, from_revision, reply)
        wait_seconds = min(request.wait_ms, WATCH_WAIT_MS_MAX) / 1000
        waiting.timer = self.group.scheduler.call_later(wait_seconds, lambda: self.expire(waiting))
        self.waiting.append(waiting)

    def answer(
        self, request: wire.WatchPoll, from_revision: int, reply: Replier, final: bool
    ) -> bool:
        """Reply if there is something to say (or `final`); whether it replied."""
        store = self.machine().store
        try:
            events = store.events_since(
                from_revision, request.key, request.end, WATCH_EVENTS_PER_ANSWER_MAX
            )
        except StoreFailure as failure:
            reply(
                wire.WatchPollResult(
                    request_id=request.request_id,
                    events=[],
                    revision=store.revision,
                    failure=failure.failure,
                )
            )
            return True
        revision = store.revision
        if range_touches_reserved(request.key, request.end):
            # A user's watch leaves quorumlog's own keys out (kv/reserved.py). When the
            # answer was cut at its bound, say only up to what was read, so the next poll
            # goes on from there and misses nothing.
            if len(events) >= WATCH_EVENTS_PER_ANSWER_MAX:
                revision = events[-1].kv.mod_revision
            events = [event for event in events if not is_reserved_key(event.kv.key)]
        if not events and not final:
            return False
        reply(wire.WatchPollResult(request_id=request.request_id, events=events, revision=revision))
        return True

    def expire(self, waiting: WaitingPoll) -> None:
        if waiting in self.waiting:
            self.waiting.remove(waiting)
            self.answer(waiting.request, waiting.from_revision, waiting.reply, final=True)

    def changed(self) -> None:
        """The store's revision moved: wake the polls after this apply returns."""
        if self.waiting and not self.wake_scheduled:
            self.wake_scheduled = True
            self.group.scheduler.call_soon(self.wake)

    def wake(self) -> None:
        self.wake_scheduled = False
        still: list[WaitingPoll] = []
        for waiting in self.waiting:
            if self.answer(waiting.request, waiting.from_revision, waiting.reply, final=False):
                if waiting.timer is not None:
                    waiting.timer.cancel()
            else:
                still.append(waiting)
        self.waiting = still


__all__ = ["WATCH_EVENTS_PER_ANSWER_MAX", "WatchPolls"]
