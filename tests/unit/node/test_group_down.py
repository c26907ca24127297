"""A group that stops on its leader's node (a storage failure) while that node goes on
serving: the node tells the group's other members, whose quiet followers then elect. Their
node-level liveness cannot tell them (the node still pings), so without the notice they
would wait on a dead leader forever."""

from __future__ import annotations

import asyncio
from pathlib import Path

from quorumlog.errors import StorageError
from quorumlog.node.server import Node

from .in_process_cluster import node_settings, start_nodes

DEADLINE_SECONDS = 20.0
GROUP = "kv"


async def until(condition: object, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + DEADLINE_SECONDS
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, f"never: {what}"
        await asyncio.sleep(0.01)


def leader_of(nodes: list[Node]) -> Node | None:
    leaders = [node for node in nodes if node.groups[GROUP].core.is_leader]
    return leaders[0] if len(leaders) == 1 else None


def test_followers_of_a_quiet_group_elect_when_it_stops_on_the_leaders_node(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        settings = node_settings(
            ["n1", "n2", "n3"],
            tmp_path,
            tick_ms=10,
            election_ticks=5,
            quiesce_idle_ticks=3,
            fsync=False,
            bookie=False,
            ha_controller=False,
        )
        nodes = await start_nodes(settings)
        try:
            await until(lambda: leader_of(nodes) is not None, "a leader")
            await until(
                lambda: all(node.groups[GROUP].core.quiet for node in nodes), "a quiet group"
            )
            old = leader_of(nodes)
            assert old is not None
            old.groups[GROUP].host.fail(StorageError("injected by the test"))
            others = [node for node in nodes if node is not old]
            await until(
                lambda: any(node.groups[GROUP].core.is_leader for node in others),
                "a new leader among the other members",
            )
            assert old.groups[GROUP].failure is not None, "the old leader's group stays down"
        finally:
            for node in nodes:
                await node.stop()

    asyncio.run(scenario())
