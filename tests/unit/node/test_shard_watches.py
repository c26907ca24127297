"""ShardWatchPolls on one shard group's machine, with a scheduler the test runs by hand:
a held poll is answered by the write that wakes it, WRONG_GROUP when its shard moves
away, "shard_moved" from before a shard that arrived without its history, and empty when
its wait ends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import msgspec

from quorumlog.codec import wire
from quorumlog.node.shard_watches import ShardWatchPolls, requested_shard
from quorumlog.runtime.handle import GroupHandle
from quorumlog.shard.shard_store import SHARD_MOVED
from tests.unit.shard.test_group_machine import SHARD_COUNT, Replica, insert_from, key_in_shard


class Timer:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Scheduler:
    """Runs `call_soon` callbacks when the test says; keeps `call_later` ones to fire."""

    def __init__(self) -> None:
        self.soon: list[Callable[[], None]] = []
        self.later: list[tuple[Timer, Callable[[], None]]] = []

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.soon.append(callback)

    def call_later(self, delay_seconds: float, callback: Callable[[], None]) -> Timer:
        timer = Timer()
        self.later.append((timer, callback))
        return timer

    def run_soon(self) -> None:
        callbacks, self.soon = self.soon, []
        for callback in callbacks:
            callback()

    def fire_timers(self) -> None:
        timers, self.later = self.later, []
        for timer, callback in timers:
            if not timer.cancelled:
                callback()


class Group:
    def __init__(self) -> None:
        self.scheduler = Scheduler()


def watching(replica: Replica) -> tuple[ShardWatchPolls, Scheduler, list[wire.Frame]]:
    group = Group()
    polls = ShardWatchPolls(replica.machine.gid, cast(GroupHandle, group), replica.machine)
    replica.machine.revision_listeners.append(polls.changed)
    return polls, group.scheduler, []


def poll(key: str, from_revision: int, wait_ms: int = 1_000, **fields: Any) -> wire.WatchPoll:
    return wire.WatchPoll(
        request_id=7, key=key, from_revision=from_revision, wait_ms=wait_ms, **fields
    )


def serving_replica() -> Replica:
    replica = Replica(1)
    replica.configure(1, [1] * SHARD_COUNT)
    return replica


def test_a_held_poll_is_answered_by_the_write_that_wakes_it() -> None:
    replica = serving_replica()
    key = key_in_shard(0)
    replica.write(key, "a", sequence=1)
    polls, scheduler, answers = watching(replica)
    polls.poll(poll(key, 2), 0, answers.append)
    assert answers == [] and len(polls.waiting) == 1
    replica.write(key_in_shard(0, 1), "other key", sequence=2)  # the shard moves, not the key
    scheduler.run_soon()
    assert answers == []
    replica.write(key, "b", sequence=3)
    scheduler.run_soon()
    [answer] = answers
    assert isinstance(answer, wire.WatchPollResult) and answer.failure is None
    assert [(event.kv.value, event.kv.mod_revision) for event in answer.events] == [(b"b", 3)]
    assert polls.waiting == [] and scheduler.later[0][0].cancelled


def test_a_poll_whose_wait_ends_is_answered_empty_at_the_shards_revision() -> None:
    replica = serving_replica()
    polls, scheduler, answers = watching(replica)
    polls.poll(poll(key_in_shard(1), 0), 1, answers.append)
    replica.write(key_in_shard(1, 1), "elsewhere in the shard", sequence=1)
    scheduler.run_soon()
    scheduler.fire_timers()
    [answer] = answers
    assert isinstance(answer, wire.WatchPollResult)
    assert answer.events == [] and answer.revision == 1 and answer.failure is None


def test_a_held_poll_gets_wrong_group_when_its_shard_moves_away() -> None:
    replica = serving_replica()
    polls, scheduler, answers = watching(replica)
    polls.poll(poll(key_in_shard(2), 1), 2, answers.append)
    replica.configure(2, [1, 1, 2, 1])  # shard 2 goes to group 2: BE_PULLING here
    scheduler.run_soon()
    [answer] = answers
    assert isinstance(answer, wire.ErrorResponse)
    assert answer.code is wire.ErrorCode.WRONG_GROUP and "shard 2" in answer.message


def test_a_poll_from_before_a_shard_arrived_without_history_is_told_it_moved() -> None:
    old_owner = serving_replica()
    key = key_in_shard(0)
    for sequence in range(1, 4):
        old_owner.write(key, f"v{sequence}", sequence=sequence)
    new_owner = Replica(2)
    new_owner.configure(1, [1] * SHARD_COUNT)
    for replica in (old_owner, new_owner):
        replica.configure(2, [2, 1, 1, 1])
    insert = insert_from(old_owner, 2, [0])
    new_owner.control(msgspec.structs.replace(insert, history=None, compacted_revisions=None))
    polls, _, answers = watching(new_owner)
    polls.poll(poll(key, 3), 0, answers.append)
    polls.poll(poll(key, 4, wait_ms=0), 0, answers.append)
    moved, after = answers
    assert isinstance(moved, wire.WatchPollResult) and moved.failure is not None
    assert moved.failure.code == SHARD_MOVED and "revision 3" in moved.failure.message
    assert isinstance(after, wire.WatchPollResult) and after.failure is None
    assert after.events == [] and after.revision == 3


def test_a_request_names_one_shard() -> None:
    machine = serving_replica().machine
    key = key_in_shard(3)
    assert requested_shard(poll(key, 0), machine) == 3
    assert requested_shard(poll(key, 0, shards=[3, 3]), machine) == 3
    assert "exactly one" in str(requested_shard(poll(key, 0, shards=[1, 3]), machine))
    assert "not in shard" in str(requested_shard(poll(key, 0, shards=[1]), machine))
    assert "outside" in str(requested_shard(poll(key, 0, shards=[SHARD_COUNT]), machine))
    assert "names its one shard" in str(requested_shard(poll(key, 0, end="\x00"), machine))
