"""Keys starting with "__" are quorumlog's own: the node refuses user writes, deletes and
scans of them (a typed error on the wire), and serves its services' `internal` requests.

The refusals are checked with raw frames, so no client-side check could be what passes
the test; then through KVClient (ReservedKeyError) and its InternalKeys view."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from quorumlog.codec import wire
from quorumlog.errors import ReservedKeyError
from quorumlog.kv.client import KVClient
from quorumlog.kv.internal_keys import InternalKeys
from quorumlog.node.server import Node, NodeSettings

from .test_kv_requests import RawClient

Result = TypeVar("Result")


def write(request_id: int, op: str, key: str, internal: bool = False) -> wire.KVWrite:
    value = None if op in ("delete", "cas") else "v"
    command = wire.KVCommand(request_id, op, key, value, None)
    return wire.KVWrite(
        request_id=request_id, client_id="test", commands=[command], internal=internal
    )


def scan(request_id: int, internal: bool) -> wire.KVScan:
    return wire.KVScan(request_id=request_id, start="", internal=internal)


async def leading_node(tmp_path: Path) -> tuple[Node, int]:
    node = Node(
        NodeSettings(
            node_id="n1",
            listen="127.0.0.1:0",
            data_dir=str(tmp_path),
            tick_ms=5,
            election_ticks=2,
            bookie=False,  # its registration would be one more internal key in the scans
        )
    )
    port = await node.start()
    deadline = asyncio.get_running_loop().time() + 10
    while not node.groups["kv"].core.is_leader:
        assert asyncio.get_running_loop().time() < deadline, "no leader"
        await asyncio.sleep(0.005)
    return node, port


def run_with_node(tmp_path: Path, scenario: Callable[[Node, int], object]) -> None:
    async def main() -> None:
        node, port = await leading_node(tmp_path)
        try:
            await scenario(node, port)  # type: ignore[misc]
        finally:
            await node.stop()

    asyncio.run(main())


def test_the_node_refuses_user_writes_and_scans_of_internal_keys(tmp_path: Path) -> None:
    async def scenario(node: Node, port: int) -> None:
        client = await RawClient.connect(port)
        stored = await client.ask(write(1, "put", "__topics/t", internal=True))
        assert isinstance(stored, wire.KVWriteResult) and stored.results[0].ok
        assert isinstance(await client.ask(write(2, "put", "user/k")), wire.KVWriteResult)

        for request_id, op in enumerate(["put", "append", "delete", "cas"], start=10):
            for key in ("__topics/t", "__offsets/g/t/0", "__anything-later"):
                answer = await client.ask(write(request_id, op, key))
                assert isinstance(answer, wire.ErrorResponse), (op, key, answer)
                assert answer.code is wire.ErrorCode.RESERVED_KEY
                assert key in answer.message
        # One reserved key refuses the whole request: the user key beside it is not put.
        mixed = wire.KVWrite(
            request_id=20,
            client_id="test",
            commands=[
                wire.KVCommand(20, "put", "user/other", "v"),
                wire.KVCommand(21, "put", "__bookies/b1", "v"),
            ],
        )
        refused = await client.ask(mixed)
        assert isinstance(refused, wire.ErrorResponse)
        assert refused.code is wire.ErrorCode.RESERVED_KEY

        user_scan = await client.ask(scan(30, internal=False))
        assert isinstance(user_scan, wire.KVScanResult)
        assert [key for key, _ in user_scan.items] == ["user/k"]
        internal_scan = await client.ask(scan(31, internal=True))
        assert isinstance(internal_scan, wire.KVScanResult)
        assert [key for key, _ in internal_scan.items] == ["__topics/t", "user/k"]
        # Reading one internal key by its name stays allowed, and it is unchanged.
        read = await client.ask(wire.KVRead(request_id=32, keys=["__topics/t", "user/other"]))
        assert read == wire.KVReadResult(request_id=32, values=["v", None])
        await client.close()

    run_with_node(tmp_path, scenario)


def test_kv_client_raises_reserved_key_error_and_internal_keys_reach_them(
    tmp_path: Path,
) -> None:
    async def scenario(node: Node, port: int) -> None:
        def blocking() -> None:
            with KVClient([f"127.0.0.1:{port}"], timeout=5.0) as client:
                for call in (
                    lambda: client.put("__topics/x", "v"),
                    lambda: client.append("__topics/x", "v"),
                    lambda: client.delete("__topics/x"),
                    lambda: client.cas("__topics/x", None, "v"),
                ):
                    with pytest.raises(ReservedKeyError, match="__topics/x"):
                        call()
                internal = InternalKeys(client)
                internal.put("__topics/x", "descriptor")
                assert internal.cas("__topics/x", "descriptor", "newer")
                assert client.get("__topics/x") == "newer"
                assert client.scan_prefix("__") == []
                assert internal.scan_prefix("__") == [("__topics/x", "newer")]
                internal.delete("__topics/x")
                assert client.get("__topics/x") is None
                client.put("plain", "still works")
                assert client.get("plain") == "still works"

        await asyncio.to_thread(blocking)

    run_with_node(tmp_path, scenario)


def test_v3_writes_ranges_and_watches_keep_out_of_internal_keys(tmp_path: Path) -> None:
    """The etcd-style calls obey the same rule: a txn may not put or delete an internal
    key, nor delete or read a range reaching them; a user's range and watch over every key
    leave them out; one internal key is still readable by its name."""

    async def scenario(node: Node, port: int) -> None:
        def blocking() -> None:
            with KVClient([f"127.0.0.1:{port}"], timeout=5.0) as client:
                InternalKeys(client).put("__topics/x", "descriptor")
                client.put("a", "1")
                client.put("z", "2")
                for call in (
                    lambda: client.put("__topics/x", b"v", prev_kv=True),
                    lambda: client.delete_range("", "\x00"),
                    lambda: client.delete_range("__", prefix=True),
                    lambda: client.txn([], [("put", "__owners/y", b"v")], []),
                    lambda: (
                        client.txn(
                            [],
                            [
                                (
                                    "get",
                                    "",
                                )
                            ],
                            [],
                        )
                        if False
                        else client.txn([], [("delete", "__topics/x")], [])
                    ),
                ):
                    with pytest.raises(ReservedKeyError):
                        call()
                everything = client.range("", "\x00")
                assert [kv.key for kv in everything.kvs] == ["a", "z"]
                assert everything.count == 2
                assert [kv.key for kv in client.range("", "\x00", limit=1).kvs] == ["a"]
                assert client.range("__topics/x").kvs[0].value == b"descriptor"
                start = everything.revision + 1
                InternalKeys(client).put("__topics/x", "newer")
                client.put("m", "3")
                with client.watch("", prefix=True, start_revision=start) as watch:
                    first = next(iter(watch))
                assert first.kv.key == "m", "the internal key's change is left out"
                assert client.get("__topics/x") == "newer"

        await asyncio.to_thread(blocking)

    run_with_node(tmp_path, scenario)
