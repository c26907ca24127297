"""A node refuses to tell others an address they cannot dial (`check_advertised`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from quorumlog.errors import AdvertisedAddressError
from quorumlog.node.addresses import check_advertised
from quorumlog.node.server import Node, NodeSettings


@pytest.mark.parametrize(
    ("listen", "advertise"),
    [
        ("0.0.0.0:2379", ""),
        ("[::]:2379", ""),
        (":2379", ""),
        ("127.0.0.1:2379", "0.0.0.0:2379"),
        ("0.0.0.0:2379", "[::]:2379"),
        ("0.0.0.0:2379", "10.0.0.5"),
        ("0.0.0.0:2379", "10.0.0.5:0"),
    ],
)
def test_refused(listen: str, advertise: str) -> None:
    with pytest.raises(AdvertisedAddressError):
        check_advertised(listen, advertise)


@pytest.mark.parametrize(
    ("listen", "advertise"),
    [
        ("127.0.0.1:0", ""),
        ("node-1.example:2379", ""),
        ("0.0.0.0:2379", "10.0.0.5:2379"),
        ("[::]:2379", "[fd00::5]:2379"),
    ],
)
def test_accepted(listen: str, advertise: str) -> None:
    check_advertised(listen, advertise)


def test_the_node_refuses_before_opening_anything(tmp_path: Path) -> None:
    node = Node(NodeSettings(node_id="n1", listen="0.0.0.0:0", data_dir=str(tmp_path / "n1")))

    async def start() -> None:
        try:
            await node.start()
        finally:
            node.executor.shutdown()

    with pytest.raises(AdvertisedAddressError, match="wildcard"):
        asyncio.run(start())
    assert not (tmp_path / "n1").exists()
