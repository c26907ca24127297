"""Three real nodes in one process agree the cluster's feature level through the handshake
and the coordinator's log, keep it in their data directories and say it in their status;
a node whose release is below the level kept refuses to start, in one line."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from quorumlog.codec.feature_levels import FEATURE_LEVEL
from quorumlog.errors import ClusterLevelError
from quorumlog.node.cluster_level import CommittedLevelFile
from quorumlog.node.server import Node
from tests.unit.node.in_process_cluster import node_settings, start_nodes

WAIT_SECONDS = 20.0


async def agree_then_stop(directory: Path) -> list[int]:
    settings = node_settings(
        ["n1", "n2", "n3"], directory, tick_ms=10, election_ticks=5, fsync=False, bookie=False
    )
    nodes = await start_nodes(settings)
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while not all(node.committed_level == FEATURE_LEVEL for node in nodes):
            assert time.monotonic() < deadline, "the nodes never committed their level"
            await asyncio.sleep(0.01)  # the nodes run on this loop: yield to them
        return [
            node.dispatcher.status(node.groups["kv"].host, request_id=1).cluster_level
            for node in nodes
        ]
    finally:
        for node in nodes:
            await node.stop()


def test_nodes_commit_keep_and_show_the_level_and_refuse_a_downgrade(tmp_path: Path) -> None:
    shown = asyncio.run(agree_then_stop(tmp_path))
    assert shown == [FEATURE_LEVEL] * 3
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
