"""Kafka's max.poll.interval.ms: the poll timer on a virtual clock; a member whose
application stops polling leaves its group from the heartbeat loop (against the real
coordinator machine), so a hand-over waiting on it completes; and a Consumer that did so
gives its partitions up as lost, is refused its late commits, and joins again on poll."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import msgspec
import pytest

from quorumlog import Admin, Consumer, Producer
from quorumlog.errors import CommitFailedError
from quorumlog.stream.assignors import TopicPartition
from quorumlog.stream.group_coordinator import GroupCoordinatorMachine
from quorumlog.stream.group_model import (
    GroupCommand,
    GroupEntry,
    GroupResult,
    JoinGroup,
    LeaveGroup,
    encode_entry,
)
from quorumlog.stream.membership import Membership
from quorumlog.stream.poll_interval import PollTimer
from tests.unit.kv.fake_cluster import ClusterThread
from tests.unit.stream.fake_stream_cluster import FakeStreamCluster

WAIT_SECONDS = 20.0
ALL = [("t", 0), ("t", 1), ("t", 2)]


class VirtualClock:
    def __init__(self) -> None:
        self.now_seconds = 1000.0

    def __call__(self) -> float:
        return self.now_seconds


def test_the_poll_timer_counts_only_the_time_outside_poll() -> None:
    clock = VirtualClock()
    timer = PollTimer(60_000, clock)
    clock.now_seconds += 59.9
    assert not timer.overdue() and timer.seconds_left() == pytest.approx(0.1)
    timer.poll_started()
    clock.now_seconds += 600.0  # a long poll: the application is not stuck
    assert not timer.overdue() and timer.seconds_left() == float("inf")
    timer.poll_ended()  # the interval runs from the end of the poll
    clock.now_seconds += 60.0
    assert timer.overdue()
    timer.restart()
    assert not timer.overdue()
    for wrong in (0, 2**31):
        with pytest.raises(ValueError, match="max_poll_interval_ms"):
            PollTimer(wrong, clock)


class MachineLink:
    """A CoordinatorLink answered by one real coordinator machine (heartbeats from its
    state, the rest through its apply, as the coordinator leader does)."""

    def __init__(self) -> None:
        self.machine = GroupCoordinatorMachine()
        self.index = 0
        self.sent: list[GroupCommand] = []

    async def send(self, what: str, command: GroupCommand) -> GroupResult:
        self.sent.append(command)
        return self.run(command)

    def run(self, command: GroupCommand) -> GroupResult:
        if isinstance(command, JoinGroup):
            command = msgspec.structs.replace(command, partition_counts={"t": 3})
            unchanged = self.machine.heartbeat_answer(command)
            if unchanged is not None:
                return unchanged
        self.index += 1
        entry = encode_entry(GroupEntry(timestamp_ms=0, batches=[[command]]))
        [[result]] = self.machine.apply(self.index, entry)
        return result

    def joins_of(self, member_id: str) -> int:
        return sum(isinstance(c, JoinGroup) and c.member_id == member_id for c in self.sent)


def join_as(member_id: str) -> JoinGroup:
    return JoinGroup("g", member_id, member_id, ["t"], 10_000, owned=[])


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


async def stuck_member_scenario() -> None:
    clock = VirtualClock()
    link = MachineLink()
    stuck = Membership(
        link,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        "g",
        "stuck",
        10_000,
        0.005,
        "cooperative-sticky",
        max_poll_interval_ms=60_000,
        clock=clock,
    )
    await stuck.subscribe(["t"], None)
    assert sorted(stuck.latest().assignment) == ALL
    stuck.hold(stuck.latest().assignment)  # the application took them up, then got stuck
    withheld = link.run(join_as("other"))
    assert withheld.assignment == [] and withheld.rebalancing
    # Heartbeats go on with the stuck member holding all three: the hand-over waits, and
    # the group heartbeats at the rebalance pace meanwhile.
    clock.now_seconds += 59.0
    beats = link.joins_of(stuck.member_id)
    await wait_until(lambda: link.joins_of(stuck.member_id) >= beats + 5, "more heartbeats")
    assert not any(isinstance(command, LeaveGroup) for command in link.sent)
    assert link.run(join_as("other")).assignment == []
    clock.now_seconds += 1.5  # past the interval since the subscription, no poll since
    await wait_until(lambda: stuck.latest().left_group, "the stuck member leaving")
    left_as = stuck.member_id
    await wait_until(lambda: LeaveGroup("g", left_as) in link.sent, "the leave being sent")
    taken = link.run(join_as("other"))
    assert sorted(taken.assignment) == ALL and not taken.rebalancing
    # No more heartbeats, and none that a fenced commit's retry would send either.
    assert stuck.task is not None
    await wait_until(stuck.task.done, "the heartbeat loop ending")
    sent = len(link.sent)
    await stuck.heartbeat()
    assert len(link.sent) == sent and stuck.latest().left_group
    # The next poll joins again, as a new member.
    await stuck.rejoin()
    assert stuck.member_id != left_as and not stuck.latest().left_group
    assert stuck.latest().generation == taken.generation + 1
    info = link.machine.group_info("g")
    assert info is not None and [m.member_id for m in info.members] == sorted(
        ["other", stuck.member_id]
    )
    assert not stuck.task.done()
    await stuck.leave()


def test_a_member_that_stops_polling_leaves_and_the_hand_over_waiting_on_it_completes() -> None:
    asyncio.run(stuck_member_scenario())


@pytest.fixture
def cluster() -> Iterator[FakeStreamCluster]:
    with ClusterThread(FakeStreamCluster()) as running:
        yield running  # type: ignore[misc]


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def test_a_consumer_past_its_poll_interval_loses_its_partitions_and_rejoins_on_poll(
    cluster: FakeStreamCluster,
) -> None:
    with Admin(cluster.endpoints) as admin:
        admin.create_topic("events", partitions=2)
    with Producer(cluster.endpoints) as producer:
        for number in range(10):
            producer.send("events", b"%d" % number, partition=number % 2)
        producer.flush(timeout=10)
    lost: list[set[TopicPartition]] = []
    both = {("events", 0), ("events", 1)}
    with Consumer(
        cluster.endpoints,
        group="g",
        auto_offset_reset="earliest",
        heartbeat_interval_seconds=0.05,
        max_poll_interval_ms=1000,
        on_revoke=lost.append,
    ) as consumer:
        consumer.subscribe(["events"])
        seen: set[tuple[int, int]] = set()
        deadline = time.monotonic() + WAIT_SECONDS
        while len(seen) < 10:
            seen |= {(r.partition, r.offset) for r in consumer.poll(1.0)}
            assert time.monotonic() < deadline, "the records were never read"
        consumer.commit("events", 0, 2)  # only part of the work is done
        first_member = members(cluster)
        # The application is stuck now: no poll. The member leaves at once.
        wait_for(lambda: members(cluster) == [], "the member leaving the group")
        with pytest.raises(CommitFailedError, match="max_poll_interval_ms"):
            consumer.commit()
        failed = consumer.commit_async()
        assert isinstance(failed.exception(timeout=10), CommitFailedError)
        # Nothing of what it did not finish was committed, and nothing was revoked yet.
        assert (consumer.committed("events", 0), consumer.committed("events", 1)) == (2, None)
        assert lost == []
        again: list[tuple[int, int]] = []
        deadline = time.monotonic() + WAIT_SECONDS
        while len(again) < 8:  # read on from the last commits: 3 + 5 records
            again += [(r.partition, r.offset) for r in consumer.poll(1.0)]
            assert time.monotonic() < deadline, "the consumer never read again"
        assert lost == [both], "the lost partitions went to on_revoke"
        assert sorted(again) == sorted({(0, o) for o in range(2, 5)} | {(1, o) for o in range(5)})
        rejoined = members(cluster)
        assert len(rejoined) == 1 and rejoined != first_member
        assert consumer.assignment() == both
        assert (consumer.committed("events", 0), consumer.committed("events", 1)) == (2, None)


def members(cluster: FakeStreamCluster) -> list[str]:
    info = cluster.coordinator.group_info("g")
    return [] if info is None else [member.member_id for member in info.members]


def test_an_on_revoke_that_raises_for_lost_partitions_still_joins_again(
    cluster: FakeStreamCluster,
) -> None:
    with Admin(cluster.endpoints) as admin:
        admin.create_topic("events", partitions=2)
    armed = False

    def on_revoke(partitions: set[TopicPartition]) -> None:
        if armed:
            raise RuntimeError("the application's callback failed")

    with Consumer(
        cluster.endpoints,
        group="g",
        heartbeat_interval_seconds=0.05,
        max_poll_interval_ms=500,
        on_revoke=on_revoke,
    ) as consumer:
        consumer.subscribe(["events"])
        consumer.poll(0.1)
        wait_for(lambda: members(cluster) == [], "the member leaving the group")
        armed = True
        with pytest.raises(RuntimeError, match="callback failed"):
            consumer.poll(0.1)
        armed = False  # close revokes again
        assert len(members(cluster)) == 1, "joined again although on_revoke raised"
        assert consumer.poll(0.1) == []
        assert consumer.assignment() == {("events", 0), ("events", 1)}
