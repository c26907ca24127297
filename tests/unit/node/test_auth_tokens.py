"""A real node, in process, with auth on: a client whose token the node no longer knows
(another node issued it, or this one forgot it) authenticates again and goes on, without
its caller seeing anything; auth commands go through the node's KV as hashes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from quorumlog import AsyncKVClient
from quorumlog.auth.client import AuthClient
from quorumlog.auth.commands import USERS_KEY
from quorumlog.auth.model import Access, Permission, PermissionKind, prefix_range_end
from quorumlog.errors import AuthenticationRequiredError, PermissionDeniedError
from quorumlog.node.server import Node, NodeSettings

LEADER_WAIT_SECONDS = 10.0


async def wait_for_leader(node: Node) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LEADER_WAIT_SECONDS
    while not node.groups["kv"].core.is_leader:
        assert loop.time() < deadline, "no leader"
        await asyncio.sleep(0.005)


async def wait_for_heartbeats_after_enable(node: Node) -> None:
    """The bookie's registration goes on: its client connected before auth was on (with
    no credentials to give then), and reconnects with the node secret."""
    registrar = node.registrar
    assert registrar is not None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LEADER_WAIT_SECONDS
    target = registrar.heartbeats + 3
    while registrar.heartbeats < target or registrar.failing:
        assert loop.time() < deadline, f"heartbeats stopped ({registrar.failures} failed)"
        await asyncio.sleep(0.005)


def set_up_auth(endpoints: list[str]) -> None:
    """As an operator would, before and after `auth enable` (blocking: run in a thread)."""
    with AuthClient(endpoints) as admin:
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
    with AuthClient(endpoints, user="root", password="rootpw") as root:
        assert root.auth_status()
        assert root.user_get("alice").roles == ["app"]


def test_a_forgotten_token_costs_one_new_authentication(tmp_path: Path) -> None:
    async def scenario() -> None:
        node = Node(
            NodeSettings(
                node_id="n1",
                listen="127.0.0.1:0",
                data_dir=str(tmp_path),
                tick_ms=5,
                election_ticks=2,
                fsync=False,
                bookie_heartbeat_ms=20,
            )
        )
        port = await node.start()
        try:
            await wait_for_leader(node)
            endpoints = [f"127.0.0.1:{port}"]
            # Connected while auth is off (its connection gets no token), used after.
            early = AsyncKVClient(endpoints, user="alice", password="alicepw")
            await early.get("app/x")
            await asyncio.to_thread(set_up_auth, endpoints)
            await early.put("app/early", "1")
            await early.close()
            await wait_for_heartbeats_after_enable(node)
            guard = node.dispatcher.auth
            assert guard is not None and guard.enabled()
            assert node.kv is not None
            assert "alicepw" not in node.kv.machine.data[USERS_KEY]
            async with AsyncKVClient(endpoints, user="alice", password="alicepw") as alice:
                await alice.put("app/x", "1")
                first_tokens = set(guard.tokens)
                guard.tokens.clear()  # as a new leader would: it never issued this one
                await alice.put("app/x", "2")
                assert await alice.get("app/x") == "2"
                assert guard.tokens and not set(guard.tokens) & first_tokens
                try:
                    await alice.put("other/x", "1")
                except PermissionDeniedError:
                    pass
                else:
                    raise AssertionError("alice wrote outside app/")
            async with AsyncKVClient(endpoints, timeout=2.0) as anonymous:
                try:
                    await anonymous.get("app/x")
                except AuthenticationRequiredError:
                    pass
                else:
                    raise AssertionError("a request without credentials was served")
        finally:
            await node.stop()

    asyncio.run(scenario())
