"""Messages between Raft cores. Frozen msgspec structs, tagged so a runtime can frame them.

Replication follows DLedger: the leader drives each follower through named states and sends
a `Push` whose `kind` says what it is (COMPARE, TRUNCATE, APPEND, COMMIT). Each push carries
the follower's `round`: the leader starts a new round whenever it enters COMPARE or APPEND
for that follower, and a follower refuses pushes from an older round of the same term. That
is what makes a delayed or duplicated TRUNCATE harmless: it can never drop entries the
follower has acknowledged in a later round.
"""

from __future__ import annotations

import enum

import msgspec

from quorumlog.raft.configuration import Configuration
from quorumlog.storage.entry import LogEntry


class PushKind(enum.IntEnum):
    COMPARE = 1
    """Does your entry at `index` have term `index_term`? (find the match point)"""
    TRUNCATE = 2
    """Drop every entry after `index` (whose term must be `index_term`)."""
    APPEND = 3
    """Append `entries`, which follow `index` (term `index_term`)."""
    COMMIT = 4
    """Heartbeat: carries only `commit_index` and the read sequence."""


# The kinds as module constants, for the per-push comparisons: on Python 3.11 reading an
# enum member through its class (`PushKind.APPEND`) costs several times a global's lookup.
PUSH_COMPARE = PushKind.COMPARE
PUSH_TRUNCATE = PushKind.TRUNCATE
PUSH_APPEND = PushKind.APPEND
PUSH_COMMIT = PushKind.COMMIT


class VoteRequest(msgspec.Struct, frozen=True, tag=True, array_like=True):
    source: str
    target: str
    term: int
    """For a pre-vote, the term the candidate would campaign in (its own term + 1)."""
    last_log_index: int
    last_log_term: int
    pre_vote: bool = False
    transfer: bool = False
    """Sent because the leader handed over: voters grant even if they heard a leader lately."""


class VoteResponse(msgspec.Struct, frozen=True, tag=True, array_like=True):
    source: str
    target: str
    term: int
    granted: bool
    pre_vote: bool = False


class Push(msgspec.Struct, frozen=True, tag=True, array_like=True):
    source: str
    target: str
    term: int
    kind: PushKind
    round: int
    index: int = 0
    index_term: int = 0
    entries: list[LogEntry] = []
    commit_index: int = 0
    read_sequence: int = 0
    quiesce: bool = False
    """COMMIT only: the leader goes quiet; so may the follower, if its log ends at `index`
    (term `index_term`) and it has committed `commit_index` (see RaftConfig.quiesce_idle_ticks)."""
    answer_wanted: bool = True
    """COMMIT only. False: the leader heard this follower in this check-quorum window and
    needs nothing from an answer (no read waits, no lease, the follower holds its whole
    log), so the follower answers only if something changes (a new term). A trailing
    field: a node from before it ignores it and answers every heartbeat, as before."""


class PushResponse(msgspec.Struct, frozen=True, tag=True, array_like=True):
    source: str
    target: str
    term: int
    kind: PushKind
    round: int
    success: bool
    index: int = 0
    """The `index` of the push this answers: a COMPARE may be retried within a round, and
    the leader must tell which of its probes an answer belongs to."""
    match_index: int = 0
    """On success: the follower's log matches the leader's through this index."""
    end_index: int = 0
    """The follower's last log index."""
    conflict_term: int = 0
    """On a COMPARE mismatch: the follower's term at the compared index (0: it has no entry)."""
    conflict_index: int = 0
    """On a COMPARE mismatch: the first index of `conflict_term` in the follower's log."""
    read_sequence: int = 0
    quiet: bool = False
    """The answer to a quiesce push: the follower went quiet too (False: it could not, and
    the leader wakes)."""


class SnapshotMeta(msgspec.Struct, frozen=True, array_like=True):
    """What a snapshot covers: every entry through `index` (of term `term`)."""

    index: int
    term: int
    configuration: Configuration


class SnapshotChunk(msgspec.Struct, frozen=True, tag=True, array_like=True):
    source: str
    target: str
    term: int
    round: int
    meta: SnapshotMeta
    offset: int
    data: bytes
    done: bool
    commit_index: int = 0


class SnapshotResponse(msgspec.Struct, frozen=True, tag=True, array_like=True):
    source: str
    target: str
    term: int
    round: int
    success: bool
    next_offset: int = 0
    match_index: int = 0
    chunk_offset: int = -1
    """The offset of the chunk this answers (-1: from a node before this field, a trailing
    one). The leader acts only on the answer to the chunk it has in flight: a duplicated
    or late answer that moved it on would start a second chunk stream beside the first,
    and every later duplicate another (tests/unit/raft/test_snapshot_chunks.py)."""


class TimeoutNow(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """Leader transfer: the leader tells a caught-up follower to campaign at once."""

    source: str
    target: str
    term: int


Message = (
    VoteRequest | VoteResponse | Push | PushResponse | SnapshotChunk | SnapshotResponse | TimeoutNow
)

MESSAGE_TYPES: tuple[type, ...] = (
    VoteRequest,
    VoteResponse,
    Push,
    PushResponse,
    SnapshotChunk,
    SnapshotResponse,
    TimeoutNow,
)
