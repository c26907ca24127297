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
from quorumlog.node.held_polls import HeldPoll, HeldPolls
from quorumlog.runtime.handle import GroupHandle

Replier = Callable[[wire.Frame], None]
WATCH_EVENTS_PER_ANSWER_MAX = 1_000
"""About how many events one answer carries (a revision is never split)."""
WATCHES_WAITING_MAX = 10_000
"""Polls held at once on one node; past it a poll is answered at once, empty."""


class WaitingPoll(HeldPoll):
    __slots__ = ("from_revision", "reply", "request")

    def __init__(self, request: wire.WatchPoll, from_revision: int, reply: Replier) -> None:
        super().__init__()
        self.request = request
        self.from_revision = from_revision
        self.reply = reply


class WatchPolls(HeldPolls[WaitingPoll]):
    """The polls waiting on one node for their first event."""

    def __init__(self, group: GroupHandle, machine: Callable[[], KVStateMachine]) -> None:
        super().__init__(group, WATCHES_WAITING_MAX)
        self.machine = machine

    def poll(self, request: wire.WatchPoll, reply: Replier) -> None:
        """Answer now if there are events (or a failure), else hold the poll."""
        store = self.machine().store
        from_revision = request.from_revision or store.revision + 1
        self.answer_or_hold(WaitingPoll(request, from_revision, reply), request.wait_ms)

    def answer(self, poll: WaitingPoll, final: bool) -> bool:
        """Reply if there is something to say (or `final`); whether it replied."""
        request, reply = poll.request, poll.reply
        store = self.machine().store
        try:
            events = store.events_since(
                poll.from_revision, request.key, request.end, WATCH_EVENTS_PER_ANSWER_MAX
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


__all__ = ["WATCH_EVENTS_PER_ANSWER_MAX", "WatchPolls"]
