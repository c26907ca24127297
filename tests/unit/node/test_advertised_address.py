"""A node refuses to tell others an address they cannot dial (`check_advertised`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from quorumlog.errors import AdvertisedAddressError
from quorumlog.node.addresses import check_advertised
from quorumlog.node.bookie_process import BookieProcess, BookieProcessSettings
from quorumlog.node.ha_topics import HATopicService
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


def test_a_bookie_refuses_before_opening_anything(tmp_path: Path) -> None:
    settings = BookieProcessSettings(
        bookie_id="b1",
        listen="0.0.0.0:0",
        data_dir=str(tmp_path / "b1"),
        metadata=["127.0.0.1:1"],
    )
    with pytest.raises(AdvertisedAddressError, match="wildcard"):
        asyncio.run(BookieProcess(settings).start())
    assert not (tmp_path / "b1").exists()


def test_ha_links_listen_on_the_listen_host_and_tell_the_advertised_one(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = HATopicService(
            "n1",
            "test",
            str(tmp_path),
            "0.0.0.0",
            False,
            lambda: ["127.0.0.1:1"],
            lambda _: None,
            advertised_host="127.0.0.1",
        )
        await service.listen()
        try:
            assert service.links is not None and service.links.server is not None
            bound_host, port = service.links.server.sockets[0].getsockname()[:2]
            assert bound_host == "0.0.0.0"
            assert service.ha_address == f"127.0.0.1:{port}"
        finally:
            await service.stop()

    asyncio.run(scenario())
