"""GroupCoordinatorService on a manual scheduler and a one-replica stand-in group: members
that heartbeat stay, a silent one is removed after its session timeout (and no sooner), a
new coordinator leader grants one session timeout of grace, and a topic that grows starts
a new generation."""

from __future__ import annotations

from typing import Any

from quorumlog.codec import wire
from quorumlog.node.group_coordinator_service import GroupCoordinatorService
from quorumlog.runtime.completion import Completion
from quorumlog.stream.group_coordinator import GroupCoordinatorMachine
from quorumlog.stream.group_model import (
    GroupResult,
    JoinGroup,
    decode_results,
    encode_commands,
)
from quorumlog.testing.manual import ManualScheduler

SESSION_MS = 2_000
CHECK_SECONDS = 0.1


class OneReplicaGroup:
    """Enough of a GroupHandle: a proposal applies at once, on this one machine."""

    def __init__(self, scheduler: ManualScheduler, machine: GroupCoordinatorMachine) -> None:
        self.scheduler = scheduler
        self.machine = machine
        self.group_id = wire.GROUP_COORDINATOR_GROUP
        self.node_id = "n1"
        self.is_leader = True
        self.leader_id: str | None = "n1"
        self.index = 0

    def propose(self, data: bytes) -> Completion[Any]:
        self.index += 1
        completion: Completion[Any] = Completion(self.scheduler)
        completion.set_result(self.machine.apply(self.index, data))
        return completion

    def linearizable_read(self) -> Completion[int]:
        completion: Completion[int] = Completion(self.scheduler)
        completion.set_result(self.index)
        return completion


class Harness:
    def __init__(self) -> None:
        self.scheduler = ManualScheduler()
        self.machine = GroupCoordinatorMachine()
        self.group = OneReplicaGroup(self.scheduler, self.machine)
        self.partitions = {"t": 3}
        self.service = GroupCoordinatorService(
            self.group,  # type: ignore[arg-type]
            self.machine,
            lambda: None,
            lambda topic: self.partitions.get(topic, 0),
            CHECK_SECONDS,
        )
        self.service.start()

    def join(self, member: str, owned: list[tuple[str, int]] | None = None) -> GroupResult:
        answers: list[wire.Frame] = []
        command = JoinGroup("g", member, "c", ["t"], SESSION_MS, owned=owned)
        request = wire.GroupCoordinatorRequest(request_id=1, commands=encode_commands([command]))
        self.service.handle(request, answers.append)
        self.scheduler.run_until_idle()
        [answer] = answers
        assert isinstance(answer, wire.GroupCoordinatorResponse), answer
        [result] = decode_results(answer.results)
        return result

    def members(self) -> list[str]:
        info = self.machine.group_info("g")
        return [] if info is None else [member.member_id for member in info.members]

    def beat_for(self, seconds: float, *members: str) -> None:
        """Advance time, the given members heartbeating every half second."""
        for _ in range(int(seconds / 0.5)):
            self.scheduler.advance(0.5)
            for member in members:
                self.join(member)


def test_a_silent_member_is_removed_after_its_session_timeout_and_no_sooner() -> None:
    harness = Harness()
    harness.join("a")
    assert harness.join("b").generation == 2
    harness.beat_for(1.5, "a")  # b silent for 1.5 s: still a member
    assert harness.members() == ["a", "b"]
    harness.beat_for(1.5, "a")  # now past 2 s: removed
    assert harness.members() == ["a"]
    survivor = harness.join("a")
    assert survivor.generation == 4  # b joined, a let go of b's partition, b was removed
    assert survivor.assignment == [("t", 0), ("t", 1), ("t", 2)]
    log_entries = harness.group.index
    harness.beat_for(3.0, "a")
    assert harness.group.index == log_entries  # heartbeats that change nothing are not logged
    harness.service.stop()
    assert harness.scheduler.timer_count == 0


def test_a_new_leader_grants_a_session_of_grace() -> None:
    harness = Harness()
    harness.join("a")
    harness.group.is_leader = False
    harness.scheduler.advance(10.0)  # no leader for five session timeouts
    harness.group.is_leader = True
    harness.beat_for(1.5)  # within the grace: nobody heard from yet, nobody removed
    assert harness.members() == ["a"]
    harness.beat_for(1.5, "a")
    assert harness.members() == ["a"]


def test_a_topic_that_grows_starts_a_generation() -> None:
    harness = Harness()
    assert harness.join("a").generation == 1
    harness.partitions["t"] = 4
    harness.beat_for(0.5, "a")
    grown = harness.join("a")
    assert grown.generation == 2 and len(grown.assignment) == 4


def test_a_hand_over_waiting_on_an_owner_that_goes_silent_completes() -> None:
    """The owner of a partition the group moves stops heartbeating before it lets go (a
    process that hangs): the partition goes to its new owner once the session times out,
    and the group stops rebalancing."""
    harness = Harness()
    everything = harness.join("a", owned=[]).assignment
    withheld = harness.join("b", owned=[])
    assert withheld.assignment == [] and withheld.rebalancing
    harness.beat_for(1.5, "b")  # a still holds all three: b waits
    assert harness.join("b", owned=[]).assignment == []
    harness.beat_for(1.0, "b")  # past a's session: removed, and the hand-over completes
    assert harness.members() == ["b"]
    taken = harness.join("b", owned=[])
    assert taken.assignment == everything and not taken.rebalancing
