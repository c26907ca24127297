"""A bookie on its own asyncio listener: adds are answered after the journal sync, bad
input is refused with a typed answer or a closed connection, and the bookie keeps serving."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest

from quorumlog.codec import wire
from quorumlog.codec.frame import FRAME_HEADER
from quorumlog.errors import DirectoryInUseError
from quorumlog.kv.client import BlockingConnection, ConnectionLost
from quorumlog.ledger.bookie_server import BookieServer
from quorumlog.ledger.metadata import master_key

CLUSTER = "quorumlog"
KEY = master_key(b"pw")


def add(request_id: int, entry_id: int, key: bytes = KEY) -> wire.AddEntries:
    entries = [wire.LedgerEntryData(entry_id, b"data-%d" % entry_id)]
    return wire.AddEntries(
        request_id=request_id,
        ledger_id=7,
        master_key=key,
        last_add_confirmed=entry_id - 1,
        entries=entries,
        length=-1,
    )


def call(port: int, frame: wire.ClientRequest) -> wire.Frame:
    deadline = time.monotonic() + 10
    connection = BlockingConnection.open(f"127.0.0.1:{port}", CLUSTER, "test", deadline)
    try:
        connection.send(frame)
        return connection.receive(frame.request_id, deadline)
    finally:
        connection.close()


def garbage(port: int) -> bool:
    """Send bytes that are no frame after the handshake; True if the bookie hung up."""
    deadline = time.monotonic() + 10
    connection = BlockingConnection.open(f"127.0.0.1:{port}", CLUSTER, "test", deadline)
    try:
        payload = b"\xc1not msgpack"
        connection.sock.sendall(FRAME_HEADER.pack(len(payload)) + payload)
        try:
            connection.receive_frame(deadline)
        except (ConnectionLost, OSError):
            return True
        return False
    finally:
        connection.close()


async def serve_and(tmp_path: Path, work: object) -> None:
    loop = asyncio.get_running_loop()
    server = BookieServer("b1", tmp_path / "bookie", loop)
    port = await server.listen("127.0.0.1", 0, CLUSTER)
    try:
        await asyncio.to_thread(work, port)  # type: ignore[arg-type]
    finally:
        await server.close()


def test_bookie_serves_adds_reads_and_refusals_over_tcp(tmp_path: Path) -> None:
    def work(port: int) -> None:
        first = call(port, add(1, 0))
        assert isinstance(first, wire.AddEntriesResult)
        assert (first.status, first.entry_ids) == (wire.BookieStatus.OK, [0])
        wrong_key = call(port, add(2, 1, key=master_key(b"other")))
        assert isinstance(wrong_key, wire.AddEntriesResult)
        assert wrong_key.status is wire.BookieStatus.UNAUTHORIZED
        assert garbage(port)
        not_ours = call(port, wire.KVRead(request_id=3, keys=["a"]))
        assert isinstance(not_ours, wire.ErrorResponse)
        assert not_ours.code is wire.ErrorCode.BAD_REQUEST
        read = call(
            port, wire.ReadEntries(request_id=4, ledger_id=7, first_entry_id=0, last_entry_id=0)
        )
        assert isinstance(read, wire.ReadEntriesResult)
        assert [entry.data for entry in read.entries] == [b"data-0"]

    asyncio.run(serve_and(tmp_path, work))


def test_a_restarted_bookie_replays_its_journal(tmp_path: Path) -> None:
    asyncio.run(serve_and(tmp_path, lambda port: call(port, add(1, 0))))

    def read_back(port: int) -> None:
        read = call(
            port, wire.ReadEntries(request_id=9, ledger_id=7, first_entry_id=0, last_entry_id=0)
        )
        assert isinstance(read, wire.ReadEntriesResult)
        assert [entry.data for entry in read.entries] == [b"data-0"]

    asyncio.run(serve_and(tmp_path, read_back))


def test_a_second_bookie_on_a_locked_directory_is_refused(tmp_path: Path) -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        server = BookieServer("b1", tmp_path / "bookie", loop)
        try:
            with pytest.raises(DirectoryInUseError):
                BookieServer("b2", tmp_path / "bookie", loop)
        finally:
            await server.close()

    asyncio.run(run())


def test_socket_closed_mid_frame_leaves_the_bookie_serving(tmp_path: Path) -> None:
    def work(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(FRAME_HEADER.pack(1000) + b"partial")
        answer = call(port, add(1, 0))
        assert isinstance(answer, wire.AddEntriesResult)
        assert answer.status is wire.BookieStatus.OK

    asyncio.run(serve_and(tmp_path, work))
