"""What a Raft core hands its runtime: the `Ready` batch of actions, and its ordering rules.

A runtime loop does, for each `Ready`, in this order:

1. Send `messages` at once (they never depend on local durability: a leader may replicate
   entries before it has written them itself, because it counts itself toward a quorum only
   after `RaftCore.persisted`).
2. If `snapshot` is set: restore the state machine from it, persist it, and reset the log
   so it is empty from `snapshot.meta.index + 1`.
3. If `truncate_after` is set: drop log entries after that index.
4. Append `entries`, persist `hard_state` (if set), and make both durable (one fsync).
   Hard state is never durable ahead of the log it refers to, so write entries first.
5. Only then send `messages_after_persist` (votes and acknowledgements promise durability),
   and call `RaftCore.persisted(last index, last term)` for the entries appended.
6. Apply `committed_entries` in order to the state machine and call `RaftCore.applied`.
   They are always at or below what was persisted.
7. Answer `read_states`: each read with its index may be served once applied >= index.
"""

from __future__ import annotations

import msgspec

from quorumlog.raft.messages import Message, SnapshotMeta
from quorumlog.storage.entry import LogEntry


class HardState(msgspec.Struct, frozen=True):
    """What must survive a crash: the current term, the vote in it, and the commit index."""

    term: int = 0
    vote: str | None = None
    commit: int = 0


class IncomingSnapshot(msgspec.Struct, frozen=True):
    """A whole snapshot received from the leader, to install."""

    meta: SnapshotMeta
    data: bytes


class ReadState(msgspec.Struct, frozen=True):
    """A linearizable read may be served once the state machine has applied `index`."""

    request_id: int
    index: int


class Ready(msgspec.Struct):
    hard_state: HardState | None = None
    snapshot: IncomingSnapshot | None = None
    truncate_after: int | None = None
    entries: list[LogEntry] = msgspec.field(default_factory=list)
    messages: list[Message] = msgspec.field(default_factory=list)
    messages_after_persist: list[Message] = msgspec.field(default_factory=list)
    committed_entries: list[LogEntry] = msgspec.field(default_factory=list)
    read_states: list[ReadState] = msgspec.field(default_factory=list)
    failed_reads: list[int] = msgspec.field(default_factory=list)
    """Read requests that can no longer be answered here (leadership was lost): retry."""

    def is_empty(self) -> bool:
        return not (
            self.hard_state is not None
            or self.snapshot is not None
            or self.truncate_after is not None
            or self.entries
            or self.messages
            or self.messages_after_persist
            or self.committed_entries
            or self.read_states
            or self.failed_reads
        )
