"""Several real nodes in one process, each on a port the OS picked when it bound.

Picking free ports first and binding them later races with anything else on the machine
binding ports meanwhile (tests run in parallel); here every node listens on port 0 and the
nodes learn each other's addresses once all are listening.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quorumlog.node.addresses import AddressSource
from quorumlog.node.server import Node, NodeSettings

PLACEHOLDER_ADDRESS = "127.0.0.1:0"
"""Where peers are said to be until the real addresses are known: port 0, which no
connection can reach, so nothing depends on a fixed port being free."""


def node_settings(node_ids: list[str], directory: Path, **fields: Any) -> list[NodeSettings]:
    return [
        NodeSettings(
            node_id=node_id,
            listen="127.0.0.1:0",
            data_dir=str(directory / node_id),
            peers={other: PLACEHOLDER_ADDRESS for other in node_ids if other != node_id},
            **fields,
        )
        for node_id in node_ids
    ]


async def start_nodes(settings: list[NodeSettings]) -> list[Node]:
    """Start every node, then tell each where the others listen (as `--peers` would:
    these addresses are current, so they replace the placeholders)."""
    nodes = [Node(one) for one in settings]
    for node in nodes:
        await node.start()
    addresses = {node.node_id: node.addresses[node.node_id] for node in nodes}
    for node in nodes:
        node.learn_addresses(addresses, AddressSource.OPERATOR)
    return nodes
