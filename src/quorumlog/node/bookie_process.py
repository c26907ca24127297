"""A bookie-only process (`quorumlog bookie`): a bookie on its own listener, registered in a
cluster's metadata group, as BookKeeper deployments scale bookies apart from metadata.

It hosts no Raft group: it serves the bookie protocol on `listen` and heartbeats its
registration to the nodes named in `metadata`. Fail-stop as a node: an unexpected
exception reaching the loop stops it cleanly and `run_bookie` raises NodeFailedError.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import msgspec

from quorumlog.ledger.bookie_garbage import (
    GARBAGE_INTERVAL_SECONDS_DEFAULT,
    BookieGarbageCollector,
    GarbageSettings,
)
from quorumlog.ledger.bookie_registration import BookieRegistrar, RegistrationSettings
from quorumlog.ledger.bookie_server import BookieServer
from quorumlog.ledger.registry import BOOKIE_HEARTBEAT_SECONDS
from quorumlog.node.addresses import check_advertised
from quorumlog.node.server import NodeFailedError, stop_on_fatal_errors
from quorumlog.runtime.transport import format_address, parse_address
from quorumlog.tls.config import NodeTLS

log = logging.getLogger("quorumlog.bookie")


class BookieProcessSettings(msgspec.Struct, frozen=True):
    bookie_id: str
    listen: str
    """HOST:PORT to serve the bookie protocol on (port 0: any free port)."""
    data_dir: str
    metadata: list[str]
    """Client addresses of the metadata group's nodes ("host:port")."""
    cluster_id: str = "quorumlog"
    advertise: str = ""
    """HOST:PORT clients should use to reach this bookie, when not the listen address."""
    heartbeat_ms: int = int(BOOKIE_HEARTBEAT_SECONDS * 1000)
    tls: NodeTLS = NodeTLS()
    """TLS of the bookie's listener (clients reach it as they reach a node) and of its
    registration writes to the metadata nodes (as the node's dialing side)."""
    garbage_interval_ms: int = int(GARBAGE_INTERVAL_SECONDS_DEFAULT * 1000)
    """How often the bookie drops the ledgers whose metadata was deleted
    (ledger/bookie_garbage.py)."""


class BookieProcess:
    """The bookie and its registrar, started and stopped together."""

    def __init__(self, settings: BookieProcessSettings) -> None:
        self.settings = settings
        self.server: BookieServer | None = None
        self.registrar: BookieRegistrar | None = None
        self.garbage: BookieGarbageCollector | None = None
        self.port = 0
        self.address = ""

    async def start(self) -> int:
        """Open the storage (a StorageError or OSError propagates), listen and register;
        returns the port bound."""
        settings = self.settings
        check_advertised(settings.listen, settings.advertise)
        host, port = parse_address(settings.listen)
        self.server = BookieServer(
            settings.bookie_id, settings.data_dir, asyncio.get_running_loop()
        )
        self.port = await self.server.listen(
            host, port, settings.cluster_id, settings.advertise, tls=settings.tls
        )
        self.address = settings.advertise or format_address(host, self.port)
        metadata = list(settings.metadata)
        self.registrar = BookieRegistrar(
            self.server,
            lambda: self.address,
            lambda: metadata,
            settings.cluster_id,
            RegistrationSettings(heartbeat_seconds=settings.heartbeat_ms / 1000),
            tls=settings.tls.dialing_tls(),
        )
        self.registrar.start()
        self.garbage = BookieGarbageCollector(
            self.server,
            lambda: metadata,
            settings.cluster_id,
            GarbageSettings(interval_seconds=settings.garbage_interval_ms / 1000),
            tls=settings.tls.dialing_tls(),
        )
        self.garbage.start()
        log.info(
            "bookie %s listening on %s (data in %s, metadata at %s)",
            settings.bookie_id,
            self.address,
            settings.data_dir,
            ",".join(metadata),
        )
        return self.port

    async def stop(self) -> None:
        if self.registrar is not None:
            await self.registrar.stop()
        if self.garbage is not None:
            await self.garbage.stop()
        if self.server is not None:
            await self.server.close()


async def run_bookie(
    settings: BookieProcessSettings,
    stop: asyncio.Event,
    started: Callable[[BookieProcess], None] | None = None,
) -> None:
    """Run a bookie until `stop` is set. Raises NodeFailedError, after stopping cleanly, if
    an unexpected exception reached the event loop."""
    failures = stop_on_fatal_errors(f"bookie {settings.bookie_id}", stop)
    process = BookieProcess(settings)
    try:
        await process.start()
    except BaseException:
        await process.stop()
        raise
    if started is not None:
        started(process)
    try:
        await stop.wait()
    finally:
        await process.stop()
    if failures:
        raise NodeFailedError(failures[0])
