"""The sharded KV with auth on, three real nodes in one process: a user's keys are checked
at the shard groups, controller changes need the membership right, and shards still move
between groups (their pulls go between nodes under the node secret)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from quorumlog.auth.client import AuthClient
from quorumlog.auth.model import Access, Permission, PermissionKind, prefix_range_end
from quorumlog.errors import PermissionDeniedError
from quorumlog.node.server import Node
from quorumlog.shard.admin import ShardAdmin
from quorumlog.shard.client import ShardedKVClient
from tests.unit.node.in_process_cluster import node_settings, start_nodes

NODE_IDS = ["n1", "n2", "n3"]
WAIT_SECONDS = 20.0


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def operate(endpoints: list[str], nodes: list[Node]) -> None:
    """Blocking, as an operator and a user would (runs on a thread)."""
    with AuthClient(endpoints, timeout=10.0) as admin:
        admin.user_add("root", "rootpw")
        admin.user_grant_role("root", "root")
        admin.user_add("alice", "alicepw")
        admin.role_add("app")
        admin.role_grant_permission(
            "app",
            Permission(PermissionKind.KEY, Access.READWRITE, "app/", prefix_range_end("app/")),
        )
        admin.user_grant_role("alice", "app")
        admin.auth_enable()
    with ShardAdmin(endpoints, timeout=10.0, user="root", password="rootpw") as shard_admin:
        shard_admin.join({1: endpoints})
        with ShardedKVClient(endpoints, timeout=10.0, user="alice", password="alicepw") as alice:
            values = {f"app/{number}": f"value-{number}" for number in range(12)}
            for key, value in values.items():
                alice.put(key, value)
            with pytest.raises(PermissionDeniedError):
                alice.put("other/1", "x")
            with (
                ShardAdmin(
                    endpoints, timeout=10.0, user="alice", password="alicepw"
                ) as alice_admin,
                pytest.raises(PermissionDeniedError),
            ):
                alice_admin.join({2: endpoints})
            shard_admin.join({2: endpoints})  # half the shards move to group 2
            wait_for(
                lambda: all(
                    node.shard_services[2].machine.stored_key_count() > 0 for node in nodes
                ),
                "shards to reach group 2",
            )
            for key, value in values.items():
                assert alice.get(key) == value


def test_sharded_kv_with_auth_on(tmp_path: Path) -> None:
    async def scenario() -> None:
        nodes = await start_nodes(
            node_settings(
                NODE_IDS,
                tmp_path,
                tick_ms=10,
                election_ticks=5,
                fsync=False,
                controller=NODE_IDS,
                shard_groups={1: NODE_IDS, 2: NODE_IDS},
                shard_count=4,
                shard_monitor_ms=20,
            )
        )
        try:
            endpoints = [node.addresses[node.node_id] for node in nodes]
            await asyncio.to_thread(operate, endpoints, nodes)
        finally:
            for node in nodes:
                await node.stop()

    asyncio.run(scenario())
