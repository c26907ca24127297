"""A leader sends a snapshot one chunk at a time and acts only on the answer to the chunk
it has in flight (`SnapshotResponse.chunk_offset`). Before, every answer moved it on, so a
duplicated answer (or a duplicated chunk, answered twice) started a second chunk stream
beside the first, and each later duplicate another: in the shard simulator (seed 355 of
`concurrent_changes`) the chunks grew to 300,000 a simulated second and the run stalled."""

from __future__ import annotations

import msgspec

from quorumlog.raft.messages import SnapshotChunk, SnapshotMeta, SnapshotResponse
from tests.unit.raft.test_heartbeat_fast_path import FOLLOWER, LEADER, VOTERS, elected_leader

CHUNK_BYTES = 10
SNAPSHOT = bytes(range(45))  # five chunks: 10, 10, 10, 10 and 5 bytes


def leader_sending_a_snapshot() -> tuple[object, list[SnapshotChunk]]:
    core = elected_leader(snapshot_chunk_bytes_max=CHUNK_BYTES)
    core.own_snapshot = (SnapshotMeta(index=1, term=core.term, configuration=VOTERS), SNAPSHOT)
    leader = core.leader
    assert leader is not None
    leader.start_snapshot(FOLLOWER, leader.progress[FOLLOWER])
    return core, chunks_sent(core)


def chunks_sent(core: object) -> list[SnapshotChunk]:
    sent = core.ready().messages  # type: ignore[attr-defined]
    return [message for message in sent if isinstance(message, SnapshotChunk)]


def answer(
    chunk: SnapshotChunk, next_offset: int, chunk_offset: int | None = None
) -> SnapshotResponse:
    return SnapshotResponse(
        source=FOLLOWER,
        target=LEADER,
        term=chunk.term,
        round=chunk.round,
        success=True,
        next_offset=next_offset,
        chunk_offset=chunk.offset if chunk_offset is None else chunk_offset,
    )


def test_a_duplicated_answer_starts_no_second_chunk_stream() -> None:
    core, (first,) = leader_sending_a_snapshot()
    assert first.offset == 0
    taken = answer(first, next_offset=CHUNK_BYTES)
    core.step(taken)  # type: ignore[attr-defined]
    core.step(taken)  # type: ignore[attr-defined]  # the network delivered it twice
    (second,) = chunks_sent(core)
    assert second.offset == CHUNK_BYTES
    # A duplicated chunk is answered "not where I am" by the follower: that late answer
    # to the first chunk starts nothing either.
    refused = msgspec.structs.replace(taken, success=False)
    core.step(refused)  # type: ignore[attr-defined]
    assert chunks_sent(core) == []


def test_the_whole_snapshot_goes_once_through_a_network_that_duplicates_every_answer() -> None:
    core, sent = leader_sending_a_snapshot()
    delivered: list[SnapshotChunk] = []
    while sent:
        delivered.extend(sent)
        answers = [
            answer(chunk, chunk.offset + len(chunk.data)) for chunk in sent if not chunk.done
        ]
        sent = []
        for response in answers:
            for _ in range(2):
                core.step(response)  # type: ignore[attr-defined]
            sent.extend(chunks_sent(core))
    assert [chunk.offset for chunk in delivered] == [0, 10, 20, 30, 40]
    assert b"".join(chunk.data for chunk in delivered) == SNAPSHOT


class SnapshotResponseBeforeChunkOffset(
    msgspec.Struct, frozen=True, tag="SnapshotResponse", array_like=True
):
    """`SnapshotResponse` as a node from before `chunk_offset` declares it."""

    source: str
    target: str
    term: int
    round: int
    success: bool
    next_offset: int = 0
    match_index: int = 0


def test_an_answer_from_a_node_before_chunk_offset_moves_the_leader_on_as_before() -> None:
    core, (first,) = leader_sending_a_snapshot()
    old = SnapshotResponseBeforeChunkOffset(
        source=FOLLOWER,
        target=LEADER,
        term=first.term,
        round=first.round,
        success=True,
        next_offset=CHUNK_BYTES,
    )
    as_new = msgspec.msgpack.decode(msgspec.msgpack.encode(old), type=SnapshotResponse)
    assert as_new.chunk_offset == -1
    core.step(as_new)  # type: ignore[attr-defined]
    (second,) = chunks_sent(core)
    assert second.offset == CHUNK_BYTES
    new = answer(second, next_offset=2 * CHUNK_BYTES)
    as_old = msgspec.msgpack.decode(
        msgspec.msgpack.encode(new), type=SnapshotResponseBeforeChunkOffset
    )
    assert as_old.next_offset == 2 * CHUNK_BYTES  # an older leader reads it, as before
