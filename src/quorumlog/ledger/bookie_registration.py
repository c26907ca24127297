"""A bookie's registration in the metadata group: `__bookies/<id>` kept fresh by heartbeats.

Every `heartbeat_seconds` the registrar writes the bookie's `BookieRecord` (registry.py):
its address, whether it takes writes, how many ledgers it holds, its journal bytes and the
wall clock now. Writers offer a bookie only while that record is younger than
`BOOKIE_LIVENESS_SECONDS` (BookKeeper's ephemeral znode, which vanishes with its session;
ours ages out instead).

The KV client is blocking, so each write runs on the registrar's own thread, never on the
event loop; the record itself is read on the loop, where the bookie's state lives. The
thread is a daemon: a write stuck on a lost quorum never holds up the process's exit. A
failed write (no leader yet, the metadata group unreachable) is logged — once, then at
most once per `failure_log_interval_seconds` — and tried again at the next period: the
bookie keeps serving whatever happens here.

A clean stop first marks the record `writable=false` — one write, waited for at most
`stop_write_seconds`, made while the node still runs, so it commits at once whenever the
metadata group has a quorum — and writers stop choosing the bookie at once instead of
after the liveness window. If that write fails (the whole cluster is stopping, say), the
record simply ages out.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

import msgspec

from quorumlog.auth.credentials import CredentialsSource
from quorumlog.errors import QuorumLogError
from quorumlog.kv.internal_keys import InternalKeys
from quorumlog.ledger.metadata_client import KeptMetadataClient
from quorumlog.ledger.registry import (
    BOOKIE_HEARTBEAT_SECONDS,
    BOOKIE_LIVENESS_SECONDS,
    BookieRecord,
    bookie_key,
    encode_bookie_record,
)
from quorumlog.tls.config import TLSConfig

log = logging.getLogger("quorumlog.bookie")


class BookieStatusSource(Protocol):
    """What a registration reports about a bookie (`BookieServer` is one)."""

    @property
    def bookie_id(self) -> str: ...

    @property
    def writable(self) -> bool: ...

    @property
    def ledger_count(self) -> int: ...

    @property
    def journal_bytes(self) -> int: ...


class RegistrationSettings(msgspec.Struct, frozen=True):
    heartbeat_seconds: float = BOOKIE_HEARTBEAT_SECONDS
    write_timeout_seconds: float = BOOKIE_LIVENESS_SECONDS / 2
    """How long one heartbeat write may take; a write that cannot finish before the record
    would age out anyway is not worth waiting for."""
    stop_write_seconds: float = 1.0
    """How long a clean stop waits to mark the record not writable (only a lost quorum
    makes it wait that long)."""
    failure_log_interval_seconds: float = 30.0

    def validate(self) -> None:
        """Raise ValueError naming the first setting out of range."""
        for name in (
            "heartbeat_seconds",
            "write_timeout_seconds",
            "stop_write_seconds",
            "failure_log_interval_seconds",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")


class BookieRegistrar:
    """Writes a bookie's registration every heartbeat until stopped (see the module docs)."""

    def __init__(
        self,
        bookie: BookieStatusSource,
        address: Callable[[], str],
        endpoints: Callable[[], list[str]],
        cluster_id: str,
        settings: RegistrationSettings | None = None,
        clock: Callable[[], float] = time.time,
        credentials: CredentialsSource | None = None,
        tls: TLSConfig | None = None,
    ) -> None:
        self.bookie = bookie
        self.tls = tls
        self.address = address
        """Where clients reach the bookie, as "host:port" (read at every heartbeat)."""
        self.endpoints = endpoints
        """The metadata group's client addresses (read at every heartbeat: they change)."""
        self.cluster_id = cluster_id
        self.credentials = credentials
        """The node's own identity when auth is on (`auth.credentials.node_credentials`)."""
        self.settings = settings or RegistrationSettings()
        self.settings.validate()
        self.clock = clock
        """Wall clock seconds: heartbeats carry wall time, which readers compare with theirs."""
        self.worker = DaemonWorker(f"bookie-{bookie.bookie_id}-registration")
        self.metadata = KeptMetadataClient(
            cluster_id, self.settings.write_timeout_seconds, credentials, tls
        )
        """Used only on the registrar's thread."""
        self.task: asyncio.Task[None] | None = None
        self.heartbeats = 0
        """Writes that succeeded (for tests and status)."""
        self.failures = 0
        """Writes that failed, in all."""
        self.failures_unlogged = 0
        self.failure_logged_at = -float("inf")
        self.failing = False

    def record(self, writable: bool | None = None) -> BookieRecord:
        bookie = self.bookie
        return BookieRecord(
            bookie_id=bookie.bookie_id,
            address=self.address(),
            writable=bookie.writable if writable is None else writable,
            heartbeat_ms=int(self.clock() * 1000),
            ledgers=bookie.ledger_count,
            journal_bytes=bookie.journal_bytes,
        )

    def start(self) -> None:
        self.worker.start()
        self.task = asyncio.get_running_loop().create_task(self.run())

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await self.heartbeat()
            elapsed = loop.time() - started
            await asyncio.sleep(max(0.0, self.settings.heartbeat_seconds - elapsed))

    async def heartbeat(self) -> None:
        record = self.record()
        endpoints = self.endpoints()
        try:
            await asyncio.wrap_future(
                self.worker.submit(functools.partial(self.write, record, endpoints))
            )
        except (QuorumLogError, OSError) as error:
            self.failed(error)
            return
        self.heartbeats += 1
        if self.failing:
            self.failing = False
            log.info("bookie %s registered again", record.bookie_id)

    def failed(self, error: BaseException) -> None:
        """Log the first failure of a run of them, then at most one line per interval."""
        self.failing = True
        self.failures += 1
        self.failures_unlogged += 1
        now = time.monotonic()
        if now - self.failure_logged_at < self.settings.failure_log_interval_seconds:
            return
        log.warning(
            "bookie %s could not register (%d failed heartbeats; retrying every %ss): %s",
            self.bookie.bookie_id,
            self.failures_unlogged,
            self.settings.heartbeat_seconds,
            error,
        )
        self.failures_unlogged = 0
        self.failure_logged_at = now

    def write(self, record: BookieRecord, endpoints: list[str]) -> None:
        """On the registrar's thread: put the record, with a client for `endpoints`."""
        client = self.metadata.client_for(endpoints)
        InternalKeys(client).put(bookie_key(record.bookie_id), encode_bookie_record(record))

    def write_final(self, record: BookieRecord, endpoints: list[str]) -> None:
        """On the registrar's thread: the stop's one write, with its own short timeout."""
        self.metadata.close()
        with self.metadata.new_client(endpoints, self.settings.stop_write_seconds) as client:
            InternalKeys(client).put(bookie_key(record.bookie_id), encode_bookie_record(record))

    async def stop(self, mark_unwritable: bool = True) -> None:
        """Stop heartbeating; with `mark_unwritable`, first say so in the record (waited
        for at most `stop_write_seconds`; see the module docs)."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None
        if mark_unwritable:
            # Queued behind a heartbeat that may still run on the thread: the last word.
            last = self.worker.submit(
                functools.partial(self.write_final, self.record(writable=False), self.endpoints())
            )
            try:
                await asyncio.wait_for(asyncio.wrap_future(last), self.settings.stop_write_seconds)
            except (QuorumLogError, OSError, TimeoutError) as error:
                log.info(
                    "bookie %s left its registration to age out (%s)",
                    self.bookie.bookie_id,
                    str(error) or type(error).__name__,
                )
            else:
                log.info("bookie %s is registered as taking no writes", self.bookie.bookie_id)
        self.worker.submit(self.metadata.close)
        self.worker.stop()


Result = TypeVar("Result")


class DaemonWorker:
    """One daemon thread that runs the calls submitted to it, in order. (The threads of a
    ThreadPoolExecutor are joined at exit: one blocked on a lost quorum would hold up the
    process's exit for its whole timeout.)"""

    def __init__(self, name: str) -> None:
        self.calls: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self.thread = threading.Thread(target=self.run, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def submit(self, call: Callable[[], Result]) -> Future[Result]:
        future: Future[Result] = Future()
        self.calls.put((future, call))
        return future

    def stop(self) -> None:
        """The thread ends once the calls submitted before this have run."""
        self.calls.put(None)

    def run(self) -> None:
        while (item := self.calls.get()) is not None:
            future, call = item
            if not future.set_running_or_notify_cancel():
                continue  # its waiter gave up before it started
            try:
                future.set_result(call())
            except BaseException as error:  # handed to the waiter, which decides
                future.set_exception(error)
