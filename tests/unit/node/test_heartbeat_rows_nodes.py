"""Heartbeats as rows between real nodes (codec/heartbeat_rows.py): three nodes in one
process, one of them behaving as a node from before rows (`Endpoint.heartbeat_rows` off:
its handshake says nothing of rows and it writes none). The cluster elects and
replicates; the two new nodes exchange rows and send the old one envelopes."""

from __future__ import annotations

import time
from pathlib import Path

from quorumlog.kv.client import KVClient
from quorumlog.node.addresses import AddressSource
from quorumlog.node.server import Node
from tests.unit.node.in_process_cluster import node_settings
from tests.unit.node.test_consumer_group_nodes import WAIT_SECONDS, LoopThread


async def start_with_one_old_node(directory: Path) -> list[Node]:
    """As `start_nodes`, with n3 behaving as a node from before rows."""
    settings = node_settings(
        ["n1", "n2", "n3"], directory, tick_ms=10, election_ticks=5, fsync=False, bookie=False
    )
    nodes = [Node(one) for one in settings]
    nodes[2].endpoint.heartbeat_rows = False
    for node in nodes:
        await node.start()
    addresses = {node.node_id: node.addresses[node.node_id] for node in nodes}
    for node in nodes:
        node.learn_addresses(addresses, AddressSource.OPERATOR)
    return nodes


def test_new_nodes_exchange_rows_and_an_old_node_gets_envelopes(tmp_path: Path) -> None:
    loop = LoopThread()
    nodes: list[Node] = loop.run(start_with_one_old_node(tmp_path))  # type: ignore[assignment]
    try:
        addresses = [f"127.0.0.1:{node.port}" for node in nodes]
        with KVClient(addresses) as kv:
            for number in range(20):
                kv.put(f"k{number}", str(number))
            assert kv.get("k19") == "19"
        new, _, old = nodes
        deadline = time.monotonic() + WAIT_SECONDS
        while not (new.endpoint.rows_sent and new.endpoint.rows_sent_as_envelopes):
            assert time.monotonic() < deadline, "no rows (or no envelopes to the old node)"
            time.sleep(0.05)
        assert old.endpoint.rows_sent == 0
        assert all(node.unknown_group_messages == 0 for node in nodes)
    finally:
        for node in nodes:
            loop.run(node.stop())
        loop.stop()
