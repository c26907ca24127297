"""Serves the consumer-group coordinator: joins, leaves and commits through its log, reads
and heartbeats behind a ReadIndex round, and the leader's periodic check that removes
members silent past their session timeout.

The coordinator is its own Raft group, "consumer-groups", hosted on every node with the
bootstrap members of the "kv" group, for the reasons the HA controller has one
(node/ha_controller_service.py): joins and commits would crowd the metadata log and tie
the KV machine's snapshot format to this one.

Heartbeats do not go through the log: a join that changes nothing is answered by the
leader from its applied state once a ReadIndex round confirmed it still leads and has
applied everything committed before the heartbeat came (else a deposed leader, or a new
one that has not yet applied its predecessor's last commits, answers with an older
generation: found by the simulator, testing/sim/groups/), and the leader notes the
member's last heartbeat in memory (by its monotonic clock). Only what changes the group
is logged: a new member or subscription, a changed partition count, a leave, a commit, and
`ExpireMembers` naming the members the leader found silent. A new leader first carries
over the offsets the previous release kept in the "kv" group, holding client requests back
meanwhile (node/offsets_import.py). A new leader knows no heartbeats yet, so it counts every
member as heard from when it first looks (one session timeout of grace, as a new etcd
leader extends leases): a member is never removed for the time the coordinator had no
leader. Partition counts come from this node's view of the topics (the metadata group it
replicates); a count that changes starts a new generation through `UpdatePartitions`.

Rolling upgrades (codec/feature_levels.py): the leader commits the feature level its
group's members and every node heard from agree on (the lowest they said) into this
group's log, once it is above the committed one, and until a level is committed it
proposes commands without the fields that level added (`at_level`), so a session-6
replica, which drops them at decode, applies every entry as the others do (replicas of
this release and of session 7 honour the fields whenever the log holds them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec

from quorumlog.codec import wire
from quorumlog.codec.feature_levels import level_to_propose
from quorumlog.errors import GroupCoordinatorLoadingError, QuorumLogError
from quorumlog.node.batched_proposals import BatchedProposals
from quorumlog.node.cluster_level import PeerLevels
from quorumlog.node.command_requests import accepted_commands
from quorumlog.node.errors_to_wire import after_read_barrier, error_response
from quorumlog.node.offsets_import import OffsetsImport, PreviousOffsets
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.handle import GroupHandle
from quorumlog.runtime.resources import Timer
from quorumlog.stream.group_coordinator import GroupCoordinatorMachine
from quorumlog.stream.group_model import (
    QUERY_TYPES,
    ExpireMembers,
    GroupCommand,
    GroupEntry,
    GroupResult,
    JoinGroup,
    UpdatePartitions,
    at_level,
    decode_commands,
    encode_entry,
    encode_results,
)

log = logging.getLogger("quorumlog.node")

Replier = Callable[[wire.Frame], None]
COMMANDS_PER_REQUEST_MAX = 100
CHECK_INTERVAL_SECONDS_DEFAULT = 0.1
"""How often the coordinator leader looks for silent members and changed partition counts
(the detection delay it adds to a session timeout)."""


class GroupCoordinatorService:
    def __init__(
        self,
        group: GroupHandle,
        machine: GroupCoordinatorMachine,
        leader_address: Callable[[], str | None],
        partition_count: Callable[[str], int],
        check_interval_seconds: float = CHECK_INTERVAL_SECONDS_DEFAULT,
        previous_offsets: PreviousOffsets | None = None,
        peer_levels: PeerLevels | None = None,
    ) -> None:
        """`partition_count(topic)`: the topic's partitions as this node knows them (0 for
        a topic it does not know). `previous_offsets`: where the previous release kept
        committed offsets, carried over once per leadership (node/offsets_import.py);
        None: nothing to carry over. `peer_levels`: the feature levels the nodes said, to
        agree the group's level on; None: the level stays where the log has it."""
        if check_interval_seconds <= 0:
            raise ValueError(
                f"check_interval_seconds must be positive, got {check_interval_seconds}"
            )
        self.group = group
        self.machine = machine
        self.leader_address = leader_address
        self.partition_count = partition_count
        self.check_interval_seconds = check_interval_seconds
        self.proposals: BatchedProposals[list[GroupCommand]] = BatchedProposals(
            group, make_entry, answer, self.reject
        )
        self.timer: Timer | None = None
        self.heard_seconds: dict[tuple[str, str], float] = {}
        """(group, member) → when this leader last heard from the member (monotonic)."""
        self.changes_in_flight: set[tuple[str, str]] = set()
        """(group, kind) of expiries and partition updates proposed and not yet applied."""
        self.offsets_import = (
            None if previous_offsets is None else OffsetsImport(group, previous_offsets)
        )
        self.peer_levels = peer_levels
        self.level_in_flight = False

    # --- client requests -------------------------------------------------------------------

    def reject(self, reply: Replier, request_id: int, error: BaseException) -> None:
        reply(error_response(request_id, error, self.leader_address))

    def handle(self, request: wire.GroupCoordinatorRequest, reply: Replier) -> None:
        commands = accepted_commands(
            request.request_id,
            request.commands,
            decode_commands,
            COMMANDS_PER_REQUEST_MAX,
            self.group,
            self.leader_address,
            reply,
            "commands",
        )
        if commands is None:
            return
        if self.offsets_import is not None and self.offsets_import.loading:
            self.reject(
                reply,
                request.request_id,
                GroupCoordinatorLoadingError(
                    "the coordinator leader is carrying over the previous release's offsets"
                ),
            )
            return
        if all(isinstance(command, QUERY_TYPES) for command in commands):
            self.query(request.request_id, commands, reply)
            return
        # Below the level that added a field, an older replica would drop it: leave it out.
        level = self.machine.cluster_level
        filled = [at_level(self.with_counts(command), level) for command in commands]
        for command in filled:
            self.note_heard(command)
        if any(self.heartbeat_answer(command) is None for command in filled):
            self.proposals.add(request.request_id, filled, reply)
            return

        def answer_heartbeats() -> None:
            # Looked at again: entries applied during the round may have changed the group.
            answers = [self.heartbeat_answer(command) for command in filled]
            results = [result for result in answers if result is not None]
            if len(results) < len(answers):
                self.proposals.add(request.request_id, filled, reply)
                return
            answer(reply, request.request_id, results)

        # Behind a ReadIndex round, as a describe is: a deposed leader that has not noticed
        # yet, or a new one whose applied state lags what its predecessor committed, would
        # answer from an older generation, and a member that already gave a partition up
        # would take it back while its new owner reads it.
        after_read_barrier(
            self.group.linearizable_read,
            request.request_id,
            reply,
            self.leader_address,
            answer_heartbeats,
        )

    def with_counts(self, command: GroupCommand) -> GroupCommand:
        """A join with the partition counts of its topics as this node knows them."""
        if not isinstance(command, JoinGroup):
            return command
        counts = {topic: self.partition_count(topic) for topic in sorted(set(command.topics))}
        return msgspec.structs.replace(command, partition_counts=counts)

    def note_heard(self, command: GroupCommand) -> None:
        """A join is a member's heartbeat: it is not silent."""
        if isinstance(command, JoinGroup):
            self.heard_seconds[(command.group, command.member_id)] = (
                self.group.scheduler.monotonic_seconds()
            )

    def heartbeat_answer(self, command: GroupCommand) -> GroupResult | None:
        """The answer to a join that changes nothing, from the applied state (to be sent
        only once a read barrier confirmed that state); None if it must go through the log."""
        if not isinstance(command, JoinGroup):
            return None
        return self.machine.heartbeat_answer(command)

    def query(self, request_id: int, commands: list[GroupCommand], reply: Replier) -> None:
        def respond() -> None:
            results = [self.machine.execute(command) for command in commands]
            reply(
                wire.GroupCoordinatorResponse(
                    request_id=request_id, results=encode_results(results)
                )
            )

        after_read_barrier(
            self.group.linearizable_read, request_id, reply, self.leader_address, respond
        )

    # --- the leader's check ----------------------------------------------------------------

    def start(self) -> None:
        if self.timer is None:
            self.timer = self.group.scheduler.call_later(self.check_interval_seconds, self.tick)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def tick(self) -> None:
        self.timer = self.group.scheduler.call_later(self.check_interval_seconds, self.tick)
        self.check()

    def check(self) -> None:
        """While leading: remove silent members, and start a generation for any group
        whose subscribed topics changed partition count."""
        if self.offsets_import is not None:
            self.offsets_import.check()
        if not self.group.is_leader:
            # Heartbeats heard while leading before are stale for a later term.
            self.heard_seconds.clear()
            return
        self.propose_level()
        if self.offsets_import is not None and self.offsets_import.loading:
            # Heartbeats are held back meanwhile: nobody is counted silent until it ends.
            return
        now_seconds = self.group.scheduler.monotonic_seconds()
        for name in sorted(self.machine.groups):
            state = self.machine.groups[name]
            silent = []
            for member_id, member in sorted(state.members.items()):
                heard = self.heard_seconds.setdefault((name, member_id), now_seconds)
                if now_seconds - heard > member.session_timeout_ms / 1000:
                    silent.append(member_id)
            if silent:
                self.propose_change(name, "expire", ExpireMembers(name, silent))
            counts = {topic: self.partition_count(topic) for topic in state.partition_counts}
            subscribed = {topic for member in state.members.values() for topic in member.topics}
            counts.update({t: self.partition_count(t) for t in subscribed - set(counts)})
            if any(state.partition_counts.get(t, 0) != n for t, n in counts.items()):
                self.propose_change(name, "partitions", UpdatePartitions(name, counts))
        live = {(name, m) for name, state in self.machine.groups.items() for m in state.members}
        for key in [key for key in self.heard_seconds if key not in live]:
            del self.heard_seconds[key]

    def propose_level(self) -> None:
        """Commit the feature level the members agree on, if above the committed one."""
        if self.peer_levels is None or self.level_in_flight:
            return
        agreed = self.peer_levels.agreed(self.group.configuration.members())
        level = level_to_propose(self.machine.cluster_level, agreed, self.machine.feature_level)
        if level is None:
            return
        entry = GroupEntry(self.group.scheduler.wall_time_ms(), [], cluster_level=level)
        try:
            future = self.group.propose(encode_entry(entry))
        except QuorumLogError as error:
            log.info("group coordinator: feature level %d not proposed: %s", level, error)
            return
        self.level_in_flight = True

        def done(completion: Completion[Any]) -> None:
            self.level_in_flight = False
            if completion.exception() is None:
                log.info("group coordinator: feature level %d committed", level)

        future.add_done_callback(done)

    def propose_change(self, name: str, kind: str, command: GroupCommand) -> None:
        key = (name, kind)
        if key in self.changes_in_flight:
            return
        entry = make_entry(self.group.scheduler.wall_time_ms(), [[command]])
        try:
            future = self.group.propose(entry)
        except QuorumLogError as error:
            log.info("group coordinator: %s of %s not proposed: %s", kind, name, error)
            return
        self.changes_in_flight.add(key)

        def done(completion: Completion[Any]) -> None:
            self.changes_in_flight.discard(key)
            if completion.exception() is None and isinstance(command, ExpireMembers):
                log.info(
                    "consumer group %s: removed silent members %s",
                    name,
                    ", ".join(command.member_ids),
                )

        future.add_done_callback(done)


def make_entry(timestamp_ms: int, batches: list[list[GroupCommand]]) -> bytes:
    return encode_entry(GroupEntry(timestamp_ms=timestamp_ms, batches=batches))


def answer(reply: Replier, request_id: int, results: list[GroupResult]) -> None:
    reply(wire.GroupCoordinatorResponse(request_id=request_id, results=encode_results(results)))


__all__ = ["CHECK_INTERVAL_SECONDS_DEFAULT", "GroupCoordinatorService"]
