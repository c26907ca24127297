"""Three real nodes in one process agree the cluster's feature level through the handshake
and the coordinator's log, keep it in their data directories and say it in their status;
a peer that says a lower level is refused at the handshake, and a node whose release is
below the level kept refuses to start, in one line."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from quorumlog.codec import wire
from quorumlog.codec.feature_levels import BASELINE_FEATURE_LEVEL, FEATURE_LEVEL
from quorumlog.codec.frame import FrameDecoder, encode_frame
from quorumlog.errors import ClusterLevelError
from quorumlog.node.cluster_level import CommittedLevelFile
from quorumlog.node.server import Node
from tests.unit.node.in_process_cluster import node_settings, start_nodes

WAIT_SECONDS = 20.0


async def handshake_as_old_peer(port: int) -> wire.Frame:
    """Say hello as peer "n9" of the baseline release; the node's first answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    hello = wire.Hello(
        cluster_id="quorumlog", sender="n9", is_peer=True, feature_level=BASELINE_FEATURE_LEVEL
    )
    writer.write(encode_frame(wire.encode(hello)))
    decoder = FrameDecoder()
    try:
        while True:
            data = await asyncio.wait_for(reader.read(65536), WAIT_SECONDS)
            assert data, "the node closed the connection without an answer"
            payloads = decoder.feed(data)
            if payloads:
                return wire.decode(payloads[0])
    finally:
        writer.close()


async def agree_then_stop(directory: Path) -> tuple[list[int], wire.Frame]:
    settings = node_settings(
        ["n1", "n2", "n3"], directory, tick_ms=10, election_ticks=5, fsync=False, bookie=False
    )
    nodes = await start_nodes(settings)
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while not all(node.committed_level == FEATURE_LEVEL for node in nodes):
            assert time.monotonic() < deadline, "the nodes never committed their level"
            await asyncio.sleep(0.01)  # the nodes run on this loop: yield to them
        shown = [
            node.dispatcher.status(node.groups["kv"].host, request_id=1).cluster_level
            for node in nodes
        ]
        return shown, await handshake_as_old_peer(nodes[0].port)
    finally:
        for node in nodes:
            await node.stop()


def test_nodes_commit_keep_and_show_the_level_and_refuse_a_downgrade(tmp_path: Path) -> None:
    shown, answer = asyncio.run(agree_then_stop(tmp_path))
    assert shown == [FEATURE_LEVEL] * 3
    assert isinstance(answer, wire.Refused), answer
    assert f"feature level {BASELINE_FEATURE_LEVEL}, below" in answer.reason
    for node_id in ("n1", "n2", "n3"):
        assert CommittedLevelFile(tmp_path / node_id).read() == FEATURE_LEVEL

    # The cluster moved on to a later release's level: this release may not start there.
    CommittedLevelFile(tmp_path / "n1").raise_to(FEATURE_LEVEL + 1)
    settings = node_settings(["n1", "n2", "n3"], tmp_path, fsync=False, bookie=False)[0]

    node = Node(settings)

    async def start() -> None:
        try:
            await node.start()
        finally:
            node.executor.shutdown()

    with pytest.raises(ClusterLevelError) as refused:
        asyncio.run(start())
    message = str(refused.value)
    assert "\n" not in message
    assert f"feature level {FEATURE_LEVEL}, below" in message
    assert f"committed feature level {FEATURE_LEVEL + 1}" in message
    assert node.port == 0  # refused before it listened
