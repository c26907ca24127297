"""Transport pieces that need no socket: coalesced peer batches stay within a frame."""

from __future__ import annotations

from typing import Any

from quorumlog.codec import wire
from quorumlog.raft.messages import Push, PushKind
from quorumlog.runtime.transport import Endpoint
from quorumlog.storage import LogEntry


class CapturingConnection:
    def __init__(self) -> None:
        self.payloads: list[bytes] = []

    def write_payload(self, payload: bytes) -> None:
        self.payloads.append(payload)


class NoHandler:
    def on_peer_batch(self, batch: wire.PeerBatch) -> None:
        raise AssertionError("not used")

    def on_client_request(self, request: Any, reply: Any) -> None:
        raise AssertionError("not used")

    def on_peer_address(self, peer: str, address: str) -> None:
        raise AssertionError("not used")


def envelope(index: int, size: int) -> wire.RaftEnvelope:
    push = Push(
        source="n1",
        target="n2",
        term=1,
        kind=PushKind.APPEND,
        round=1,
        index=index - 1,
        index_term=1,
        entries=[LogEntry(index=index, term=1, data=b"x" * size)],
    )
    return wire.RaftEnvelope(group="kv", message=push)


def test_a_batch_over_the_frame_bound_is_split_and_nothing_is_lost() -> None:
    endpoint = Endpoint("n1", "c", {}, NoHandler(), frame_bytes_max=10_000)
    connection = CapturingConnection()
    envelopes = [envelope(i, 3_000) for i in range(1, 11)]
    endpoint.write_batches(connection, envelopes)  # type: ignore[arg-type]
    assert len(connection.payloads) > 1
    assert all(len(payload) <= 10_000 for payload in connection.payloads)
    received = [e for p in connection.payloads for e in wire.decode(p).envelopes]  # type: ignore[union-attr]
    assert received == envelopes
    assert endpoint.dropped_messages == 0


def test_a_single_message_over_the_bound_is_dropped_and_counted() -> None:
    endpoint = Endpoint("n1", "c", {}, NoHandler(), frame_bytes_max=1_000)
    connection = CapturingConnection()
    endpoint.write_batches(connection, [envelope(1, 5_000), envelope(2, 10)])  # type: ignore[arg-type]
    assert endpoint.dropped_messages == 1
    assert [e for p in connection.payloads for e in wire.decode(p).envelopes] == [  # type: ignore[union-attr]
        envelope(2, 10)
    ]
