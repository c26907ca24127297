"""The coordinator nodes of a group world: the SHIPPED machine and service.

Every node of the `SimCluster` runs `stream.group_coordinator.GroupCoordinatorMachine`
(wrapped only to show the checker each command it executes: `ObservedGroupMachine`)
behind the shipped `node.group_coordinator_service.GroupCoordinatorService`, whose
periodic check (silent members, partition counts) runs on the node's scheduler in virtual
time. Topics have fixed partition counts, as this node's view of the topics would give.

Feature levels (codec/feature_levels.py): every node says the level `feature_levels` gives
it (one mapping for all: as if every node had heard every other's handshake). A node below
this release's level stands for an older release: it decodes each entry as that release's
decoder does, dropping the trailing fields it does not know (`as_release_decodes`, a model
of msgspec's decoding kept apart from the gate it checks), and applies what is left with
this release's machine. (That machine also notes `revoking_since`, which session 6 lacks:
nothing reads it below level 2 under a leader of this release, and a session-6 snapshot
without it is the unit tests' case, tests/unit/node/test_cluster_level.py.) Tests change
the mapping and restart a node to upgrade it.

A node in `session_7_nodes` stands for the session-7 release, the one users run before
this one: it applied the fencing fields ungated and says no level (give it level 1 in
`feature_levels`). It is modelled apart from the rules below level 2 that it checks: its
machine is pinned at `GROUP_FENCING_LEVEL` (this release's rules there are session 7's:
the gate added nothing else to apply), so its service, when it leads, proposes the fields
as session 7's does, and it proposes no level; its decoder drops the raise field
(`SESSION_7_FIELD_COUNTS`) and its snapshots say no level.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from quorumlog.codec import wire
from quorumlog.codec.feature_levels import (
    BASELINE_FEATURE_LEVEL,
    FEATURE_LEVEL,
    GROUP_FENCING_LEVEL,
)
from quorumlog.node.cluster_level import PeerLevels
from quorumlog.node.group_coordinator_service import GroupCoordinatorService
from quorumlog.runtime.handle import GroupHandle
from quorumlog.stream.group_coordinator import (
    ConsumerGroupState,
    GroupCoordinatorMachine,
    GroupCoordinatorSnapshot,
    MemberState,
)
from quorumlog.stream.group_model import GroupCommand, GroupResult
from quorumlog.testing.sim.application import LeaderAddress, SimApplication, serving_only
from quorumlog.testing.sim.frame_network import RequestHandler

CHECK_INTERVAL_SECONDS = 0.1

ExecuteObserver = Callable[
    [GroupCoordinatorMachine, GroupCommand, ConsumerGroupState | None, GroupResult], None
]
"""Told after every command a machine executes: the machine, the command, a copy of its
group's state BEFORE the command (None: no such group), and the result."""


class ObservedGroupMachine(GroupCoordinatorMachine):
    """The shipped machine; `execute` also reports to the checker (it changes nothing)."""

    observer: ExecuteObserver | None = None
    release_level: int = FEATURE_LEVEL
    """The release this node stands for: below this one's, entries are decoded as that
    release's decoder reads them."""
    session_7: bool = False
    """Stands for the session-7 release (the module docstring)."""

    def apply(self, index: int, data: bytes) -> list[list[GroupResult]]:
        if self.session_7:
            data = cut_fields(data, SESSION_7_FIELD_COUNTS)
        elif self.release_level < FEATURE_LEVEL:
            data = as_release_decodes(data, self.release_level)
        return super().apply(index, data)

    def run_as_session_7(self) -> None:
        self.session_7 = True
        self.feature_level = GROUP_FENCING_LEVEL
        self.cluster_level = GROUP_FENCING_LEVEL

    def snapshot(self) -> bytes:
        data = super().snapshot()
        if not self.session_7:
            return data
        written = msgspec.msgpack.decode(data, type=GroupCoordinatorSnapshot)
        # Session 7 wrote no level: a decoder of this release reads the baseline.
        return msgspec.msgpack.encode(
            msgspec.structs.replace(written, cluster_level=BASELINE_FEATURE_LEVEL)
        )

    def restore(self, data: bytes) -> None:
        super().restore(data)
        if self.session_7:
            self.cluster_level = GROUP_FENCING_LEVEL

    def execute(self, command: GroupCommand) -> GroupResult:
        observer = self.observer
        if observer is None:
            return super().execute(command)
        name = getattr(command, "group", None)
        state = self.groups.get(name) if isinstance(name, str) else None
        before = None if state is None else copy_state(state)
        result = super().execute(command)
        observer(self, command, before, result)
        return result


RELEASE_FIELD_COUNTS: dict[int, dict[str, int]] = {
    BASELINE_FEATURE_LEVEL: {"entry": 2, "join": 8, "commit": 4},
}
"""Per older release: the fields its decoder knew of the log entry and of each command (by
tag) whose fields grew since; the table of codec/feature_levels.py, counted by hand."""


SESSION_7_FIELD_COUNTS: dict[str, int] = {"entry": 2}
"""The session-7 release's decoder: every command field of this one, the entry without the
level."""


def as_release_decodes(data: bytes, level: int) -> bytes:
    """A coordinator entry as the release of feature `level` decodes it: every array_like
    struct cut to the fields that release knew (msgspec drops unknown trailing fields), then
    encoded again for this release's machine."""
    return cut_fields(data, RELEASE_FIELD_COUNTS[level])


def cut_fields(data: bytes, counts: Mapping[str, int]) -> bytes:
    """A coordinator entry cut to `counts` fields (of the entry, and of each command by
    tag; a tag not named keeps all of its fields)."""
    entry: list[Any] = msgspec.msgpack.decode(data)[: counts["entry"]]
    entry[1] = [
        [command[: 1 + counts.get(command[0], len(command))] for command in batch]
        for batch in entry[1]
    ]
    return msgspec.msgpack.encode(entry)


def copy_state(state: ConsumerGroupState) -> ConsumerGroupState:
    return ConsumerGroupState(
        group=state.group,
        generation=state.generation,
        assignor=state.assignor,
        members={
            member_id: MemberState(
                member_id=member.member_id,
                client_id=member.client_id,
                topics=list(member.topics),
                session_timeout_ms=member.session_timeout_ms,
                assignment=list(member.assignment),
                revoking=list(member.revoking),
                revoking_since=member.revoking_since,
                commit_sequence=member.commit_sequence,
            )
            for member_id, member in state.members.items()
        },
        partition_counts=dict(state.partition_counts),
        offsets={topic: dict(partitions) for topic, partitions in state.offsets.items()},
    )


def coordinator_application(
    partition_counts: Mapping[str, int],
    observer: ExecuteObserver,
    feature_levels: dict[str, int] | None = None,
    session_7_nodes: frozenset[str] = frozenset(),
) -> SimApplication[ObservedGroupMachine]:
    """`feature_levels`: node id → the level its release runs (read at each start of the
    node); None: every node runs this release. `session_7_nodes`: nodes on the session-7
    release (the module docstring), read at each start too."""

    def machine_factory() -> ObservedGroupMachine:
        machine = ObservedGroupMachine()
        machine.observer = observer
        return machine

    def partition_count(topic: str) -> int:
        return partition_counts.get(topic, 0)

    def service_factory(
        group: GroupHandle, machine: ObservedGroupMachine, leader_address: LeaderAddress
    ) -> RequestHandler:
        peer_levels = PeerLevels(group.node_id)
        if feature_levels is not None:
            peer_levels.levels = feature_levels
            # Before any entry is applied: the host only restores the snapshot before this.
            machine.feature_level = feature_levels.get(group.node_id, FEATURE_LEVEL)
            machine.release_level = machine.feature_level
        else:
            peer_levels.levels = dict.fromkeys(group.configuration.members(), FEATURE_LEVEL)
        if group.node_id in session_7_nodes:
            machine.run_as_session_7()
        service = GroupCoordinatorService(
            group,
            machine,
            leader_address,
            partition_count,
            CHECK_INTERVAL_SECONDS,
            peer_levels=None if machine.session_7 else peer_levels,
        )
        service.start()
        return serving_only(wire.GroupCoordinatorRequest, service.handle, "coordinator")

    return SimApplication(machine_factory, service_factory)
