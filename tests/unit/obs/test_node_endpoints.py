"""Three real nodes in one process, each serving HTTP: every node's registry is its own
(nothing shared through prometheus-client's global one), and the pages read the node."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from quorumlog.node.server import Node
from tests.unit.node.in_process_cluster import node_settings, start_nodes

ELECTION_TIMEOUT_SECONDS = 20.0
READ_TIMEOUT_SECONDS = 10.0


async def http_get(address: str, path: str) -> tuple[int, bytes]:
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {address}\r\n\r\n".encode())
    answer = await asyncio.wait_for(reader.read(), READ_TIMEOUT_SECONDS)
    writer.close()
    await writer.wait_closed()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


async def kv_leader_count(node: Node) -> float:
    _, body = await http_get(node.observability.http_address, "/metrics")
    return sum(
        sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name == "quorumlog_server_is_leader" and sample.labels["group"] == "kv"
    )


def test_in_process_nodes_have_registries_and_pages_of_their_own(tmp_path: Path) -> None:
    async def scenario() -> None:
        settings = node_settings(
            ["n1", "n2", "n3"], tmp_path, fsync=False, tick_ms=20, http_listen="127.0.0.1:0"
        )
        nodes = await start_nodes(settings)
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + ELECTION_TIMEOUT_SECONDS
            while not any(node.groups["kv"].host.is_leader for node in nodes):
                assert loop.time() < deadline, "no KV leader elected"
                await asyncio.sleep(0.02)  # yields to the nodes on this loop; polls a condition
            counts = [await kv_leader_count(node) for node in nodes]
            leaders = [node.groups["kv"].host.is_leader for node in nodes]
            # Each scrape shows its own node only: one 1 among three, where the leader is.
            assert counts == [float(is_leader) for is_leader in leaders]
            status, body = await http_get(nodes[0].observability.http_address, "/api/status")
            shown = json.loads(body)
            assert status == 200 and shown["node"] == "n1"
            assert [member["id"] for member in shown["members"]] == ["n1", "n2", "n3"]
            assert {group["name"] for group in shown["groups"]} >= {"kv"}
            status, body = await http_get(nodes[0].observability.http_address, "/")
            assert status == 200 and b"/api/status" in body
        finally:
            for node in nodes:
                await node.stop()

    asyncio.run(scenario())
