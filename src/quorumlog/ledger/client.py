"""`LedgerClient`: BookKeeper-style ledgers for users (issue 11, "The client protocol").

    with LedgerClient(["127.0.0.1:2379"]) as client:
        with client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2) as ledger:
            ledger.append(b"first")
        entries = client.open_ledger(ledger.ledger_id).read(0, 0)

The client drives the protocol itself; bookies never talk to each other. Underneath:

- one asyncio event loop (uvloop where installed) in a daemon thread runs the
  `LedgerDriver` (ledger/driver.py) — the same driver the simulator runs — over
  `AsyncioBookieLinks` (ledger/links.py);
- metadata calls (the `MetadataStore`: `KVMetadataStore` on the metadata group unless one is
  passed in) run on one metadata thread, never on the loop. The driver's calls carry a
  timeout: one that did not answer in time is reported `MetadataUnavailable` (its outcome
  unknown, which the protocol cores allow for).

Appends from user threads do not wake the loop once per entry: they queue, the first of a
burst schedules one drain, and the drain hands the whole burst to the writer in a few
`append_many` calls (so a burst leaves as one AddEntries per bookie). Acknowledgements
resolve every future up to the new LAC in one pass, in entry order.

A future per entry is the largest cost left on that path (creating and resolving one
takes about 5 us of CPython's time, more than the rest of the client's work on an entry):
`append_many_async` queues a whole batch under one future, which is how a producer with
many entries at hand reaches the bookies' rate (`quorumlog bench ledger` shows both).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import random as random_module
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from types import TracebackType
from typing import TypeVar, cast

import msgspec

from quorumlog.errors import (
    EntryTooLargeError,
    LedgerClosedError,
    LedgerError,
    LedgerPendingFullError,
    QuorumLogError,
    UnavailableError,
    UnknownOutcomeError,
)
from quorumlog.kv.client import KVClient
from quorumlog.kv.connection import CLUSTER_ID_DEFAULT, new_client_id
from quorumlog.ledger.driver import DriverWriter, LedgerDriver
from quorumlog.ledger.links import AsyncioBookieLinks
from quorumlog.ledger.metadata import (
    LedgerMetadata,
    LedgerState,
    MetadataStore,
    check_password,
    new_ledger_metadata,
)
from quorumlog.ledger.metadata_kv import KVMetadataStore
from quorumlog.ledger.placement import choose_ensemble
from quorumlog.ledger.protocol_actions import (
    LedgerProtocolConfig,
    MetadataOperation,
    MetadataResult,
    MetadataUnavailable,
    run_metadata_operation,
)
from quorumlog.raft.invariants import require
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.group import AsyncioScheduler
from quorumlog.stream.client_common import ClientLoop
from quorumlog.tls.config import TLSConfig

log = logging.getLogger("quorumlog.ledger.client")

ResultType = TypeVar("ResultType")

ADDRESS_CACHE_SECONDS = 1.0
"""Bookie addresses are re-read from the registry when older than this (a bookie that
restarted elsewhere is found again at the next connection)."""
DROP_WAIT_SECONDS_MAX = 2.0
"""How long a delete waits for bookies to confirm they dropped the ledger (best effort:
the metadata is already gone, which is what makes a ledger deleted)."""

METADATA_ERRORS: tuple[type[Exception], ...] = (QuorumLogError, OSError)
"""What a metadata store call may raise when the store is down or unreachable."""


class LedgerEntry(msgspec.Struct, frozen=True):
    entry_id: int
    data: bytes


class LedgerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A ledger's metadata as users see it (`LedgerClient.ledger_metadata`)."""

    ledger_id: int
    version: int
    ensemble_size: int
    write_quorum_size: int
    ack_quorum_size: int
    state: str
    """"OPEN", "IN_RECOVERY" or "CLOSED"."""
    last_entry_id: int
    """The last entry of a CLOSED ledger (-1: none); -1 while it is not closed."""
    length: int
    """Data bytes of a CLOSED ledger; 0 while it is not closed."""
    ensembles: dict[int, list[str]]
    """First entry id of each fragment -> its bookies, in position order."""
    properties: dict[str, str] = {}

    @classmethod
    def from_metadata(cls, metadata: LedgerMetadata) -> LedgerInfo:
        closed = metadata.state is LedgerState.CLOSED
        return cls(
            ledger_id=metadata.ledger_id,
            version=metadata.version,
            ensemble_size=metadata.ensemble_size,
            write_quorum_size=metadata.write_quorum_size,
            ack_quorum_size=metadata.ack_quorum_size,
            state=metadata.state.name,
            last_entry_id=metadata.last_entry_id if closed else -1,
            length=metadata.length if closed else 0,
            ensembles={
                first: list(bookies) for first, bookies in sorted(metadata.ensembles.items())
            },
            properties=dict(metadata.properties),
        )


# --- metadata on a thread ------------------------------------------------------------------


class ThreadedMetadataAccess:
    """The driver's `MetadataAccess`: synchronous store calls on the metadata executor,
    each answered on the loop exactly once — its result, or `MetadataUnavailable` when the
    store raised a store error or did not answer within `timeout_seconds`."""

    def __init__(
        self,
        store: MetadataStore,
        loop: asyncio.AbstractEventLoop,
        executor: ThreadPoolExecutor,
        timeout_seconds: float,
    ) -> None:
        self.store = store
        self.loop = loop
        self.executor = executor
        self.timeout_seconds = timeout_seconds

    def submit(self, operation: MetadataOperation, done: Callable[[MetadataResult], None]) -> None:
        answered = False

        def answer(result: MetadataResult) -> None:
            nonlocal answered
            if not answered:
                answered = True
                timer.cancel()
                done(result)

        def job() -> None:
            try:
                result = run_metadata_operation(self.store, operation)
            except METADATA_ERRORS as error:
                log.info("metadata operation %s failed: %s", type(operation).__name__, error)
                result = MetadataUnavailable(operation.operation_id)
            call_on_loop(self.loop, answer, result)

        timer = self.loop.call_later(
            self.timeout_seconds, answer, MetadataUnavailable(operation.operation_id)
        )
        # Anything but a store error is a bug: logged with its traceback here, and the
        # timer still answers, so the core is never left waiting.
        self.executor.submit(job).add_done_callback(log_unexpected_error)


def call_on_loop(
    loop: asyncio.AbstractEventLoop, callback: Callable[[ResultType], None], value: ResultType
) -> None:
    """Schedule `callback(value)` on the loop, unless the loop already closed (the client
    closed while a call was out: nobody waits for its answer any more)."""
    try:
        loop.call_soon_threadsafe(callback, value)
    except RuntimeError:
        if not loop.is_closed():
            raise


def log_unexpected_error(future: Future[None]) -> None:
    error = future.exception()
    if error is not None:
        log.error("metadata call failed unexpectedly", exc_info=error)


class BookieDirectory:
    """Bookie id -> address, from the registry; re-read when an id is unknown or the
    cache is older than ADDRESS_CACHE_SECONDS. Called on the metadata thread."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.addresses: dict[str, str] = {}
        self.read_at = -float("inf")
        self.lock = threading.Lock()

    def resolve(self, bookie_id: str) -> str | None:
        with self.lock:
            stale = time.monotonic() - self.read_at > ADDRESS_CACHE_SECONDS
            if bookie_id not in self.addresses or stale:
                self.addresses = self.read_addresses()
                self.read_at = time.monotonic()
            return self.addresses.get(bookie_id)

    def read_addresses(self) -> dict[str, str]:
        if isinstance(self.store, KVMetadataStore):
            # Every registration, writable or not: a read-only bookie still serves reads.
            return {record.bookie_id: record.address for record in self.store.all_bookies()}
        return {bookie.bookie_id: bookie.address for bookie in self.store.writable_bookies()}


# --- the client ----------------------------------------------------------------------------


class LedgerClient:
    def __init__(
        self,
        endpoints: list[str],
        timeout: float = 10.0,
        *,
        cluster_id: str = CLUSTER_ID_DEFAULT,
        metadata_store: MetadataStore | None = None,
        config: LedgerProtocolConfig | None = None,
        random: random_module.Random | None = None,
        user: str | None = None,
        password: str | None = None,
        tls: TLSConfig | None = None,
    ) -> None:
        """`endpoints`: the nodes of the metadata group (unused when `metadata_store` is
        given); `timeout`: seconds any one call may take before it gives up; `user` and
        `password`: with auth on, who writes the ledger metadata (it needs readwrite on
        the `__ledgers/` prefix and read on `__bookies/`). The bookies themselves are not
        checked by user: a ledger's password (master key) guards its entries. `tls`: talk
        TLS to the metadata nodes and to the bookies (they serve clients on the same
        listeners as the nodes, under the same client settings)."""
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        self.timeout = timeout
        self.random = random or random_module.Random()
        self.kv: KVClient | None = None
        if metadata_store is None:
            self.kv = KVClient(
                endpoints,
                timeout=timeout,
                cluster_id=cluster_id,
                user=user,
                password=password,
                tls=tls,
            )
            metadata_store = KVMetadataStore(self.kv)
        self.store: MetadataStore = metadata_store
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="ledger-metadata")
        self.client_loop = ClientLoop("ledger-client")
        self.loop = self.client_loop.loop
        self.directory = BookieDirectory(metadata_store)
        self.links = AsyncioBookieLinks(
            self.loop,
            self.directory.resolve,
            self.executor,
            cluster_id=cluster_id,
            client_id=f"ledger-{new_client_id()}",
            tls=tls,
        )
        self.driver = LedgerDriver(
            AsyncioScheduler(self.loop),
            self.links,
            ThreadedMetadataAccess(metadata_store, self.loop, self.executor, timeout),
            config,
            random=random_module.Random(self.random.getrandbits(64)),
        )
        self.links.attach(self.driver)
        self.closed = False

    def __enter__(self) -> LedgerClient:
        return self

    def __exit__(
        self,
        exception_type: type[BaseException] | None,
        exception: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # --- ledgers -------------------------------------------------------------------------

    def create_ledger(
        self,
        ensemble: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        password: bytes = b"",
        *,
        properties: dict[str, str] | None = None,
    ) -> WriteHandle:
        """A new ledger on `ensemble` writable bookies, open for appends.
        NotEnoughBookiesError when fewer are registered and writable."""
        if not 1 <= ack_quorum <= write_quorum <= ensemble:
            raise ValueError("need 1 <= ack_quorum <= write_quorum <= ensemble")
        self.check_open()
        writable = self.metadata_call(self.store.writable_bookies)
        bookies = choose_ensemble([bookie.bookie_id for bookie in writable], ensemble, self.random)
        metadata = new_ledger_metadata(
            ensemble=bookies,
            write_quorum_size=write_quorum,
            ack_quorum_size=ack_quorum,
            password=password,
            properties=properties,
        )
        stored = self.metadata_call(self.store.create_ledger, metadata)
        return WriteHandle(self, stored, check_password(stored, password))

    def open_ledger(
        self, ledger_id: int, password: bytes = b"", recovery: bool = True
    ) -> ReadHandle:
        """Open a ledger to read. With `recovery` (the default) the ledger is fenced,
        recovered and closed first, so its writer can add nothing more and every reader
        sees the same end. Without, it opens read-only at the LAC the bookies report."""
        self.check_open()
        metadata = self.metadata_call(self.store.read_ledger, ledger_id)
        key = check_password(metadata, password)
        if metadata.state is LedgerState.CLOSED:
            return ReadHandle(self, metadata, metadata.last_entry_id)
        if recovery:
            closed = self.run_on_loop(lambda: self.driver.recover(metadata, key), "recovery")
            return ReadHandle(self, closed, closed.last_entry_id)
        reported = self.run_on_loop(
            lambda: self.driver.read_last_add_confirmed(metadata), "reading the LAC"
        )
        return ReadHandle(self, metadata, max(reported, metadata.known_last_add_confirmed))

    def delete_ledger(self, ledger_id: int) -> None:
        """Remove the ledger's metadata (LedgerNotFoundError if there is none), then ask
        each bookie that held it to drop its entries (best effort: a bookie that does not
        answer keeps them until it learns otherwise)."""
        self.check_open()
        metadata = self.metadata_call(self.store.read_ledger, ledger_id)
        self.metadata_call(self.store.delete_ledger, ledger_id)
        bookies = sorted(
            {bookie for ensemble in metadata.ensembles.values() for bookie in ensemble}
        )
        wait_seconds = min(self.timeout, DROP_WAIT_SECONDS_MAX)
        self.client_loop.run(self.drop_everywhere(bookies, ledger_id, wait_seconds))

    async def drop_everywhere(
        self, bookies: list[str], ledger_id: int, wait_seconds: float
    ) -> None:
        drops = [self.links.drop_ledger(bookie, ledger_id) for bookie in bookies]
        done, pending = await asyncio.wait(drops, timeout=wait_seconds)
        for future in pending:
            future.cancel()
        for future in done:
            if future.exception() is not None:
                log.info("ledger %d: a bookie did not drop it: %s", ledger_id, future.exception())

    def list_ledgers(self) -> list[int]:
        self.check_open()
        return self.metadata_call(self.store.list_ledgers)

    def ledger_metadata(self, ledger_id: int) -> LedgerInfo:
        self.check_open()
        return LedgerInfo.from_metadata(self.metadata_call(self.store.read_ledger, ledger_id))

    # --- plumbing ------------------------------------------------------------------------

    def metadata_call(self, function: Callable[..., ResultType], *arguments: object) -> ResultType:
        """Run a store call on the metadata thread (one at a time with the driver's)."""
        future = self.executor.submit(function, *arguments)
        try:
            return future.result(timeout=self.timeout)
        except FutureTimeoutError:
            raise UnavailableError(
                f"the metadata store did not answer in {self.timeout}s"
            ) from None

    def run_on_loop(self, start: Callable[[], Completion[ResultType]], what: str) -> ResultType:
        """Start a driver operation on the loop and wait for its outcome."""
        future: Future[ResultType] = Future()

        def begin() -> None:
            try:
                completion = start()
            except LedgerError as error:
                future.set_exception(error)
                return
            completion.add_done_callback(lambda done: settle_future(future, done))

        self.loop.call_soon_threadsafe(begin)
        return self.wait(future, what)

    def wait(self, future: Future[ResultType], what: str) -> ResultType:
        try:
            return future.result(timeout=self.timeout)
        except FutureTimeoutError:
            raise UnknownOutcomeError(f"{what} did not finish within {self.timeout}s") from None

    def check_open(self) -> None:
        if self.closed:
            raise LedgerError("the ledger client is closed")

    def close(self) -> None:
        """Stop every handle (pending appends fail), close connections and threads."""
        if self.closed:
            return
        self.closed = True
        finished: Future[None] = Future()

        def stop_driver() -> None:
            self.driver.close()
            self.links.close()
            finished.set_result(None)

        self.loop.call_soon_threadsafe(stop_driver)
        try:
            finished.result(timeout=self.timeout)
        finally:
            self.client_loop.stop()
            self.executor.shutdown(wait=False, cancel_futures=True)
            if self.kv is not None:
                self.kv.close()


def settle_future(future: Future[ResultType], completion: Completion[ResultType]) -> None:
    error = completion.exception()
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(completion.result())
    except InvalidStateError:
        pass  # the caller cancelled its future: nobody waits for this outcome


# --- handles -------------------------------------------------------------------------------


QueuedBatch = tuple[int, Future[int], int]
"""A batch waiting for the loop: (its entries still queued, its future, its entries handed
over already: a batch the writer had no room for all of is handed over in parts)."""
QueuedAppend = Future[int] | QueuedBatch
"""An append waiting for the loop: one entry's future, or a batch."""
Unacknowledged = Future[int] | tuple[int, Future[int]]
"""An append handed to the writer: one entry's future, or (entry count, future) of a batch
(its future completes with its first id)."""


class WriteHandle:
    """An open ledger this client writes (`LedgerClient.create_ledger`).

    Entry ids are contiguous from 0, assigned in the order appends are called; futures
    complete in entry order. After a failure (fenced by a recoverer: LedgerFencedError)
    every pending and later append fails with it; entries acknowledged before stay.

    `append_many_async` takes a batch with one future for all of it: a future per entry
    costs more than the rest of the client's work on an entry (its lock and condition),
    so a caller with many entries at hand should hand them over together."""

    def __init__(self, client: LedgerClient, metadata: LedgerMetadata, key: bytes) -> None:
        self.client = client
        self.ledger_id = metadata.ledger_id
        config = client.driver.config
        self.entry_bytes_max = config.entry_bytes_max
        self.chunk_entries_max = config.batch_entries_max
        self.chunk_bytes_max = config.batch_bytes_max
        self.queued_entries_max = config.pending_entries_max
        """Entries waiting for the loop before an append blocks (backpressure)."""
        self.lock = threading.Lock()
        self.space = threading.Condition(self.lock)
        # Shared with user threads (under `lock`):
        self.queued_datas: list[bytes] = []
        self.queued_appends: list[QueuedAppend] = []
        """Entries and their appends, in order: one entry per future, `count` per batch."""
        self.queued_batches = 0
        """Batches among `queued_appends` (none: the usual case takes a faster path)."""
        self.drain_scheduled = False
        self.failure: LedgerError | None = None
        self.closing = False
        # The loop thread's alone:
        self.unacknowledged: collections.deque[Unacknowledged] = collections.deque()
        """Every append handed to the writer and not acknowledged yet, in entry order."""
        self.unacknowledged_first_entry_id = 0
        """The first entry of unacknowledged[0] (each append's follow from it)."""
        self.unacknowledged_batches = 0
        self.next_entry_id = 0
        self.acknowledged_through = -1
        self.waiting_for_room = False
        self.close_future: Future[LedgerMetadata] = Future()
        self.close_started = False
        self.closed_metadata: LedgerMetadata | None = None
        self.writer: DriverWriter = client.run_on_loop(
            lambda: self.start(metadata, key), "starting the writer"
        )

    def start(self, metadata: LedgerMetadata, key: bytes) -> Completion[DriverWriter]:
        writer = self.client.driver.start_writer(metadata, key, self.acknowledged, self.failed)
        completion: Completion[DriverWriter] = Completion(self.client.driver.scheduler)
        completion.set_result(writer)
        return completion

    def __enter__(self) -> WriteHandle:
        return self

    def __exit__(
        self,
        exception_type: type[BaseException] | None,
        exception: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exception is None:
            self.close()
            return
        try:
            self.close()
        except (LedgerError, UnknownOutcomeError) as error:
            # The body's exception says what went wrong first; keep it, log this one.
            log.info("ledger %d: close after an error failed: %s", self.ledger_id, error)

    @property
    def last_add_confirmed(self) -> int:
        """The highest entry acknowledged (every entry up to it is; -1: none yet)."""
        return self.acknowledged_through

    # --- appends (any thread) ------------------------------------------------------------

    def append(self, data: bytes) -> int:
        """Append one entry and wait until Qa bookies acknowledged it; its id."""
        return self.client.wait(self.append_async(data), f"append to ledger {self.ledger_id}")

    def append_async(self, data: bytes) -> Future[int]:
        """Append one entry; the future completes with its id once acknowledged (futures
        complete in entry order), or with the error that failed the handle. Blocks only
        while `pending_entries_max` entries wait for the loop (backpressure)."""
        future: Future[int] = Future()
        if type(data) is not bytes:
            data = bytes(data)
        if len(data) > self.entry_bytes_max:
            future.set_exception(EntryTooLargeError(f"{len(data)} bytes > entry_bytes_max"))
            return future
        with self.lock:
            refusal = self.refusal()
            if refusal is None and len(self.queued_datas) >= self.queued_entries_max:
                refusal = self.wait_for_room(1)
            if refusal is not None:
                future.set_exception(refusal)
                return future
            self.queued_datas.append(data)
            self.queued_appends.append(future)
            wake = not self.drain_scheduled
            self.drain_scheduled = True
        if wake:
            self.client.loop.call_soon_threadsafe(self.drain)
        return future

    def append_many(self, datas: Sequence[bytes]) -> int:
        """Append entries in order and wait until Qa bookies acknowledged all of them;
        the first one's id (the rest follow it, contiguous)."""
        return self.client.wait(self.append_many_async(datas), f"append to ledger {self.ledger_id}")

    def append_many_async(self, datas: Sequence[bytes]) -> Future[int]:
        """Append entries in order (contiguous ids); one future for the whole batch, which
        completes with the first entry's id once every entry of the batch is acknowledged
        (or with the handle's failure: some of the batch may then be stored, as with
        separate appends). Blocks while the queue holds `pending_entries_max` entries."""
        if not datas:
            raise ValueError("append_many_async needs at least one entry")
        future: Future[int] = Future()
        batch = [data if type(data) is bytes else bytes(data) for data in datas]
        largest = max(map(len, batch))
        if largest > self.entry_bytes_max:
            future.set_exception(EntryTooLargeError(f"{largest} bytes > entry_bytes_max"))
            return future
        with self.lock:
            refusal = self.refusal()
            queued = len(self.queued_datas)
            if refusal is None and queued + len(batch) > self.queued_entries_max:
                refusal = self.wait_for_room(len(batch))
            if refusal is not None:
                future.set_exception(refusal)
                return future
            self.queued_datas.extend(batch)
            self.queued_appends.append((len(batch), future, 0))
            self.queued_batches += 1
            wake = not self.drain_scheduled
            self.drain_scheduled = True
        if wake:
            self.client.loop.call_soon_threadsafe(self.drain)
        return future

    def refusal(self) -> LedgerError | None:
        """Why an append is refused now (under `lock`)."""
        if self.failure is not None:
            return self.failure
        if self.closing:
            return LedgerClosedError(f"ledger {self.ledger_id} is closed")
        return None

    def wait_for_room(self, count: int) -> LedgerError | None:
        """Wait (under `lock`) until `count` more entries fit the queue; a batch larger
        than the whole queue waits until the queue is empty."""
        deadline = time.monotonic() + self.client.timeout
        while self.queued_datas and len(self.queued_datas) + count > self.queued_entries_max:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return LedgerPendingFullError(
                    f"ledger {self.ledger_id}: {len(self.queued_datas)} entries still wait to be "
                    f"sent after {self.client.timeout}s"
                )
            self.space.wait(remaining)
            refusal = self.refusal()
            if refusal is not None:
                return refusal
        return None

    def close(self) -> None:
        """Wait until every appended entry is acknowledged, then close the ledger (its
        metadata records the last entry). Raises the handle's failure if it failed
        (LedgerFencedError: a recoverer closed it instead)."""
        with self.lock:
            self.closing = True
            wake = not self.drain_scheduled
            self.drain_scheduled = True
        if wake:
            self.client.loop.call_soon_threadsafe(self.drain)
        self.closed_metadata = self.client.wait(
            self.close_future, f"closing ledger {self.ledger_id}"
        )

    # --- the loop's side -----------------------------------------------------------------

    def drain(self) -> None:
        """Hand queued entries to the writer, a chunk per `append_many`."""
        with self.lock:
            self.drain_scheduled = False
            datas, self.queued_datas = self.queued_datas, []
            appends, self.queued_appends = self.queued_appends, []
            batches, self.queued_batches = self.queued_batches, 0
            closing = self.closing
            self.space.notify_all()
        handed = 0
        try:
            while handed < len(datas):
                end = self.chunk_end(datas, handed)
                self.hand_over(datas[handed:end])
                handed = end
        except LedgerPendingFullError:
            # The writer holds all it may: keep the rest (first, in order) until acks
            # make room, then drain again.
            left = self.track(appends, batches, handed)
            with self.lock:
                self.queued_datas[:0] = datas[handed:]
                self.queued_appends[:0] = left
                self.queued_batches += sum(isinstance(append, tuple) for append in left)
                self.waiting_for_room = True
            return
        except LedgerError as error:
            for append in self.track(appends, batches, handed):
                set_future_exception(append[1] if isinstance(append, tuple) else append, error)
        else:
            self.track(appends, batches, handed)
        if closing and not self.close_started:
            self.start_close()

    def track(self, appends: list[QueuedAppend], batches: int, handed: int) -> list[QueuedAppend]:
        """Wait for the acks of the appends whose entries are among the first `handed` of
        this drain; returns the others (a batch cut at `handed` keeps what is left)."""
        if not batches:  # one entry per append: the usual case, in C
            self.unacknowledged.extend(cast("list[Future[int]]", appends[:handed]))
            return appends[handed:]
        add = self.unacknowledged.append
        consumed = 0
        for index, append in enumerate(appends):
            if consumed == handed:
                return appends[index:]
            if not isinstance(append, tuple):
                add(append)
                consumed += 1
                continue
            count, future, handed_before = append
            if consumed + count > handed:
                taken = handed - consumed
                return [(count - taken, future, handed_before + taken), *appends[index + 1 :]]
            add((handed_before + count, future))
            self.unacknowledged_batches += 1
            consumed += count
        return []

    def chunk_end(self, datas: list[bytes], start: int) -> int:
        """The end of a chunk from `start` within the batch bounds (one larger entry goes
        alone), so a chunk always fits a writer with nothing pending. Sizes are summed in
        C: this runs over every entry."""
        end = min(len(datas), start + self.chunk_entries_max)
        if sum(map(len, itertools.islice(datas, start, end))) <= self.chunk_bytes_max:
            return end
        sizes = itertools.accumulate(map(len, itertools.islice(datas, start, end)))
        fitting = sum(1 for _ in itertools.takewhile(self.chunk_bytes_max.__ge__, sizes))
        return start + max(fitting, 1)

    def hand_over(self, chunk: list[bytes]) -> None:
        first = self.writer.append_many(chunk)
        require(first == self.next_entry_id, "the writer assigns ids in append order")
        self.next_entry_id = first + len(chunk)

    def acknowledged(self, last_add_confirmed: int) -> None:
        """Entries up to `last_add_confirmed` are acknowledged: resolve the appends they
        complete, in order."""
        first = self.unacknowledged_first_entry_id
        if self.unacknowledged_batches:
            first = self.resolve_mixed(first, last_add_confirmed)
        else:
            # One entry per append: the usual case. Entries of a batch cut in parts may be
            # acknowledged before the batch is tracked, hence the bound.
            futures = cast("collections.deque[Future[int]]", self.unacknowledged)
            last = min(last_add_confirmed, first + len(futures) - 1)
            for entry_id in range(first, last + 1):
                set_future_result(futures.popleft(), entry_id)
            first = max(first, last + 1)
        self.unacknowledged_first_entry_id = first
        self.acknowledged_through = last_add_confirmed
        if self.waiting_for_room:
            self.waiting_for_room = False
            self.drain()

    def resolve_mixed(self, first: int, last_add_confirmed: int) -> int:
        """`acknowledged` with batches among the appends; returns the next first entry."""
        unacknowledged = self.unacknowledged
        while unacknowledged and first <= last_add_confirmed:
            head = unacknowledged[0]
            if isinstance(head, tuple):
                count, future = head
                if first + count - 1 > last_add_confirmed:
                    break
                unacknowledged.popleft()
                self.unacknowledged_batches -= 1
                set_future_result(future, first)
                first += count
            else:
                unacknowledged.popleft()
                set_future_result(head, first)
                first += 1
        return first

    def failed(self, error: LedgerError) -> None:
        with self.lock:
            if self.failure is None:
                self.failure = error
            appends, self.queued_appends = self.queued_appends, []
            self.queued_datas = []
            self.queued_batches = 0
            self.space.notify_all()
        unacknowledged, self.unacknowledged = self.unacknowledged, collections.deque()
        self.unacknowledged_batches = 0
        for waiting in [*unacknowledged, *appends]:
            set_future_exception(waiting[1] if isinstance(waiting, tuple) else waiting, error)
        if not self.close_started:
            set_future_exception(self.close_future, error)

    def start_close(self) -> None:
        self.close_started = True
        completion = self.writer.close()
        completion.add_done_callback(lambda done: settle_future(self.close_future, done))


def set_future_result(future: Future[int], value: int) -> None:
    # Runs once per entry: a try costs nothing until it catches, a context manager does.
    try:  # noqa: SIM105
        future.set_result(value)
    except InvalidStateError:
        pass  # cancelled by its caller


def set_future_exception(future: Future[ResultType], error: BaseException) -> None:
    with contextlib.suppress(InvalidStateError):  # cancelled by its caller, or settled
        future.set_exception(error)


class ReadHandle:
    """A ledger opened to read (`LedgerClient.open_ledger`), up to `last_add_confirmed`."""

    def __init__(
        self, client: LedgerClient, metadata: LedgerMetadata, last_add_confirmed: int
    ) -> None:
        self.client = client
        self.metadata = metadata
        self.ledger_id = metadata.ledger_id
        self.last_add_confirmed = last_add_confirmed

    def __enter__(self) -> ReadHandle:
        return self

    def __exit__(
        self,
        exception_type: type[BaseException] | None,
        exception: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release: a read handle holds no connection of its own."""

    def read(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries first..last (inclusive), failing over across each write set.
        LedgerEntryRangeError when the range is empty, negative or beyond the LAC."""
        entries = self.client.run_on_loop(
            lambda: self.client.driver.read(self.metadata, first, last, self.last_add_confirmed),
            f"reading ledger {self.ledger_id}",
        )
        return [LedgerEntry(entry.entry_id, entry.data) for entry in entries]
