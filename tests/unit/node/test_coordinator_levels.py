"""The coordinator leader and the cluster's feature level: it proposes no fencing field
before level 2 is committed in its log, and commits the level only once every member (and
every node heard from) said it, once at a time."""

from __future__ import annotations

from typing import Any

from quorumlog.codec import wire
from quorumlog.codec.feature_levels import BASELINE_FEATURE_LEVEL, GROUP_FENCING_LEVEL
from quorumlog.node.cluster_level import PeerLevels
from quorumlog.node.group_coordinator_service import GroupCoordinatorService
from quorumlog.raft.configuration import Configuration
from quorumlog.runtime.completion import Completion
from quorumlog.stream.group_coordinator import GroupCoordinatorMachine
from quorumlog.stream.group_model import (
    CommitOffsets,
    GroupCommand,
    GroupEntry,
    JoinGroup,
    PartitionOffset,
    decode_entry,
    encode_commands,
)
from quorumlog.testing.manual import ManualScheduler

CHECK_SECONDS = 0.1


class RecordingGroup:
    """Enough of a GroupHandle: proposals are kept, and applied when `commit` says so."""

    def __init__(self, scheduler: ManualScheduler, machine: GroupCoordinatorMachine) -> None:
        self.scheduler = scheduler
        self.machine = machine
        self.group_id = wire.GROUP_COORDINATOR_GROUP
        self.node_id = "n1"
        self.is_leader = True
        self.leader_id: str | None = "n1"
        self.configuration = Configuration(voters=("n1", "n2", "n3"))
        self.proposed: list[tuple[bytes, Completion[Any]]] = []
        self.index = 0

    def propose(self, data: bytes) -> Completion[Any]:
        completion: Completion[Any] = Completion(self.scheduler)
        self.proposed.append((data, completion))
        return completion

    def commit(self) -> list[GroupEntry]:
        """Apply every proposal so far, in order; the entries."""
        entries = []
        for data, completion in self.proposed:
            self.index += 1
            completion.set_result(self.machine.apply(self.index, data))
            entries.append(decode_entry(data))
        self.proposed.clear()
        self.scheduler.run_until_idle()
        return entries

    def linearizable_read(self) -> Completion[int]:
        completion: Completion[int] = Completion(self.scheduler)
        completion.set_result(self.index)
        return completion


class Leader:
    def __init__(self, levels: dict[str, int]) -> None:
        self.scheduler = ManualScheduler()
        self.machine = GroupCoordinatorMachine()
        self.group = RecordingGroup(self.scheduler, self.machine)
        self.peer_levels = PeerLevels("n1", own_level=GROUP_FENCING_LEVEL)
        for node_id, level in levels.items():
            self.peer_levels.heard(node_id, level)
        self.service = GroupCoordinatorService(
            self.group,  # type: ignore[arg-type]
            self.machine,
            lambda: None,
            lambda topic: 1,
            CHECK_SECONDS,
            peer_levels=self.peer_levels,
        )

    def send(self, command: GroupCommand) -> None:
        request = wire.GroupCoordinatorRequest(request_id=1, commands=encode_commands([command]))
        self.service.handle(request, lambda frame: None)
        self.scheduler.run_until_idle()

    def proposed_levels(self) -> list[int]:
        return [decode_entry(data).cluster_level for data, _ in self.group.proposed]


def join() -> JoinGroup:
    return JoinGroup("g", "m", "m", ["t"], owned=[], owned_generation=4)


def commit(sequence: int) -> CommitOffsets:
    return CommitOffsets("g", "m", 1, [PartitionOffset("t", 0, 9)], sequence)


def test_below_the_fencing_level_the_leader_proposes_no_fencing_field() -> None:
    leader = Leader({"n2": GROUP_FENCING_LEVEL, "n3": BASELINE_FEATURE_LEVEL})
    leader.send(join())
    [entry] = leader.group.commit()
    [[proposed_join]] = entry.batches
    assert isinstance(proposed_join, JoinGroup) and proposed_join.owned_generation is None
    leader.send(commit(7))
    [entry] = leader.group.commit()
    [[proposed_commit]] = entry.batches
    assert isinstance(proposed_commit, CommitOffsets) and proposed_commit.sequence == 0


def test_the_level_is_proposed_once_every_member_said_it_and_then_fields_go_through() -> None:
    leader = Leader({"n2": GROUP_FENCING_LEVEL})
    leader.service.check()
    assert leader.proposed_levels() == []  # n3 has said nothing yet
    leader.peer_levels.heard("n3", BASELINE_FEATURE_LEVEL)
    leader.service.check()
    assert leader.proposed_levels() == []  # n3 runs the release before the fencing
    leader.peer_levels.heard("n3", GROUP_FENCING_LEVEL)
    leader.service.check()
    leader.service.check()  # while one raise is in flight, no second
    assert leader.proposed_levels() == [GROUP_FENCING_LEVEL]
    leader.group.commit()
    assert leader.machine.cluster_level == GROUP_FENCING_LEVEL
    leader.service.check()
    assert leader.proposed_levels() == []  # committed: nothing more to raise
    leader.send(join())
    [entry] = leader.group.commit()
    [[proposed_join]] = entry.batches
    assert isinstance(proposed_join, JoinGroup) and proposed_join.owned_generation == 4


def test_a_node_heard_below_the_others_holds_the_level_back() -> None:
    """Not a member of the group, but heard from: its release may come to apply this log."""
    leader = Leader({"n2": GROUP_FENCING_LEVEL, "n3": GROUP_FENCING_LEVEL, "n4": 1})
    leader.service.check()
    assert leader.proposed_levels() == []
