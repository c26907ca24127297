"""The coordinator nodes of a group world: the SHIPPED machine and service.

Every node of the `SimCluster` runs `stream.group_coordinator.GroupCoordinatorMachine`
(wrapped only to show the checker each command it executes: `ObservedGroupMachine`)
behind the shipped `node.group_coordinator_service.GroupCoordinatorService`, whose
periodic check (silent members, partition counts) runs on the node's scheduler in virtual
time. Topics have fixed partition counts, as this node's view of the topics would give.

Feature levels (codec/feature_levels.py): every node says the level `feature_levels` gives
it (one mapping for all: as if every node had heard every other's handshake), and applies
by the rules of that level at most, as a node of that release would. Tests change the
mapping and restart a node to upgrade it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from quorumlog.codec import wire
from quorumlog.codec.feature_levels import FEATURE_LEVEL
from quorumlog.node.cluster_level import PeerLevels
from quorumlog.node.group_coordinator_service import GroupCoordinatorService
from quorumlog.runtime.handle import GroupHandle
from quorumlog.stream.group_coordinator import (
    ConsumerGroupState,
    GroupCoordinatorMachine,
    MemberState,
)
from quorumlog.stream.group_model import GroupCommand, GroupResult
from quorumlog.testing.sim.application import LeaderAddress, SimApplication
from quorumlog.testing.sim.frame_network import Replier, RequestHandler

CHECK_INTERVAL_SECONDS = 0.1

ExecuteObserver = Callable[
    [GroupCoordinatorMachine, GroupCommand, ConsumerGroupState | None, GroupResult], None
]
"""Told after every command a machine executes: the machine, the command, a copy of its
group's state BEFORE the command (None: no such group), and the result."""


class ObservedGroupMachine(GroupCoordinatorMachine):
    """The shipped machine; `execute` also reports to the checker (it changes nothing)."""

    observer: ExecuteObserver | None = None

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
) -> SimApplication[ObservedGroupMachine]:
    """`feature_levels`: node id → the level its release runs (read at each start of the
    node); None: every node runs this release."""

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
        else:
            peer_levels.levels = dict.fromkeys(group.configuration.members(), FEATURE_LEVEL)
        service = GroupCoordinatorService(
            group,
            machine,
            leader_address,
            partition_count,
            CHECK_INTERVAL_SECONDS,
            peer_levels=peer_levels,
        )
        service.start()

        def handle(request: wire.ClientRequest, reply: Replier) -> None:
            if isinstance(request, wire.GroupCoordinatorRequest):
                service.handle(request, reply)
                return
            reply(
                wire.ErrorResponse(
                    request_id=request.request_id,
                    code=wire.ErrorCode.BAD_REQUEST,
                    message=f"the simulated coordinator serves no {type(request).__name__}",
                )
            )

        return handle

    return SimApplication(machine_factory, service_factory)
