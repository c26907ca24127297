"""Real nodes in one process: a node restarted on a new port while its peers keep running
is found again — by peers that were never told (it announces itself in the handshake,
whether it is the one that dials or the one that waits to be dialled), in leader hints,
and against the stale addresses its own logs replay (a topic descriptor stored before)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import msgspec

from quorumlog.codec import wire
from quorumlog.node.server import Node
from tests.unit.node.in_process_cluster import node_settings, start_nodes
from tests.unit.node.test_kv_requests import RawClient

NODE_IDS = ["n1", "n2", "n3"]
WAIT_SECONDS = 20.0


async def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_SECONDS
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def kv_leader(nodes: list[Node]) -> Node | None:
    leaders = [node for node in nodes if node.groups["kv"].core.is_leader]
    return leaders[0] if len(leaders) == 1 else None


async def restart_on_a_new_port(nodes: list[Node], node_id: str) -> list[Node]:
    """Stop `node_id` and start it over its data on a fresh port, told where the others
    are (as `--peers` would); the others are told nothing."""
    [old] = [node for node in nodes if node.node_id == node_id]
    old_address = old.address_of(node_id)
    await old.stop()
    others = {node.node_id: node.address_of(node.node_id) or "" for node in nodes}
    del others[node_id]
    restarted = Node(msgspec.structs.replace(old.settings, peers=others))
    await restarted.start()
    assert restarted.address_of(node_id) != old_address
    return [restarted if node.node_id == node_id else node for node in nodes]


def hosts_the_topic(node: Node) -> bool:
    return ("events", 0) in node.streams.partitions


def everyone_agrees(nodes: list[Node]) -> bool:
    """Every node knows every node's current address and has a live link to each."""
    current = {node.node_id: node.address_of(node.node_id) for node in nodes}
    return all(
        node.addresses == current and set(node.endpoint.peers) == set(current) - {node.node_id}
        for node in nodes
    )


async def create_topic(nodes: list[Node], name: str) -> None:
    await wait_for(lambda: kv_leader(nodes) is not None, "a kv leader")
    leader = kv_leader(nodes)
    assert leader is not None
    client = await RawClient.connect(leader.port)
    try:
        answer = await client.ask(
            wire.CreateTopic(
                request_id=1, name=name, settings=wire.TopicSettings(partitions=1, replication=3)
            )
        )
        assert isinstance(answer, wire.Done), answer
    finally:
        await client.close()


async def leader_hint_from_a_follower(nodes: list[Node]) -> str | None:
    leader = kv_leader(nodes)
    [follower, *_] = [node for node in nodes if node is not leader]
    client = await RawClient.connect(follower.port)
    try:
        answer = await client.ask(wire.KVRead(request_id=1, keys=["k"]))
    finally:
        await client.close()
    assert isinstance(answer, wire.ErrorResponse), answer
    assert answer.code is wire.ErrorCode.NOT_LEADER, answer
    return answer.leader_hint


def test_a_node_restarted_on_a_new_port_is_found_by_peers_that_were_not_told(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        nodes = await start_nodes(
            node_settings(NODE_IDS, tmp_path, tick_ms=10, election_ticks=5, fsync=False)
        )
        try:
            await create_topic(nodes, "events")  # stores every node's address as of now
            await wait_for(lambda: all(hosts_the_topic(node) for node in nodes), "the topic")
            # n3 sorts last: its peers dial it, at the address they knew. It must tell them.
            nodes = await restart_on_a_new_port(nodes, "n3")
            await wait_for(lambda: everyone_agrees(nodes), "n1 and n2 to find n3 again")
            await wait_for(lambda: hosts_the_topic(nodes[2]), "n3 to host the topic again")
            # n1 sorts first: it dials, and its Hello says where it listens now. Its logs
            # replay the topic descriptor, which names n3's old address: it must not win.
            nodes = await restart_on_a_new_port(nodes, "n1")
            await wait_for(lambda: hosts_the_topic(nodes[0]), "n1 to host the topic again")
            await wait_for(lambda: everyone_agrees(nodes), "n2 and n3 to find n1 again")
            await wait_for(lambda: kv_leader(nodes) is not None, "a kv leader")
            leader = kv_leader(nodes)
            assert leader is not None
            assert await leader_hint_from_a_follower(nodes) == leader.address_of(leader.node_id)
        finally:
            for node in nodes:
                await node.stop()

    asyncio.run(scenario())


def test_an_advertised_address_is_the_one_the_node_gives_out(tmp_path: Path) -> None:
    async def scenario() -> None:
        [settings] = node_settings(["n1"], tmp_path, fsync=False)
        node = Node(msgspec.structs.replace(settings, advertise="node-one.example:7000"))
        await node.start()
        try:
            assert node.address_of("n1") == "node-one.example:7000"
            assert node.endpoint.listen_address == "node-one.example:7000"  # said in Hello
        finally:
            await node.stop()

    asyncio.run(scenario())
