"""Bookies hosted by real nodes, in process: they register in the "kv" group and stay
writable while they heartbeat; a node without a bookie registers nothing and refuses the
bookie protocol with a typed answer; bad bookie input through a node's port gets typed
answers or a closed connection, and the node keeps serving KV and bookie requests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import msgspec

from quorumlog.codec import wire
from quorumlog.codec.frame import FRAME_HEADER
from quorumlog.kv.client import KVClient
from quorumlog.kv.internal_keys import InternalKeys
from quorumlog.ledger.bookie_format import ID_MAX
from quorumlog.ledger.metadata import master_key
from quorumlog.ledger.registry import (
    BOOKIE_PREFIX,
    BookieRecord,
    bookie_key,
    decode_bookie_record,
    registration,
)
from quorumlog.node.server import Node

from .in_process_cluster import node_settings, start_nodes
from .test_kv_requests import RawClient

KEY = master_key(b"secret")
LEDGER_ID = 7
DEADLINE_SECONDS = 20.0
HEARTBEAT_MS = 50

Value = TypeVar("Value")


async def eventually(
    condition: Callable[[], Awaitable[Value | None]], what: str, seconds: float = DEADLINE_SECONDS
) -> Value:
    """Await `condition` until it gives something truthy; fail naming `what` at the deadline."""
    deadline = time.monotonic() + seconds
    while True:
        value = await condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def records_of(nodes: list[Node]) -> Callable[[], Awaitable[dict[str, BookieRecord]]]:
    """Reads every registration through a blocking client on a thread (never the loop)."""
    endpoints = [node.addresses[node.node_id] for node in nodes]

    def scan() -> dict[str, BookieRecord]:
        with KVClient(endpoints, timeout=5.0) as client:
            items = InternalKeys(client).scan_prefix(BOOKIE_PREFIX)
        decoded = {key: decode_bookie_record(value) for key, value in items}
        return {key: record for key, record in decoded.items() if record is not None}

    async def read() -> dict[str, BookieRecord]:
        return await asyncio.to_thread(scan)

    return read


def add(request_id: int, entry_id: int, key: bytes = KEY, recovery: bool = False) -> wire.Frame:
    return wire.AddEntries(
        request_id=request_id,
        ledger_id=LEDGER_ID,
        master_key=key,
        last_add_confirmed=entry_id - 1,
        entries=[wire.LedgerEntryData(entry_id, b"entry-%d" % entry_id)],
        recovery=recovery,
    )


def read(request_id: int, first: int, last: int) -> wire.Frame:
    return wire.ReadEntries(
        request_id=request_id, ledger_id=LEDGER_ID, first_entry_id=first, last_entry_id=last
    )


def status_of(answer: wire.Frame) -> wire.BookieStatus:
    assert isinstance(answer, wire.AddEntriesResult | wire.ReadEntriesResult), answer
    return answer.status


def test_nodes_register_their_bookies_and_a_node_without_one_refuses_the_protocol(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        settings = node_settings(
            ["n1", "n2", "n3"],
            tmp_path,
            tick_ms=10,
            election_ticks=5,
            fsync=False,
            bookie_heartbeat_ms=HEARTBEAT_MS,
        )
        settings[2] = msgspec.structs.replace(settings[2], bookie=False)
        nodes = await start_nodes(settings)
        stopped: list[Node] = []
        try:
            await check_registrations(nodes)
            await check_no_bookie_refuses(nodes[2])
            # A clean stop marks the bookie not writable at once (n1 and n3 keep a quorum).
            await nodes[1].stop()
            stopped.append(nodes[1])
            read_records = records_of([nodes[0], nodes[2]])

            async def n2_unwritable() -> bool:
                record = (await read_records()).get(bookie_key("n2"))
                return record is not None and not record.writable

            await eventually(n2_unwritable, "n2's registration to say it takes no writes")
        finally:
            for node in nodes:
                if node not in stopped:
                    await node.stop()

    asyncio.run(scenario())


async def check_registrations(nodes: list[Node]) -> None:
    read_records = records_of(nodes)
    hosting = nodes[:2]

    async def both_writable() -> dict[str, BookieRecord] | None:
        records = await read_records()
        now_ms = int(time.time() * 1000)
        live = [
            records.get(bookie_key(node.node_id)) for node in hosting if node.registrar is not None
        ]
        if len(live) < 2 or any(record is None for record in live):
            return None
        if not all(registration(record, now_ms).writable for record in live if record):
            return None
        # Several heartbeats each: n3 would have registered by now if it had a bookie.
        if min(node.registrar.heartbeats for node in hosting if node.registrar) < 3:
            return None
        return records

    records = await eventually(both_writable, "n1 and n2 to register writable bookies")
    for node in hosting:
        record = records[bookie_key(node.node_id)]
        assert record.address == node.addresses[node.node_id]
        assert record.bookie_id == node.node_id
    assert bookie_key("n3") not in records
    assert nodes[2].registrar is None and nodes[2].bookie is None
    assert not (Path(nodes[2].settings.data_dir) / "bookie").exists()


async def check_no_bookie_refuses(node: Node) -> None:
    client = await RawClient.connect(node.port)
    try:
        requests: list[wire.Frame] = [
            add(1, 0),
            read(2, 0, 0),
            wire.ReadLastAddConfirmed(
                request_id=3, ledger_id=LEDGER_ID, fence=True, master_key=KEY
            ),
            wire.DropLedger(request_id=4, ledger_id=LEDGER_ID),
        ]
        for request in requests:
            answer = await client.ask(request)
            assert isinstance(answer, wire.ErrorResponse), answer
            assert answer.code is wire.ErrorCode.UNKNOWN_GROUP
            assert "no-bookie" in answer.message
    finally:
        await client.close()


async def send_garbage(port: int) -> bool:
    """A frame that does not decode, after the handshake: True if the node hung up."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    client = RawClient(reader, writer)
    client.send(wire.Hello(cluster_id="quorumlog", sender="test", is_peer=False))
    assert isinstance(await client.receive(), wire.Welcome)
    payload = b"\xc1 not a frame"
    writer.write(FRAME_HEADER.pack(len(payload)) + payload)
    try:
        data = await asyncio.wait_for(reader.read(1 << 16), 10)
    except ConnectionError:
        data = b""
    writer.close()
    return data == b""


def test_bad_bookie_input_through_a_node_port_gets_typed_answers(tmp_path: Path) -> None:
    async def scenario() -> None:
        [settings] = node_settings(["n1"], tmp_path, tick_ms=5, election_ticks=2)
        [node] = await start_nodes([settings])
        try:
            client = await RawClient.connect(node.port)
            assert status_of(await client.ask(add(1, 0))) is wire.BookieStatus.OK
            wrong_key = await client.ask(add(2, 1, key=master_key(b"other")))
            assert status_of(wrong_key) is wire.BookieStatus.UNAUTHORIZED
            assert status_of(await client.ask(read(3, 5, 5))) is wire.BookieStatus.NO_SUCH_ENTRY
            beyond = await client.ask(read(4, 0, ID_MAX + 1))
            assert status_of(beyond) is wire.BookieStatus.BAD_REQUEST
            assert status_of(await client.ask(read(5, 3, 1))) is wire.BookieStatus.BAD_REQUEST
            fence = await client.ask(
                wire.ReadLastAddConfirmed(
                    request_id=6, ledger_id=LEDGER_ID, fence=True, master_key=KEY
                )
            )
            assert isinstance(fence, wire.LastAddConfirmedResult), fence
            assert status_of(await client.ask(add(7, 1))) is wire.BookieStatus.FENCED
            recovery = await client.ask(add(8, 1, recovery=True))
            assert status_of(recovery) is wire.BookieStatus.OK
            assert await send_garbage(node.port)
            # Nothing stored was lost, and the node serves the bookie and KV as before.
            entries = await client.ask(read(9, 0, 1))
            assert isinstance(entries, wire.ReadEntriesResult), entries
            assert [entry.data for entry in entries.entries] == [b"entry-0", b"entry-1"]
            endpoint = node.addresses["n1"]

            def put_and_get() -> str | None:
                with KVClient([endpoint], timeout=10.0) as kv:
                    kv.put("still", "serving")
                    return kv.get("still")

            assert await asyncio.to_thread(put_and_get) == "serving"
            await client.close()
        finally:
            await node.stop()

    asyncio.run(scenario())
