"""Transport pieces: coalesced peer batches stay within a frame; peers announce where they
listen, and a pair of nodes settles on one link."""

from __future__ import annotations

import asyncio
from typing import Any

from quorumlog.codec import wire
from quorumlog.raft.messages import Push, PushKind
from quorumlog.runtime.transport import Connection, Endpoint, announced_address
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


# --- addresses follow the nodes ------------------------------------------------------------


def test_an_announced_wildcard_host_is_the_host_the_connection_came_from() -> None:
    assert announced_address("10.0.0.5:7000", "10.0.0.9") == "10.0.0.5:7000"
    assert announced_address("0.0.0.0:7000", "10.0.0.9") == "10.0.0.9:7000"
    assert announced_address("[::]:7000", "fe80::1") == "[fe80::1]:7000"
    assert announced_address("", "10.0.0.9") is None
    assert announced_address("0.0.0.0:7000", None) is None


class LearningHandler:
    """Takes announced addresses as the node does: learn, then dial with them."""

    def __init__(self) -> None:
        self.endpoint: Endpoint | None = None
        self.announced: dict[str, str] = {}

    def on_peer_batch(self, batch: wire.PeerBatch) -> None:
        pass

    def on_client_request(self, request: Any, reply: Any) -> None:
        raise AssertionError("not used")

    def on_peer_address(self, peer: str, address: str) -> None:
        self.announced[peer] = address
        assert self.endpoint is not None
        self.endpoint.update_peers({**self.endpoint.peer_addresses, peer: address})


def test_a_node_its_dialler_does_not_know_announces_itself_and_the_pair_keeps_one_link() -> None:
    """n1 dials n2, but n1 was told nothing about n2 (n2 restarted on a new port). n2
    dials n1 and says where it listens; n1 learns it and dials; the link n1 dialled stays,
    on both ends, and n2's own is closed."""

    async def scenario() -> None:
        handlers = {node_id: LearningHandler() for node_id in ("n1", "n2")}
        n1 = Endpoint("n1", "c", {}, handlers["n1"])
        handlers["n1"].endpoint = n1
        n1_port = await n1.listen("127.0.0.1", 0)
        n2 = Endpoint("n2", "c", {"n1": f"127.0.0.1:{n1_port}"}, handlers["n2"])
        handlers["n2"].endpoint = n2
        n2_port = await n2.listen("127.0.0.1", 0)
        try:
            deadline = asyncio.get_running_loop().time() + 10

            def settled() -> bool:
                link_at_n1 = n1.peers.get("n2")
                link_at_n2 = n2.peers.get("n1")
                return (
                    link_at_n1 is not None
                    and link_at_n2 is not None
                    and link_at_n1.dialed_peer == "n2"  # n1 dialled it ...
                    and link_at_n2.dialed_peer is None  # ... and n2 accepted it
                    and len(n1.connections) == 1
                    and len(n2.connections) == 1
                )

            while not settled():
                assert asyncio.get_running_loop().time() < deadline, "the pair did not settle"
                await asyncio.sleep(0.01)
            assert handlers["n1"].announced == {"n2": f"127.0.0.1:{n2_port}"}
            assert handlers["n2"].announced == {"n1": f"127.0.0.1:{n1_port}"}
        finally:
            await n1.close()
            await n2.close()

    asyncio.run(scenario())


class FakeTransport:
    def __init__(self) -> None:
        self.closed = False

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def link(endpoint: Endpoint, dialed_peer: str | None, peer: str) -> Connection:
    connection = Connection(endpoint, dialed_peer)
    connection.transport = FakeTransport()  # type: ignore[assignment]
    connection.peer_id = peer
    return connection


def test_of_two_links_the_one_the_smaller_id_dialled_stays_whichever_came_first() -> None:
    async def scenario() -> None:
        # At n1 (the smaller id): its own link to n2 is the pair's.
        n1 = Endpoint("n1", "c", {}, NoHandler())
        own = link(n1, "n2", "n2")
        announced = link(n1, None, "n2")
        n1.peer_ready("n2", own)
        n1.peer_ready("n2", announced)
        assert n1.peers["n2"] is own and announced.transport.is_closing()  # type: ignore[union-attr]
        # At n2: the link n1 dialled replaces n2's announcement, not the other way round.
        n2 = Endpoint("n2", "c", {}, NoHandler())
        announcing = link(n2, "n1", "n1")
        from_n1 = link(n2, None, "n1")
        n2.peer_ready("n1", announcing)
        n2.peer_ready("n1", from_n1)
        assert n2.peers["n1"] is from_n1 and announcing.transport.is_closing()  # type: ignore[union-attr]
        # A peer that restarted dials again: the same kind of link, so the new one wins.
        again = link(n2, None, "n1")
        n2.peer_ready("n1", again)
        assert n2.peers["n1"] is again and from_n1.transport.is_closing()  # type: ignore[union-attr]

    asyncio.run(scenario())
