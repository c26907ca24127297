"""Ranges and watches of one shard of a shard group (the sharded KV's v3 reads).

Both name exactly one shard: revisions are counted per shard (`shard.shard_store`), so a
revision means something only within its shard. A shard this group does not serve now
gets WRONG_GROUP, as a plain read does, and the client routes again.

Watches are long polls as on the plain KV (`node.kv_watches`, which says why): any
replica that applied the events answers the same, so a watch goes on across leader
changes by asking whoever leads from the revision after the last one it saw. A poll held
here while its shard stops being served (it moved away) is answered WRONG_GROUP at once,
and the client asks the shard's new owner from the same revision: the history moved with
the shard. Only a shard that arrived without its history (from an older build) has none
before its arrival: a poll from at or before it gets the failure "shard_moved" (the client
raises `ShardMovedError`) rather than events with a hole in them.
"""

from __future__ import annotations

from collections.abc import Callable

from quorumlog.codec import wire
from quorumlog.codec.kv_v3 import V3Failure, WatchEvent
from quorumlog.kv.mvcc import MVCCStore, StoreFailure
from quorumlog.node.held_polls import HeldPoll, HeldPolls
from quorumlog.node.kv_watches import WATCH_EVENTS_PER_ANSWER_MAX
from quorumlog.node.range_answers import RANGE_LIMIT_MAX, range_answer
from quorumlog.runtime.handle import GroupHandle
from quorumlog.shard.group_commands import WrongGroup
from quorumlog.shard.group_machine import ShardGroupMachine
from quorumlog.shard.shard_store import SHARD_MOVED

Replier = Callable[[wire.Frame], None]
ShardReadRequest = wire.KVRangeRequest | wire.WatchPoll
SHARD_WATCHES_WAITING_MAX = 10_000
"""Polls held at once by one shard group on one node; past it a poll is answered at once."""


def wrong_group_error(request_id: int, wrong: WrongGroup, gid: int) -> wire.ErrorResponse:
    return wire.ErrorResponse(
        request_id=request_id,
        code=wire.ErrorCode.WRONG_GROUP,
        message=(
            f"group {gid} does not serve shard {wrong.shard} in configuration "
            f"{wrong.configuration_number}"
        ),
    )


def requested_shard(request: ShardReadRequest, machine: ShardGroupMachine) -> int | str:
    """The one shard a request names (or, for one key, that key's shard); else why not."""
    if request.shards is None:
        if request.end is None:
            return machine.shard_for_key(request.key)
        return "a range of the sharded KV names its one shard (revisions are per shard)"
    if len(set(request.shards)) != 1:
        return f"a range or watch names exactly one shard, not {request.shards}"
    [shard] = set(request.shards)
    if not 0 <= shard < machine.shard_count:
        return f"shard {shard} is outside 0..{machine.shard_count - 1}"
    if request.end is None and machine.shard_for_key(request.key) != shard:
        return f"key {request.key!r} is not in shard {shard}"
    return shard


def shard_range(request: wire.KVRangeRequest, store: MVCCStore) -> wire.KVRangeResult:
    """One page of a range of one shard's store (at `request.revision`, 0: now)."""
    return range_answer(request, store, [(request.key, request.end)])


class WaitingShardPoll(HeldPoll):
    __slots__ = ("from_revision", "reply", "request", "shard")

    def __init__(
        self, request: wire.WatchPoll, shard: int, from_revision: int, reply: Replier
    ) -> None:
        super().__init__()
        self.request = request
        self.shard = shard
        self.from_revision = from_revision
        self.reply = reply


class ShardWatchPolls(HeldPolls[WaitingShardPoll]):
    """The watch polls waiting on one node for events of one shard group's shards."""

    def __init__(self, gid: int, group: GroupHandle, machine: ShardGroupMachine) -> None:
        super().__init__(group, SHARD_WATCHES_WAITING_MAX)
        self.gid = gid
        self.machine = machine

    def poll(self, request: wire.WatchPoll, shard: int, reply: Replier) -> None:
        """Answer now if there are events (or a failure, or the shard is not served),
        else hold the poll."""
        store = self.machine.shard_store(shard)
        if isinstance(store, WrongGroup):
            reply(wrong_group_error(request.request_id, store, self.gid))
            return
        from_revision = request.from_revision or store.revision + 1
        self.answer_or_hold(WaitingShardPoll(request, shard, from_revision, reply), request.wait_ms)

    def answer(self, poll: WaitingShardPoll, final: bool) -> bool:
        """Reply if there is something to say (or `final`); whether it replied."""
        request, shard, from_revision, reply = (
            poll.request,
            poll.shard,
            poll.from_revision,
            poll.reply,
        )
        store = self.machine.shard_store(shard)
        if isinstance(store, WrongGroup):
            reply(wrong_group_error(request.request_id, store, self.gid))
            return True
        arrived_revision = self.machine.shards[shard].arrived_revision
        failure: V3Failure | None = None
        events: list[WatchEvent] = []
        if from_revision <= arrived_revision:
            failure = V3Failure(
                SHARD_MOVED,
                f"shard {shard} moved to group {self.gid} at revision {arrived_revision}; "
                f"its history before that stayed behind (asked from {from_revision})",
            )
        else:
            try:
                events = store.events_since(
                    from_revision, request.key, request.end, WATCH_EVENTS_PER_ANSWER_MAX
                )
            except StoreFailure as refused:
                failure = refused.failure
        if failure is None and not events and not final:
            return False
        reply(
            wire.WatchPollResult(
                request_id=request.request_id,
                events=events,
                revision=store.revision,
                failure=failure,
            )
        )
        return True


__all__ = [
    "RANGE_LIMIT_MAX",
    "ShardWatchPolls",
    "requested_shard",
    "shard_range",
    "wrong_group_error",
]
