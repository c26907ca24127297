"""Plain heartbeats and answers as rows in the node pair's PeerBatch (codec/heartbeat_rows.py,
runtime/transport.py `send_row`, node/server.py `send` / `step_rows`): a row rebuilds the
very message sent, a message a row cannot say goes in an envelope, a peer that did not say
it reads rows gets envelopes, and a row for a group the receiver does not host is counted
and dropped like an envelope."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import msgspec

from quorumlog.codec import wire
from quorumlog.codec.heartbeat_rows import (
    HeartbeatAnswerRow,
    HeartbeatRow,
    answer_of,
    push_of,
    row_of,
)
from quorumlog.node.server import Node
from quorumlog.raft.messages import Message, Push, PushKind, PushResponse
from quorumlog.runtime.transport import Endpoint
from quorumlog.storage import LogEntry

HEARTBEAT = Push(
    source="n1",
    target="n2",
    term=7,
    kind=PushKind.COMMIT,
    round=12,
    commit_index=4_000_000_123,
    read_sequence=99,
    answer_wanted=False,
)
ANSWER = PushResponse(
    source="n2",
    target="n1",
    term=7,
    kind=PushKind.COMMIT,
    round=12,
    success=True,
    match_index=41,
    end_index=43,
    read_sequence=99,
)


def through_the_wire(batch: wire.PeerBatch) -> wire.PeerBatch:
    decoded = wire.decode(wire.encode(batch))
    assert isinstance(decoded, wire.PeerBatch)
    return decoded


def test_a_row_rebuilds_the_heartbeat_and_the_answer_it_stands_for() -> None:
    heartbeat_row = row_of("p-17", HEARTBEAT)
    answer_row = row_of("p-17", ANSWER)
    assert isinstance(heartbeat_row, HeartbeatRow)
    assert isinstance(answer_row, HeartbeatAnswerRow)
    batch = through_the_wire(
        wire.PeerBatch(
            envelopes=[],
            source="n1",
            heartbeats=[heartbeat_row],
            heartbeat_answers=[answer_row],
        )
    )
    assert push_of(batch.heartbeats[0], "n1", "n2") == HEARTBEAT
    assert answer_of(batch.heartbeat_answers[0], "n2", "n1") == ANSWER
    assert batch.heartbeats[0].group == "p-17"


def test_a_message_a_row_cannot_say_goes_in_an_envelope() -> None:
    entries = [LogEntry(index=5, term=7, data=b"x")]
    refused: list[Message] = [
        msgspec.structs.replace(HEARTBEAT, quiesce=True, index=4, index_term=7),
        msgspec.structs.replace(HEARTBEAT, kind=PushKind.APPEND, index=4, entries=entries),
        msgspec.structs.replace(HEARTBEAT, kind=PushKind.COMPARE, index=4, index_term=7),
        msgspec.structs.replace(ANSWER, quiet=True),
        msgspec.structs.replace(ANSWER, kind=PushKind.COMPARE, conflict_term=3),
        msgspec.structs.replace(ANSWER, index=4),
    ]
    assert [row_of("g", message) for message in refused] == [None] * len(refused)


def test_a_peer_batch_without_rows_encodes_as_before() -> None:
    """An envelope-only batch (what an old peer gets) carries none of the new keys."""
    envelope = wire.RaftEnvelope(group="g", message=HEARTBEAT)
    encoded = wire.encode(wire.PeerBatch(envelopes=[envelope]))
    assert encoded == wire.encode(OldPeerBatch(envelopes=[envelope]))


class OldPeerBatch(msgspec.Struct, frozen=True, tag="PeerBatch", omit_defaults=True):
    """`PeerBatch` as a node from before rows declares it."""

    envelopes: list[wire.RaftEnvelope]
    down_node: str = ""
    down_groups: list[str] = msgspec.field(default_factory=list)


class CapturingConnection:
    def __init__(self, heartbeat_rows: bool) -> None:
        self.heartbeat_rows = heartbeat_rows
        self.payloads: list[bytes] = []

    def buffered_bytes(self) -> int:
        return 0

    def write_payload(self, payload: bytes) -> None:
        self.payloads.append(payload)

    def batches(self) -> list[wire.PeerBatch]:
        return [wire.decode(payload) for payload in self.payloads]  # type: ignore[misc]


def endpoint_with(connection: CapturingConnection) -> Endpoint:
    endpoint = Endpoint("n1", "c", {}, handler=None)  # type: ignore[arg-type]
    endpoint.peers["n2"] = connection  # type: ignore[assignment]
    return endpoint


def queue_rows(endpoint: Endpoint) -> None:
    for group in ("a", "b"):
        row = row_of(group, HEARTBEAT)
        assert row is not None
        endpoint.send_row("n2", row)
    answer = row_of("c", msgspec.structs.replace(ANSWER, source="n1", target="n2"))
    assert answer is not None
    endpoint.send_row("n2", answer)


def test_a_peer_that_reads_rows_gets_one_batch_of_rows() -> None:
    connection = CapturingConnection(heartbeat_rows=True)
    endpoint = endpoint_with(connection)

    async def scenario() -> None:
        queue_rows(endpoint)
        endpoint.flush()

    run(scenario())
    (batch,) = connection.batches()
    assert batch.envelopes == [] and batch.source == "n1"
    assert [row.group for row in batch.heartbeats] == ["a", "b"]
    assert [row.group for row in batch.heartbeat_answers] == ["c"]
    assert endpoint.rows_sent == 3


def test_a_peer_that_did_not_say_it_reads_rows_gets_envelopes() -> None:
    connection = CapturingConnection(heartbeat_rows=False)
    endpoint = endpoint_with(connection)

    async def scenario() -> None:
        queue_rows(endpoint)
        endpoint.flush()

    run(scenario())
    (payload,) = connection.payloads
    old = msgspec.msgpack.decode(payload, type=OldPeerBatch)  # as an old node reads it
    assert [(e.group, e.message) for e in old.envelopes] == [
        ("a", HEARTBEAT),
        ("b", HEARTBEAT),
        ("c", msgspec.structs.replace(ANSWER, source="n1", target="n2")),
    ]
    assert endpoint.rows_sent == 0 and endpoint.rows_sent_as_envelopes == 3


def test_rows_that_do_not_fit_one_frame_are_split() -> None:
    endpoint = Endpoint("n1", "c", {}, handler=None, frame_bytes_max=2_000)  # type: ignore[arg-type]
    connection = CapturingConnection(heartbeat_rows=True)
    rows = [HeartbeatRow(f"group-{number}", 7, 1, 5, 9, True) for number in range(300)]
    endpoint.write_batches(connection, [], rows, [])  # type: ignore[arg-type]
    assert len(connection.payloads) > 1
    assert all(len(payload) <= 2_000 for payload in connection.payloads)
    assert [row for batch in connection.batches() for row in batch.heartbeats] == rows


def test_one_heartbeat_and_one_answer_too_large_together_go_in_two_frames() -> None:
    heartbeat = HeartbeatRow("g" * 120, 7, 1, 5, 9, True)
    answer = row_of("a" * 120, msgspec.structs.replace(ANSWER, source="n1", target="n2"))
    assert isinstance(answer, HeartbeatAnswerRow)
    batch = wire.PeerBatch([], source="n1", heartbeats=[heartbeat], heartbeat_answers=[answer])
    together = len(wire.encode(batch))
    endpoint = Endpoint("n1", "c", {}, handler=None, frame_bytes_max=together - 1)  # type: ignore[arg-type]
    connection = CapturingConnection(heartbeat_rows=True)
    endpoint.write_batches(connection, [], [heartbeat], [answer])  # type: ignore[arg-type]
    batches = connection.batches()
    assert [len(batch.heartbeats) + len(batch.heartbeat_answers) for batch in batches] == [1, 1]
    assert endpoint.dropped_messages == 0


class RecordingGroup:
    def __init__(self) -> None:
        self.stepped: list[Message] = []

    def step(self, message: Message) -> None:
        self.stepped.append(message)


def receiving_node(groups: dict[str, Any]) -> Any:
    """What `Node.on_peer_batch` reads of a node (a whole node needs a data directory)."""
    node = SimpleNamespace(groups=groups, node_id="n2", unknown_group_messages=0)
    node.step_rows = lambda batch: Node.step_rows(node, batch)  # type: ignore[arg-type]
    return node


def test_rows_are_stepped_as_their_messages_and_unknown_groups_counted() -> None:
    known = RecordingGroup()
    node = receiving_node({"a": known})
    heartbeat_row = row_of("a", HEARTBEAT)
    unknown_row = row_of("gone", HEARTBEAT)
    answer_row = row_of("a", msgspec.structs.replace(ANSWER, source="n1", target="n2"))
    assert heartbeat_row and unknown_row and answer_row
    batch = wire.PeerBatch(
        envelopes=[wire.RaftEnvelope(group="gone", message=HEARTBEAT)],
        source="n1",
        heartbeats=[heartbeat_row, unknown_row],  # type: ignore[list-item]
        heartbeat_answers=[answer_row],  # type: ignore[list-item]
    )
    Node.on_peer_batch(node, through_the_wire(batch))
    assert known.stepped == [HEARTBEAT, msgspec.structs.replace(ANSWER, source="n1", target="n2")]
    assert node.unknown_group_messages == 2  # the envelope and the row for "gone"


def run(coroutine: Any) -> None:
    asyncio.run(coroutine)
