"""The consumer-group coordinator's replicated state machine: per group its members, their
subscriptions and assignments, the generation, and the committed offsets.

Every replica of the "consumer-groups" Raft group applies the same entries in the same
order and so holds the same groups and answers the same (see `group_model` for the
protocol). Nothing here reads a clock or does I/O: who is silent past their session
timeout is decided by the coordinator leader, which proposes `ExpireMembers` naming them;
applying it only removes the named members. Member ids come from the clients, so a join
retried after a lost answer is the same member, not a second one.

Every change of membership, subscriptions or partition counts bumps the generation and
recomputes the assignment with the group's assignor from the previous one (so the sticky
assignor keeps what it can); a partition moving between live members goes in two
generations (taken, then given once its owner says it let go). Commits are fenced by
generation (`group_model` docstring, for both).

Snapshots are msgspec MessagePack of the whole state, groups sorted by name: the same state
always gives the same bytes. A well-formed entry never makes `apply` raise; bytes that do
not decode are corruption. `ImportOffsets` (offsets carried over from the previous
release's `__offsets/` keys) writes only into the committed offsets, so it left the
snapshot format as it was.

Rolling upgrades (codec/feature_levels.py): the feature level is committed in this group's
own log (`GroupEntry.cluster_level`) and kept in snapshots. Apply does not depend on it:
below level 2 it follows the session-7 release's rules, which apply the fencing fields
whenever the log holds them and always note `MemberState.revoking_since`, so a replica of
this release at level 1 applies every entry as a session-7 replica does. What keeps a
session-6 replica (which drops the fields at decode) in step is the leader: below level 2
it proposes no fencing field (`group_model.at_level`), so every replica applies the same
commands. The one state a session-6 replica's snapshot can leave different is
`revoking_since` (session 6 never noted it); applying the raise to level 2 sets it from
state every release shares (`normalise_revocations`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import msgspec

from quorumlog.codec import wire
from quorumlog.codec.feature_levels import (
    BASELINE_FEATURE_LEVEL,
    FEATURE_LEVEL,
    GROUP_FENCING_LEVEL,
    check_level,
    raised,
)
from quorumlog.kv.machine import MalformedEntryError, decode_log_entry
from quorumlog.raft.invariants import require
from quorumlog.stream.assignors import ASSIGNORS, assign
from quorumlog.stream.group_model import (
    NO_GENERATION,
    SESSION_TIMEOUT_MS_MAX,
    SESSION_TIMEOUT_MS_MIN,
    CommitOffsets,
    DeleteGroup,
    DescribeGroup,
    ExpireMembers,
    GroupCommand,
    GroupInfo,
    GroupResult,
    ImportOffsets,
    JoinGroup,
    LeaveGroup,
    ListGroups,
    MemberInfo,
    PartitionOffset,
    Refusal,
    ResetOffsets,
    UpdatePartitions,
    decode_entry,
    refused,
)

SNAPSHOT_FORMAT_VERSION = 1
GROUP_COUNT_MAX = 100_000
MEMBERS_PER_GROUP_MAX = 1_000
TOPICS_PER_MEMBER_MAX = 1_000
NAME_BYTES_MAX = 256
"""Group names, member ids and topic names longer than this are refused."""


class MemberState(msgspec.Struct, array_like=True):
    member_id: str
    client_id: str
    topics: list[str]
    session_timeout_ms: int
    assignment: list[tuple[str, int]] = msgspec.field(default_factory=list)
    revoking: list[tuple[str, int]] = msgspec.field(default_factory=list)
    """Partitions taken from this member that it has not yet said it gave up: no other
    member is assigned them meanwhile, and this one may still commit them. A trailing
    field with a default: snapshots from before it decode (and older code skips it)."""
    revoking_since: int = 0
    """The generation that last took a partition from this member: only a join that knew
    it (`JoinGroup.owned_generation`) may say the member let go. Trailing, with a default
    (0: any join may, as before the field). Noted at every level, as the session-7 release
    does; set from the state when the level rises to `GROUP_FENCING_LEVEL`
    (`normalise_revocations`)."""
    commit_sequence: int = 0
    """The highest `CommitOffsets.sequence` applied for this member. Trailing, with a
    default (0: none yet). Below `GROUP_FENCING_LEVEL` only a session-7 leader puts a
    sequence in the log (this release's leader leaves it out), and the session-7 release
    applies it as this one does."""


class ConsumerGroupState(msgspec.Struct, array_like=True):
    group: str
    generation: int = 0
    assignor: str = ""
    members: dict[str, MemberState] = msgspec.field(default_factory=dict)
    partition_counts: dict[str, int] = msgspec.field(default_factory=dict)
    offsets: dict[str, dict[int, int]] = msgspec.field(default_factory=dict)
    """topic → partition → the next offset to read."""


class GroupCoordinatorSnapshot(msgspec.Struct, frozen=True, array_like=True):
    format_version: int
    applied_index: int
    groups: list[ConsumerGroupState]
    cluster_level: int = BASELINE_FEATURE_LEVEL
    """The feature level committed by the entries the snapshot covers. Trailing, with a
    default: a snapshot from before the gate is at the baseline."""


_snapshot_encoder = msgspec.msgpack.Encoder()
_snapshot_decoder = msgspec.msgpack.Decoder(GroupCoordinatorSnapshot)


class GroupCoordinatorMachine:
    """Consumer groups by name, the index of the last entry applied, and the feature level
    committed in the log so far."""

    def __init__(self, feature_level: int = FEATURE_LEVEL) -> None:
        """`feature_level`: the highest level this build applies by (a lower one stands
        for an older release in tests)."""
        self.groups: dict[str, ConsumerGroupState] = {}
        self._applied_index = 0
        self.feature_level = feature_level
        self.cluster_level = BASELINE_FEATURE_LEVEL
        """The level committed by the entries applied: the rules `apply` uses now."""
        self.on_level_raised: Callable[[int], None] | None = None
        """Told the new level when an applied entry raised it (the node records it)."""

    # --- reads --------------------------------------------------------------------------

    @property
    def applied_index(self) -> int:
        return self._applied_index

    def group_info(self, name: str) -> GroupInfo | None:
        state = self.groups.get(name)
        return None if state is None else view(state)

    def list_groups(self) -> list[GroupInfo]:
        return [view(self.groups[name]) for name in sorted(self.groups)]

    def heartbeat_answer(self, command: JoinGroup) -> GroupResult | None:
        """The answer to a join that changes nothing (a heartbeat), from the state; None if
        the join must go through the log (new member, changed subscription or counts)."""
        state = self.groups.get(command.group)
        if state is None:
            return None
        member = state.members.get(command.member_id)
        if member is None or member.topics != sorted(set(command.topics)):
            return None
        if member.session_timeout_ms != command.session_timeout_ms:
            return None
        if state.assignor != command.assignor or not counts_cover(state, command):
            return None
        if still_revoking(member, command) != member.revoking:
            return None  # it gave partitions up: they go to their new owners
        return answer(state, member)

    # --- apply --------------------------------------------------------------------------

    def apply(self, index: int, data: bytes) -> list[list[GroupResult]]:
        """Apply the entry at `index`; one result list per batch. An index at or below
        `applied_index` is already in the state (a restored snapshot)."""
        if index <= self._applied_index:
            return []
        entry = decode_log_entry(decode_entry, data, index, "group coordinator")
        if entry.cluster_level:
            self.raise_level(entry.cluster_level)
        results = [[self.execute(command) for command in batch] for batch in entry.batches]
        self._applied_index = index
        return results

    def raise_level(self, level: int) -> None:
        """Apply a committed raise of the feature level (it never goes down); a build below
        it stops here rather than apply later entries by older rules."""
        before = self.cluster_level
        self.cluster_level = raised(before, level, self.feature_level)
        if before < GROUP_FENCING_LEVEL <= self.cluster_level:
            normalise_revocations(self.groups.values())
        if self.cluster_level > before and self.on_level_raised is not None:
            self.on_level_raised(self.cluster_level)

    def mark_applied(self, index: int) -> None:
        if index > self._applied_index:
            self._applied_index = index

    def execute(self, command: GroupCommand) -> GroupResult:
        if isinstance(command, DescribeGroup):
            info = self.group_info(command.group)
            if info is None:
                return refused(Refusal.UNKNOWN_GROUP, f"no consumer group {command.group!r}")
            return GroupResult(ok=True, group=info)
        if isinstance(command, ListGroups):
            return GroupResult(ok=True, groups=self.list_groups())
        if len(command.group.encode()) > NAME_BYTES_MAX or not command.group:
            return refused(Refusal.BAD_REQUEST, "a group name has 1 to 256 bytes")
        if isinstance(command, JoinGroup):
            return self.join(command)
        if isinstance(command, LeaveGroup | ExpireMembers):
            ids = [command.member_id] if isinstance(command, LeaveGroup) else command.member_ids
            return self.remove_members(command.group, ids)
        if isinstance(command, UpdatePartitions):
            return self.update_partitions(command)
        if isinstance(command, CommitOffsets):
            return self.commit(command)
        if isinstance(command, ResetOffsets):
            return self.reset(command)
        if isinstance(command, ImportOffsets):
            return self.import_offsets(command)
        return self.delete(command)

    def join(self, command: JoinGroup) -> GroupResult:
        problem = join_problem(command)
        if problem is not None:
            return refused(Refusal.BAD_REQUEST, problem)
        state = self.groups.get(command.group)
        if state is None:
            if len(self.groups) >= GROUP_COUNT_MAX:
                return refused(Refusal.BAD_REQUEST, f"at most {GROUP_COUNT_MAX} groups")
            state = ConsumerGroupState(group=command.group)
        others = [m for m in state.members if m != command.member_id]
        if others and state.assignor != command.assignor:
            return refused(
                Refusal.INCONSISTENT_ASSIGNOR,
                f"group {command.group!r} uses assignor {state.assignor!r}, "
                f"not {command.assignor!r}",
            )
        if command.member_id not in state.members and len(others) >= MEMBERS_PER_GROUP_MAX:
            return refused(Refusal.BAD_REQUEST, f"at most {MEMBERS_PER_GROUP_MAX} members")
        self.groups[command.group] = state
        unchanged = self.heartbeat_answer(command)
        if unchanged is not None:
            return unchanged
        previous = state.members.get(command.member_id)
        state.members[command.member_id] = MemberState(
            member_id=command.member_id,
            client_id=command.client_id,
            topics=sorted(set(command.topics)),
            session_timeout_ms=command.session_timeout_ms,
            assignment=[] if previous is None else previous.assignment,
            revoking=[] if previous is None else still_revoking(previous, command),
            revoking_since=0 if previous is None else previous.revoking_since,
            commit_sequence=0 if previous is None else previous.commit_sequence,
        )
        state.assignor = command.assignor
        state.partition_counts.update(command.partition_counts)
        rebalance(state)
        return answer(state, state.members[command.member_id])

    def remove_members(self, group: str, member_ids: list[str]) -> GroupResult:
        state = self.groups.get(group)
        if state is None:
            return refused(Refusal.UNKNOWN_GROUP, f"no consumer group {group!r}")
        gone = sorted({member_id for member_id in member_ids if member_id in state.members})
        if not gone:
            return refused(Refusal.UNKNOWN_MEMBER, f"no such member in group {group!r}")
        for member_id in gone:
            del state.members[member_id]
        rebalance(state)
        return GroupResult(ok=True, generation=state.generation)

    def update_partitions(self, command: UpdatePartitions) -> GroupResult:
        state = self.groups.get(command.group)
        if state is None:
            return refused(Refusal.UNKNOWN_GROUP, f"no consumer group {command.group!r}")
        if all(state.partition_counts.get(t) == n for t, n in command.partition_counts.items()):
            return GroupResult(ok=True, generation=state.generation)
        state.partition_counts.update(command.partition_counts)
        rebalance(state)
        return GroupResult(ok=True, generation=state.generation)

    def commit(self, command: CommitOffsets) -> GroupResult:
        state = self.groups.get(command.group)
        refusal = commit_refusal(state, command)
        if refusal is not None:
            return refusal
        if state is None:
            state = self.groups[command.group] = ConsumerGroupState(group=command.group)
        member = state.members.get(command.member_id)
        if member is not None and command.sequence:
            if command.sequence <= member.commit_sequence:
                # A retry or a delayed copy of a commit this member has since superseded
                # (found by the simulator: a duplicated commit took an offset back).
                return GroupResult(ok=True, generation=state.generation)
            member.commit_sequence = command.sequence
        store_offsets(state, command.offsets)
        return GroupResult(ok=True, generation=state.generation)

    def reset(self, command: ResetOffsets) -> GroupResult:
        state = self.groups.get(command.group)
        if state is not None and state.members:
            return refused(
                Refusal.GROUP_NOT_EMPTY,
                f"group {command.group!r} has {len(state.members)} live members; stop them first",
            )
        if any(item.offset < 0 or item.partition < 0 for item in command.offsets):
            return refused(Refusal.BAD_REQUEST, "offsets and partitions are not negative")
        if state is None:
            state = self.groups[command.group] = ConsumerGroupState(group=command.group)
        store_offsets(state, command.offsets)
        return GroupResult(ok=True, group=view(state))

    def import_offsets(self, command: ImportOffsets) -> GroupResult:
        """Set the previous release's offsets only where the group has none (see
        `ImportOffsets`); members, generation and assignment are left as they are."""
        if any(item.offset < 0 or item.partition < 0 for item in command.offsets):
            return refused(Refusal.BAD_REQUEST, "offsets and partitions are not negative")
        state = self.groups.get(command.group)
        if state is None:
            if len(self.groups) >= GROUP_COUNT_MAX:
                return refused(Refusal.BAD_REQUEST, f"at most {GROUP_COUNT_MAX} groups")
            state = self.groups[command.group] = ConsumerGroupState(group=command.group)
        missing = [
            item
            for item in command.offsets
            if item.partition not in state.offsets.get(item.topic, {})
        ]
        store_offsets(state, missing)
        return GroupResult(ok=True, generation=state.generation)

    def delete(self, command: DeleteGroup) -> GroupResult:
        state = self.groups.get(command.group)
        if state is None:
            return refused(Refusal.UNKNOWN_GROUP, f"no consumer group {command.group!r}")
        if state.members:
            return refused(
                Refusal.GROUP_NOT_EMPTY,
                f"group {command.group!r} has {len(state.members)} live members; stop them first",
            )
        del self.groups[command.group]
        return GroupResult(ok=True)

    # --- snapshots ----------------------------------------------------------------------

    def snapshot(self) -> bytes:
        groups = [canonical(state) for _, state in sorted(self.groups.items())]
        return _snapshot_encoder.encode(
            GroupCoordinatorSnapshot(
                SNAPSHOT_FORMAT_VERSION, self._applied_index, groups, self.cluster_level
            )
        )

    def restore(self, data: bytes) -> None:
        """Replace the whole state with a snapshot's; the state is unchanged if it fails."""
        try:
            snapshot = _snapshot_decoder.decode(data)
        except wire.DECODE_ERRORS as error:
            raise MalformedEntryError(
                f"group coordinator snapshot ({len(data)} bytes) does not decode: {error}"
            ) from error
        if snapshot.format_version != SNAPSHOT_FORMAT_VERSION:
            raise MalformedEntryError(
                f"group coordinator snapshot format {snapshot.format_version}; this build "
                f"reads {SNAPSHOT_FORMAT_VERSION}"
            )
        groups = {state.group: state for state in snapshot.groups}
        if len(groups) != len(snapshot.groups):
            raise MalformedEntryError("group coordinator snapshot names a group twice")
        # Restored as written, below level 2 too: a session-7 snapshot holds what replicas
        # that replay its entries hold; a session-6 one lacks revoking_since, which the raise
        # to level 2 sets (normalise_revocations).
        check_level(self.feature_level, snapshot.cluster_level)
        self.groups = groups
        self._applied_index = snapshot.applied_index
        before = self.cluster_level
        self.cluster_level = snapshot.cluster_level
        if self.cluster_level > before and self.on_level_raised is not None:
            self.on_level_raised(self.cluster_level)


def normalise_revocations(groups: Iterable[ConsumerGroupState]) -> None:
    """At the raise to `GROUP_FENCING_LEVEL`: every member's `revoking_since` set from state
    every release shares, the generation if it is giving partitions up, else 0.

    Why: below the level a replica restored from a session-6 snapshot has it at 0 (that
    release never noted it) while one that replayed the same entries noted a generation;
    the field is not read meanwhile (this release's leader proposes no `owned_generation`
    below the level), but from the level on it is, so every replica must hold the same.
    Conservative: only a join that knew the generation at the raise, or a later one,
    releases a revocation still under way then.

    `commit_sequence` needs no such step: below the level a sequence reaches the log only
    from a session-7 leader (this release's leader leaves it out), and a cluster with a
    session-7 node has no session-6 one (that mix predates the gate and was never safe),
    so every replica and every snapshot below the level applied the same sequences: none
    (a session-6 snapshot and replicas replaying after it: 0) or a session-7 leader's
    (session-7 and this release apply them alike)."""
    for state in groups:
        for member in state.members.values():
            member.revoking_since = state.generation if member.revoking else 0


def join_problem(command: JoinGroup) -> str | None:
    if not command.member_id or len(command.member_id.encode()) > NAME_BYTES_MAX:
        return "a member id has 1 to 256 bytes"
    if command.assignor not in ASSIGNORS:
        return f"the assignor is one of {', '.join(ASSIGNORS)}, not {command.assignor!r}"
    if not SESSION_TIMEOUT_MS_MIN <= command.session_timeout_ms <= SESSION_TIMEOUT_MS_MAX:
        return (
            f"session_timeout_ms is {SESSION_TIMEOUT_MS_MIN} to {SESSION_TIMEOUT_MS_MAX}, "
            f"not {command.session_timeout_ms}"
        )
    if len(command.topics) > TOPICS_PER_MEMBER_MAX:
        return f"at most {TOPICS_PER_MEMBER_MAX} topics per member"
    if any(not topic or len(topic.encode()) > NAME_BYTES_MAX for topic in command.topics):
        return "a topic name has 1 to 256 bytes"
    return None


def counts_cover(state: ConsumerGroupState, command: JoinGroup) -> bool:
    """Whether the group's partition counts already match what the join brings."""
    return all(state.partition_counts.get(t) == n for t, n in command.partition_counts.items())


def answer(state: ConsumerGroupState, member: MemberState) -> GroupResult:
    rebalancing = any(other.revoking for other in state.members.values())
    return GroupResult(
        ok=True,
        generation=state.generation,
        assignment=member.assignment,
        rebalancing=rebalancing,
    )


def still_revoking(member: MemberState, command: JoinGroup) -> list[tuple[str, int]]:
    """What the member was giving up and, by its join, still holds (a join without
    `owned`, from an older client, holds nothing). A join made before the member learned
    of its latest revocation releases nothing: it lacks those partitions only because
    it had not yet been told it held them (found by the simulator: a duplicated first
    join, applied after a second member joined, gave that member partitions the first
    still read)."""
    if command.owned is None or not member.revoking:
        return []
    if command.owned_generation is not None and command.owned_generation < member.revoking_since:
        return list(member.revoking)
    owned = {(topic, partition) for topic, partition in command.owned}
    return [partition for partition in member.revoking if partition in owned]


def rebalance(state: ConsumerGroupState) -> None:
    """A new generation, its assignment computed from the previous one. A partition the
    assignor moves away from a live member is withheld from its new owner until the old
    one gave it up (the module docstring of `group_model`). The generation of each
    revocation is noted (`MemberState.revoking_since`) at every feature level, as the
    session-7 release does."""
    subscriptions = {member_id: m.topics for member_id, m in state.members.items()}
    previous = {member_id: m.assignment for member_id, m in state.members.items()}
    assignor = state.assignor or ASSIGNORS[0]
    assignment = assign(assignor, subscriptions, state.partition_counts, previous)
    holders = {
        partition: member_id
        for member_id, member in state.members.items()
        for partition in (*member.assignment, *member.revoking)
    }
    generation = state.generation + 1
    for member_id, member in state.members.items():
        held = {*member.assignment, *member.revoking}
        member.assignment = [
            partition
            for partition in assignment.get(member_id, [])
            if holders.get(partition, member_id) == member_id
        ]
        revoking = sorted(held - set(member.assignment))
        if not set(revoking) <= set(member.revoking):
            member.revoking_since = generation
        member.revoking = revoking
    owners = [p for m in state.members.values() for p in (*m.assignment, *m.revoking)]
    require(len(owners) == len(set(owners)), "a partition is held by two members")
    state.generation = generation
    subscribed = {topic for member in state.members.values() for topic in member.topics}
    # Counts of topics nobody reads any more are dropped, so the state stays bounded.
    state.partition_counts = {t: n for t, n in state.partition_counts.items() if t in subscribed}


def commit_refusal(state: ConsumerGroupState | None, command: CommitOffsets) -> GroupResult | None:
    if any(item.offset < 0 or item.partition < 0 for item in command.offsets):
        return refused(Refusal.BAD_REQUEST, "offsets and partitions are not negative")
    if command.generation == NO_GENERATION and not command.member_id:
        if state is not None and state.members:
            return refused(
                Refusal.GROUP_NOT_EMPTY,
                f"group {command.group!r} has live members: only they may commit",
            )
        return None
    member = None if state is None else state.members.get(command.member_id)
    if state is None or member is None:
        return refused(
            Refusal.UNKNOWN_MEMBER,
            f"member {command.member_id!r} is not in group {command.group!r} "
            "(removed after its session timed out, or left)",
        )
    if command.generation != state.generation:
        return refused(
            Refusal.ILLEGAL_GENERATION,
            f"the commit was made in generation {command.generation}; "
            f"group {command.group!r} is in generation {state.generation}",
        )
    owned = {*member.assignment, *member.revoking}  # revoking: its last commits
    foreign = [
        f"{o.topic}/{o.partition}" for o in command.offsets if (o.topic, o.partition) not in owned
    ]
    if foreign:
        return refused(
            Refusal.NOT_ASSIGNED,
            f"member {command.member_id!r} is not assigned {', '.join(sorted(foreign))}",
        )
    return None


def store_offsets(state: ConsumerGroupState, offsets: list[PartitionOffset]) -> None:
    for item in offsets:
        state.offsets.setdefault(item.topic, {})[item.partition] = item.offset


def canonical(state: ConsumerGroupState) -> ConsumerGroupState:
    """The state with every mapping sorted, so equal states encode to equal bytes."""
    return ConsumerGroupState(
        group=state.group,
        generation=state.generation,
        assignor=state.assignor,
        members=dict(sorted(state.members.items())),
        partition_counts=dict(sorted(state.partition_counts.items())),
        offsets={t: dict(sorted(p.items())) for t, p in sorted(state.offsets.items())},
    )


def view(state: ConsumerGroupState) -> GroupInfo:
    members = [
        MemberInfo(
            member_id=member.member_id,
            client_id=member.client_id,
            topics=list(member.topics),
            session_timeout_ms=member.session_timeout_ms,
            assignment=list(member.assignment),
        )
        for _, member in sorted(state.members.items())
    ]
    offsets = [
        PartitionOffset(topic, partition, offset)
        for topic, partitions in sorted(state.offsets.items())
        for partition, offset in sorted(partitions.items())
    ]
    return GroupInfo(
        group=state.group,
        generation=state.generation,
        assignor=state.assignor,
        members=members,
        offsets=offsets,
    )


__all__ = ["GroupCoordinatorMachine"]
