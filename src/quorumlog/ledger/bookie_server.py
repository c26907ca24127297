"""A bookie on asyncio: inside a node (which routes bookie frames to `handle`) or on its own
listener (`quorumlog bookie`, `BookieServer.listen`).

The `Bookie` (ledger/bookie.py) does no I/O of its own; here it gets the event loop's
`call_soon` (so every request of one loop turn shares one journal sync: the group commit)
and a one-thread executor for the fsync, off the loop. One thread is enough: syncs are
serial by design, and the next one covers everything that arrived meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from quorumlog.codec import wire
from quorumlog.ledger.bookie import Bookie, BookieRequest, BookieSettings
from quorumlog.ledger.bookie_storage import BookieStorage, BookieStorageSettings
from quorumlog.runtime.group import ExecutorBackground
from quorumlog.runtime.transport import Endpoint, Replier
from quorumlog.tls.config import NodeTLS

log = logging.getLogger("quorumlog.bookie")

BOOKIE_REQUEST_TYPES = (
    wire.AddEntries,
    wire.ReadEntries,
    wire.ReadLastAddConfirmed,
    wire.DropLedger,
)


class BookieServer:
    def __init__(
        self,
        bookie_id: str,
        directory: Path | str,
        loop: asyncio.AbstractEventLoop,
        *,
        settings: BookieSettings | None = None,
        storage_settings: BookieStorageSettings | None = None,
    ) -> None:
        """Open (replaying the journal) the storage in `directory`; a StorageError (the
        directory is locked, or written by a newer format) propagates to the caller."""
        self.bookie_id = bookie_id
        self.storage = BookieStorage.open(directory, settings=storage_settings)
        report = self.storage.recovery
        if report is not None:
            log.info("bookie %s opened %s: %s", bookie_id, directory, report)
        self.executor = ThreadPoolExecutor(1, thread_name_prefix=f"bookie-{bookie_id}-sync")
        self.bookie = Bookie(
            self.storage, ExecutorBackground(self.executor, loop), loop.call_soon, settings
        )
        self.endpoint: Endpoint | None = None

    @property
    def writable(self) -> bool:
        return self.bookie.writable

    @property
    def ledger_count(self) -> int:
        return len(self.storage.ledger_ids())

    def ledger_ids(self) -> list[int]:
        """The ledgers stored here, by id."""
        return self.storage.ledger_ids()

    @property
    def journal_bytes(self) -> int:
        return self.storage.bytes_on_disk

    def handle(self, request: BookieRequest, reply: Replier) -> None:
        self.bookie.handle(request, reply)

    async def listen(
        self,
        host: str,
        port: int,
        cluster_id: str,
        advertise: str = "",
        tls: NodeTLS | None = None,
    ) -> int:
        """Serve the bookie protocol on its own listener (TLS with `tls`, as a node's);
        returns the port bound."""
        self.endpoint = Endpoint(
            f"bookie-{self.bookie_id}", cluster_id, {}, _OnlyBookieFrames(self), tls=tls
        )
        return await self.endpoint.listen(host, port, advertise)

    async def close(self) -> None:
        if self.endpoint is not None:
            await self.endpoint.close()
        self.executor.shutdown(wait=True)
        self.bookie.close()


class _OnlyBookieFrames:
    """The transport handler of a bookie-only process: bookie requests and status."""

    def __init__(self, server: BookieServer) -> None:
        self.server = server

    def on_peer_batch(self, batch: wire.PeerBatch) -> None:
        """A bookie has no Raft peers; a peer batch here is a misdirected node."""

    def on_client_request(
        self, request: wire.ClientRequest, reply: Replier, peer_common_name: str = ""
    ) -> None:
        if isinstance(request, BOOKIE_REQUEST_TYPES):
            self.server.handle(request, reply)
            return
        request_id = getattr(request, "request_id", 0)
        reply(
            wire.ErrorResponse(
                request_id=request_id if isinstance(request_id, int) else 0,
                code=wire.ErrorCode.BAD_REQUEST,
                message=f"bookie {self.server.bookie_id} serves only the bookie protocol, "
                f"not {type(request).__name__}",
            )
        )

    def on_peer_address(self, peer: str, address: str) -> None:
        """Nothing to learn: a bookie dials no one."""
