"""Plain heartbeats and their answers as compact rows, many to one `PeerBatch` per node pair.

A node hosting a thousand awake groups sends most of its peer messages as heartbeats
(COMMIT pushes) and their answers. Each went as its own `RaftEnvelope` holding a tagged
`Push` (a map with the group's name, then a dozen fields, most of them defaults) and was
decoded, routed and stepped one by one. CockroachDB coalesces the heartbeats between two
nodes into one message; here a peer that said it reads rows (`Hello.heartbeat_rows`,
`Welcome.heartbeat_rows`) gets each plain heartbeat as a `HeartbeatRow` and each plain
answer as a `HeartbeatAnswerRow` in `PeerBatch.heartbeats` / `heartbeat_answers`: an array of
numbers behind the group's name, no tags, no defaults, no envelope.

Only the encoding changes. A row holds every field of the message it stands for that can
differ from the defaults (`row_of` refuses any message with more: a quiesce push, an
answer to a COMPARE...), the batch says its sender (`PeerBatch.source`) and the receiver
is the target, so `push_of` / `answer_of` rebuild the very message that was sent, and the
receiver steps it as it would an envelope's (through the core's heartbeat fast paths,
which the simulator runs too).
"""

from __future__ import annotations

import msgspec

from quorumlog.raft.messages import PUSH_COMMIT, Message, Push, PushResponse


class HeartbeatRow(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A plain heartbeat (`Push` of kind COMMIT, index 0, not quiescing)."""

    group: str
    term: int
    round: int
    commit_index: int
    read_sequence: int
    answer_wanted: bool


class HeartbeatAnswerRow(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """The answer to a plain heartbeat (`PushResponse` of kind COMMIT, index 0, no
    conflict, not quiet)."""

    group: str
    term: int
    round: int
    success: bool
    match_index: int
    end_index: int
    read_sequence: int


def row_of(group: str, message: Message) -> HeartbeatRow | HeartbeatAnswerRow | None:
    """The row standing for `message`, or None if a row cannot say all of it (send it in
    an envelope)."""
    message_type = type(message)
    if message_type is Push:
        push: Push = message  # type: ignore[assignment]
        if (
            push.kind is not PUSH_COMMIT
            or push.quiesce
            or push.index != 0
            or push.index_term != 0
            or push.entries
        ):
            return None
        return HeartbeatRow(
            group,
            push.term,
            push.round,
            push.commit_index,
            push.read_sequence,
            push.answer_wanted,
        )
    if message_type is PushResponse:
        answer: PushResponse = message  # type: ignore[assignment]
        if (
            answer.kind is not PUSH_COMMIT
            or answer.quiet
            or answer.index != 0
            or answer.conflict_term != 0
            or answer.conflict_index != 0
        ):
            return None
        return HeartbeatAnswerRow(
            group,
            answer.term,
            answer.round,
            answer.success,
            answer.match_index,
            answer.end_index,
            answer.read_sequence,
        )
    return None


def push_of(row: HeartbeatRow, source: str, target: str) -> Push:
    """The heartbeat `row` stands for, sent by `source` to `target`."""
    return Push(
        source=source,
        target=target,
        term=row.term,
        kind=PUSH_COMMIT,
        round=row.round,
        commit_index=row.commit_index,
        read_sequence=row.read_sequence,
        answer_wanted=row.answer_wanted,
    )


def answer_of(row: HeartbeatAnswerRow, source: str, target: str) -> PushResponse:
    """The heartbeat answer `row` stands for, sent by `source` to `target`."""
    return PushResponse(
        source=source,
        target=target,
        term=row.term,
        kind=PUSH_COMMIT,
        round=row.round,
        success=row.success,
        match_index=row.match_index,
        end_index=row.end_index,
        read_sequence=row.read_sequence,
    )


__all__ = ["HeartbeatAnswerRow", "HeartbeatRow", "answer_of", "push_of", "row_of"]
