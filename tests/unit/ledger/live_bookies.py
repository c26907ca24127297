"""Real bookies (BookieServer on port 0) and, when asked, a real one-node metadata group,
all on one event loop in a background thread, for tests of the blocking LedgerClient.

Bookies register themselves the way a bookie's heartbeat does (a `BookieRecord` under
`__bookies/`), once: tests are far shorter than BOOKIE_LIVENESS_SECONDS.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from quorumlog.kv.client import KVClient
from quorumlog.kv.internal_keys import InternalKeys
from quorumlog.ledger.bookie_server import BookieServer
from quorumlog.ledger.metadata import InMemoryMetadataStore
from quorumlog.ledger.registry import BookieRecord, bookie_key, encode_bookie_record
from quorumlog.node.server import Node, NodeSettings
from quorumlog.stream.client_common import ClientLoop

CLUSTER = "quorumlog"


class LiveBookies:
    def __init__(self, directory: Path, bookie_count: int = 5, *, metadata_node: bool) -> None:
        self.directory = directory
        self.loop_thread = ClientLoop("test-bookies")
        self.servers: dict[str, BookieServer] = {}
        self.addresses: dict[str, str] = {}
        self.node: Node | None = None
        self.endpoints: list[str] = []
        self.store = InMemoryMetadataStore()
        if metadata_node:
            self.node = self.loop_thread.run(self.start_node())
            self.endpoints = [f"127.0.0.1:{self.node.port}"]
        for number in range(bookie_count):
            self.start_bookie(f"b{number}")

    async def start_node(self) -> Node:
        node = Node(
            NodeSettings(
                node_id="n1",
                listen="127.0.0.1:0",
                data_dir=str(self.directory / "node"),
                tick_ms=5,
                election_ticks=2,
                fsync=False,
                bookie=False,  # the test registers its own bookies
            )
        )
        await node.start()
        return node

    def start_bookie(self, bookie_id: str) -> None:
        async def start() -> str:
            loop = asyncio.get_running_loop()
            server = BookieServer(bookie_id, self.directory / bookie_id, loop)
            port = await server.listen("127.0.0.1", 0, CLUSTER)
            self.servers[bookie_id] = server
            return f"127.0.0.1:{port}"

        address = self.loop_thread.run(start())
        self.addresses[bookie_id] = address
        self.store.register_bookie(bookie_id, address)
        if self.endpoints:
            with KVClient(self.endpoints, timeout=10) as kv:
                self.register(kv, bookie_id, address)

    @staticmethod
    def register(kv: KVClient, bookie_id: str, address: str, writable: bool = True) -> None:
        record = BookieRecord(
            bookie_id=bookie_id,
            address=address,
            writable=writable,
            heartbeat_ms=int(time.time() * 1000),
        )
        InternalKeys(kv).put(bookie_key(bookie_id), encode_bookie_record(record))

    def stop_bookie(self, bookie_id: str) -> None:
        """Close the bookie's listener and connections (its files stay)."""
        server = self.servers.pop(bookie_id)
        self.loop_thread.run(server.close())

    def stored_entry_ids(self, bookie_id: str, ledger_id: int) -> list[int]:
        """The entry ids a bookie holds for a ledger, read from its storage on its loop."""

        async def read() -> list[int]:
            storage = self.servers[bookie_id].storage
            entries = storage.read_entries(ledger_id, 0, 1 << 62, 1 << 40, 1 << 40)
            return [entry.entry_id for entry in entries]

        return self.loop_thread.run(read())

    def close(self) -> None:
        for bookie_id in list(self.servers):
            self.stop_bookie(bookie_id)
        if self.node is not None:
            self.loop_thread.run(self.node.stop())
        self.loop_thread.stop()
