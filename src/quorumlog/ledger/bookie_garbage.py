"""A bookie's garbage collector: drop the local ledgers whose metadata is gone.

Deleting a ledger removes its metadata, then asks each bookie of its ensembles to drop it;
a bookie that was down or unreachable then keeps the entries for ever, since nobody asks
again. So, as BookKeeper's ScanAndCompareGarbageCollector does, every bookie looks for
itself every `interval_seconds`: it lists the ledgers it stores, compares them with the
ledgers the metadata store knows, and drops those whose metadata was deleted.

Why a missing metadata key means "deleted", and what keeps a scan from dropping a ledger
being created (`ledgers_to_collect`, in this order):

1. The local list is taken first. A writer writes entries only after the ledger's metadata
   was created, so every ledger in that list had metadata before the scan began.
2. The allocated-id watermark (`__ledgers/next-id`) is read next. Only ids below it are
   candidates: a higher id was handed out after the scan began, and its metadata may be
   about to be created.
3. The metadata listing: an id below the watermark and absent from it is a candidate.
4. "Verify metadata": each candidate's key is read again, on its own, linearizably; only a
   ledger still absent is collected. Ids are never reused, so a ledger whose metadata
   existed before (1) and is absent at (4) was deleted and stays deleted.

The metadata reads block, so they run on the collector's own daemon thread; the drop
itself goes through the bookie like any DropLedger request (journaled, then answered).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

import msgspec

from quorumlog.auth.credentials import CredentialsSource
from quorumlog.codec import wire
from quorumlog.errors import QuorumLogError
from quorumlog.kv.client import KVClient
from quorumlog.ledger.bookie import BookieRequest
from quorumlog.ledger.bookie_registration import DaemonWorker
from quorumlog.ledger.metadata_client import KeptMetadataClient
from quorumlog.ledger.metadata_kv import KVMetadataStore
from quorumlog.runtime.transport import Replier
from quorumlog.tls.config import TLSConfig

log = logging.getLogger("quorumlog.bookie")

GARBAGE_INTERVAL_SECONDS_DEFAULT = 300.0
"""BookKeeper's gcWaitTime is 15 minutes; ours is shorter since a scan is one listing."""
GARBAGE_REQUEST_ID = 0
"""The request id of the collector's own DropLedger requests (answered locally)."""


class LedgerMetadataView(Protocol):
    """The reads a scan needs (KVMetadataStore has them all); each one linearizable."""

    def allocated_id_watermark(self) -> int: ...

    def list_ledgers(self) -> list[int]: ...

    def ledger_exists(self, ledger_id: int) -> bool: ...


def ledgers_to_collect(local_ids: Sequence[int], metadata: LedgerMetadataView) -> list[int]:
    """The local ledgers (listed before this call) whose metadata was deleted: the steps of
    the module docstring, in order."""
    watermark = metadata.allocated_id_watermark()
    listed = set(metadata.list_ledgers())
    candidates = [ledger_id for ledger_id in local_ids if ledger_id < watermark]
    candidates = [ledger_id for ledger_id in candidates if ledger_id not in listed]
    return [ledger_id for ledger_id in candidates if not metadata.ledger_exists(ledger_id)]


class GarbageSettings(msgspec.Struct, frozen=True):
    interval_seconds: float = GARBAGE_INTERVAL_SECONDS_DEFAULT
    """Time between the end of one scan and the start of the next."""
    timeout_seconds: float = 10.0
    """How long one metadata call of a scan may take."""

    def validate(self) -> None:
        if not self.interval_seconds > 0 or not self.timeout_seconds > 0:
            raise ValueError("interval_seconds and timeout_seconds must be > 0")


class CollectedBookie(Protocol):
    """What the collector needs of a bookie (`BookieServer` has it)."""

    @property
    def bookie_id(self) -> str: ...

    def ledger_ids(self) -> list[int]: ...

    def handle(self, request: BookieRequest, reply: Replier) -> None: ...


class BookieGarbageCollector:
    """Scans every `interval_seconds` until stopped (see the module docs)."""

    def __init__(
        self,
        bookie: CollectedBookie,
        endpoints: Callable[[], list[str]],
        cluster_id: str,
        settings: GarbageSettings | None = None,
        credentials: CredentialsSource | None = None,
        tls: TLSConfig | None = None,
        on_collected: Callable[[int], None] | None = None,
    ) -> None:
        """`on_collected`: told how many ledgers each scan that found some dropped."""
        self.bookie = bookie
        self.on_collected = on_collected
        self.endpoints = endpoints
        """The metadata group's client addresses (read at every scan: they change)."""
        self.cluster_id = cluster_id
        self.settings = settings or GarbageSettings()
        self.settings.validate()
        self.credentials = credentials
        self.tls = tls
        self.worker = DaemonWorker(f"bookie-{bookie.bookie_id}-garbage")
        self.metadata = KeptMetadataClient(
            cluster_id, self.settings.timeout_seconds, credentials, tls
        )
        """Used only on the worker's thread."""
        self.task: asyncio.Task[None] | None = None
        self.scans = 0
        """Scans that finished (for tests and status)."""
        self.collected = 0
        """Ledgers dropped by this collector, in all."""

    def start(self) -> None:
        self.worker.start()
        self.task = asyncio.get_running_loop().create_task(self.run())

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.interval_seconds)
            await self.scan()

    async def scan(self) -> list[int]:
        """One scan: the ledgers it dropped (none when the metadata did not answer)."""
        local_ids = self.bookie.ledger_ids()
        job = functools.partial(self.find_garbage, local_ids, self.endpoints())
        try:
            garbage = await asyncio.wrap_future(self.worker.submit(job))
        except (QuorumLogError, OSError) as error:
            log.info("bookie %s: garbage scan failed, next time: %s", self.bookie.bookie_id, error)
            return []
        for ledger_id in garbage:
            self.bookie.handle(wire.DropLedger(GARBAGE_REQUEST_ID, ledger_id), self.dropped)
        self.scans += 1
        self.collected += len(garbage)
        if garbage and self.on_collected is not None:
            self.on_collected(len(garbage))
        if garbage:
            log.info("bookie %s collected deleted ledgers %s", self.bookie.bookie_id, garbage)
        return garbage

    def dropped(self, answer: object) -> None:
        if not isinstance(answer, wire.Done):
            log.info("bookie %s: dropping a collected ledger: %s", self.bookie.bookie_id, answer)

    def find_garbage(self, local_ids: list[int], endpoints: list[str]) -> list[int]:
        """On the worker's thread."""
        return ledgers_to_collect(local_ids, KVMetadataStore(self.metadata_kv(endpoints)))

    def metadata_kv(self, endpoints: list[str]) -> KVClient:
        return self.metadata.client_for(endpoints)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None
        self.worker.submit(self.metadata.close)
        self.worker.stop()
