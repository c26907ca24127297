"""What the consumer-group coordinator knows and is asked: the commands of its log, the
answers, and their encodings (msgspec MessagePack, never pickle).

The protocol is Kafka's group protocol folded into one call: `JoinGroup` is both the join
and the heartbeat. A member sends it every heartbeat interval with its subscription; the
answer is the group's current generation and the member's assignment. A join that
changes nothing (a heartbeat) is answered by the coordinator leader from its state without
a log entry; a new member, a changed subscription or a changed partition count goes
through the log and starts a new generation with a new assignment. The member learns it
on its next call, drops (revokes) what it lost and starts reading what it gained.

Revocation is cooperative, as in Kafka's incremental protocol: a partition that a new
generation moves from one live member to another is first only taken from its owner
(which may still commit it: it is "revoking"), and given to the new owner in a later
generation, once the owner's join says it no longer holds it (`JoinGroup.owned`: it ran
`on_revoke` and committed), or the owner left or expired. So the new owner starts from
the old owner's last commit, never while the old one still reads.

Commits carry the member id and the generation they were made in: the coordinator refuses
a commit from a member it removed, from an older generation, or for a partition the
member is not assigned (`CommitRefusal`), so a consumer fenced out of a group never moves
an offset that a newer owner of the partition committed.
"""

from __future__ import annotations

import enum
from typing import TypeVar

import msgspec

from quorumlog.codec.feature_levels import GROUP_FENCING_LEVEL
from quorumlog.stream.assignors import ASSIGNOR_DEFAULT

SESSION_TIMEOUT_MS_DEFAULT = 45_000
"""Kafka 3.x's `session.timeout.ms`: a member silent this long is removed."""
SESSION_TIMEOUT_MS_MIN = 100
SESSION_TIMEOUT_MS_MAX = 30 * 60 * 1000
NO_GENERATION = -1
"""A commit made outside group membership (a consumer that assigns itself partitions);
allowed only while the group has no members, as Kafka allows it."""


class Refusal(enum.Enum):
    """Why the coordinator refused a command (nothing changed)."""

    UNKNOWN_MEMBER = "unknown_member"
    """The member is not (or no longer) in the group: removed, expired or never joined."""
    ILLEGAL_GENERATION = "illegal_generation"
    """The commit was made in a generation the group has left behind."""
    NOT_ASSIGNED = "not_assigned"
    """The commit names a partition the member is not assigned in this generation."""
    GROUP_NOT_EMPTY = "group_not_empty"
    """Resetting offsets or deleting a group with live members, or committing to such a
    group from outside it."""
    UNKNOWN_GROUP = "unknown_group"
    INCONSISTENT_ASSIGNOR = "inconsistent_assignor"
    """A member asked for another assignor than the group's members use."""
    BAD_REQUEST = "bad_request"


COMMIT_REFUSALS = frozenset(
    {
        Refusal.UNKNOWN_MEMBER,
        Refusal.ILLEGAL_GENERATION,
        Refusal.NOT_ASSIGNED,
        Refusal.GROUP_NOT_EMPTY,
    }
)


class PartitionOffset(msgspec.Struct, frozen=True, array_like=True):
    topic: str
    partition: int
    offset: int
    """The next offset to read (as Kafka counts)."""


class MemberInfo(msgspec.Struct, frozen=True):
    member_id: str
    client_id: str
    topics: list[str]
    session_timeout_ms: int
    assignment: list[tuple[str, int]]


class GroupInfo(msgspec.Struct, frozen=True):
    """The coordinator's view of one group."""

    group: str
    generation: int
    assignor: str
    members: list[MemberInfo]
    """Sorted by member id."""
    offsets: list[PartitionOffset]
    """Sorted by topic and partition."""

    @property
    def state(self) -> str:
        """ "Stable" with members, "Empty" without (Kafka's names)."""
        return "Stable" if self.members else "Empty"


# --- commands ------------------------------------------------------------------------


class JoinGroup(msgspec.Struct, frozen=True, array_like=True, tag="join"):
    """Join, or heartbeat as, `member_id` (chosen by the client, so a retried join is the
    same member). `partition_counts` is filled in by the coordinator leader from the
    topics it knows; what a client sends there is ignored."""

    group: str
    member_id: str
    client_id: str
    topics: list[str]
    session_timeout_ms: int = SESSION_TIMEOUT_MS_DEFAULT
    assignor: str = ASSIGNOR_DEFAULT
    partition_counts: dict[str, int] = {}
    owned: list[tuple[str, int]] | None = None
    """The partitions the member still reads (it finished revoking the others: ran its
    `on_revoke` and committed). None: a client from before cooperative revocation, taken
    as holding nothing it was asked to give up. A trailing field with a default: joins
    from older clients decode, and older nodes ignore it."""
    owned_generation: int | None = None
    """The newest generation the member had taken when it said `owned`. A join made before
    the member learned that a partition was taken from it (a retried, duplicated or
    delayed join) lacks that partition only because it never held it yet, not because it
    let go: the coordinator takes `owned` as a release only from a join at least as new as
    the revocation. None (a client from before this field): taken as new enough. Trailing,
    with a default, as `owned`. The leader proposes it only from feature level 2
    (`GROUP_FENCING_LEVEL`) on (`at_level`: a session-6 replica would drop it); apply
    honours it whenever the log holds it, at every level, as the session-7 release does."""


class LeaveGroup(msgspec.Struct, frozen=True, array_like=True, tag="leave"):
    group: str
    member_id: str


class ExpireMembers(msgspec.Struct, frozen=True, array_like=True, tag="expire"):
    """The coordinator leader found these members silent past their session timeout."""

    group: str
    member_ids: list[str]


class UpdatePartitions(msgspec.Struct, frozen=True, array_like=True, tag="partitions"):
    """The coordinator leader saw a subscribed topic's partition count change."""

    group: str
    partition_counts: dict[str, int]


class CommitOffsets(msgspec.Struct, frozen=True, array_like=True, tag="commit"):
    group: str
    member_id: str
    """"" with `generation` NO_GENERATION: a commit from outside the group's membership."""
    generation: int
    offsets: list[PartitionOffset]
    sequence: int = 0
    """The member's count of its commits (1, 2, ...): a commit that arrives after a later
    one of the same member (an attempt that was retried, or delayed on the way) changes
    nothing, so an acknowledged commit is never undone by an older one. 0: unnumbered (a
    client from before this field, or a commit from outside the group). Trailing, with a
    default: older clients' commits decode, and session-6 nodes drop it, so the leader
    proposes it only from feature level 2 (`GROUP_FENCING_LEVEL`) on (`at_level`); apply
    honours it whenever the log holds it, at every level, as the session-7 release does."""


class ResetOffsets(msgspec.Struct, frozen=True, array_like=True, tag="reset"):
    """Set offsets as an operator asks (`quorumlog group reset-offsets`): only while the
    group has no members."""

    group: str
    offsets: list[PartitionOffset]


class DeleteGroup(msgspec.Struct, frozen=True, array_like=True, tag="delete"):
    group: str


class DescribeGroup(msgspec.Struct, frozen=True, array_like=True, tag="describe"):
    """A read (behind a ReadIndex round, never logged)."""

    group: str


class ListGroups(msgspec.Struct, frozen=True, array_like=True, tag="list"):
    pass


class ImportOffsets(msgspec.Struct, frozen=True, array_like=True, tag="import"):
    """Offsets a group committed before the coordinator existed (the previous release kept
    them in the "kv" group under `__offsets/<group>/<topic>/<partition>`), carried over by
    the coordinator leader. Applying it sets an offset only where the group has none for
    that partition: a commit made since the upgrade wins, and applying it again changes
    nothing. The coordinator's own command, like `ExpireMembers`: never a client's."""

    group: str
    offsets: list[PartitionOffset]


GroupCommand = (
    JoinGroup
    | LeaveGroup
    | ExpireMembers
    | UpdatePartitions
    | CommitOffsets
    | ResetOffsets
    | DeleteGroup
    | DescribeGroup
    | ListGroups
    | ImportOffsets
)
QUERY_TYPES: tuple[type, ...] = (DescribeGroup, ListGroups)
CommandType = TypeVar("CommandType", bound=GroupCommand)


class GroupResult(msgspec.Struct, frozen=True):
    ok: bool
    refusal: Refusal | None = None
    error: str | None = None
    generation: int = NO_GENERATION
    assignment: list[tuple[str, int]] = []
    """A join's answer: the member's partitions in `generation`."""
    group: GroupInfo | None = None
    groups: list[GroupInfo] | None = None
    rebalancing: bool = False
    """A join's answer: some member is still giving up partitions this generation moves
    (they go to their new owners in a later generation), so members heartbeat sooner."""


def refused(refusal: Refusal, error: str) -> GroupResult:
    return GroupResult(ok=False, refusal=refusal, error=error)


def at_level(command: CommandType, level: int) -> CommandType:
    """`command` as a release of feature `level` reads it: the fields added by later
    levels set back to their defaults (a session-6 release drops them when it decodes).
    The leader proposes commands so until the level is committed, so that every replica
    applies the same; apply does not call it (it follows the session-7 rules below level 2:
    a session-7 leader's fields are applied, as session-7 replicas apply them)."""
    if level >= GROUP_FENCING_LEVEL:
        return command
    if isinstance(command, JoinGroup) and command.owned_generation is not None:
        return msgspec.structs.replace(command, owned_generation=None)
    if isinstance(command, CommitOffsets) and command.sequence:
        return msgspec.structs.replace(command, sequence=0)
    return command


# --- log entries ---------------------------------------------------------------------


class GroupEntry(msgspec.Struct, frozen=True, array_like=True):
    timestamp_ms: int
    """The proposing leader's wall clock (kept for the record; no rule reads it)."""
    batches: list[list[GroupCommand]]
    """One batch per client request gathered into this entry."""
    cluster_level: int = 0
    """Non-zero: the feature level the group's members agreed on, raised by applying this
    entry (which carries no batches), for this and every later entry
    (codec/feature_levels.py). 0: no change. Trailing, with a default: raised only once
    every member runs a release that reads it."""


_encoder = msgspec.msgpack.Encoder()
_entry_decoder = msgspec.msgpack.Decoder(GroupEntry)
_commands_decoder = msgspec.msgpack.Decoder(list[GroupCommand])
_results_decoder = msgspec.msgpack.Decoder(list[GroupResult])


def encode_entry(entry: GroupEntry) -> bytes:
    return _encoder.encode(entry)


def decode_entry(data: bytes) -> GroupEntry:
    """Raises msgspec.DecodeError or ValidationError on bad bytes."""
    return _entry_decoder.decode(data)


def encode_commands(commands: list[GroupCommand]) -> bytes:
    return _encoder.encode(commands)


def decode_commands(data: bytes) -> list[GroupCommand]:
    return _commands_decoder.decode(data)


def encode_results(results: list[GroupResult]) -> bytes:
    return _encoder.encode(results)


def decode_results(data: bytes) -> list[GroupResult]:
    return _results_decoder.decode(data)


__all__ = [
    "COMMIT_REFUSALS",
    "NO_GENERATION",
    "QUERY_TYPES",
    "SESSION_TIMEOUT_MS_DEFAULT",
    "CommitOffsets",
    "DeleteGroup",
    "DescribeGroup",
    "ExpireMembers",
    "GroupCommand",
    "GroupEntry",
    "GroupInfo",
    "GroupResult",
    "ImportOffsets",
    "JoinGroup",
    "LeaveGroup",
    "ListGroups",
    "MemberInfo",
    "PartitionOffset",
    "Refusal",
    "ResetOffsets",
    "UpdatePartitions",
    "at_level",
    "decode_commands",
    "decode_entry",
    "decode_results",
    "encode_commands",
    "encode_entry",
    "encode_results",
    "refused",
]
