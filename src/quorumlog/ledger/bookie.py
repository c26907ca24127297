"""A bookie's request handling (reference 001): validate, store, answer once durable.

`Bookie.handle(request, respond)` takes one request frame of the bookie protocol
(codec/wire.py) and calls `respond` exactly once with its result frame: at once for reads
and refusals, and for writes (adds, fences, drops) only after the journal sync that covers
them has completed. Nothing here reads a clock, opens a socket or starts a thread:

- The sync is a job handed to an injected `Background` (runtime/resources.py): a thread
  pool for real, seeded virtual time in the simulator, where a crash before it reports
  loses what it would have made durable and answers nothing.
- The sync is started from a callback given to `call_soon` (the event loop's, or the
  simulator scheduler's), so every request handled in the same turn of the loop shares
  it; and requests that arrive while one sync runs all share the next. That is the group
  commit: N adds, from any number of ledgers, one fsync.

What is refused, and how (BookieStatus):

- malformed (ids or a length out of range, entry ids not strictly increasing, first >
  last): BAD_REQUEST
- an entry, a request or a master key over its bound: TOO_LARGE
- a master key other than the ledger's: UNAUTHORIZED (checked before the fence, so a
  wrong key learns nothing)
- an add to a fenced ledger, unless it is a recovery add: FENCED
- the disk is full, or the storage stopped after a failed write or sync: READ_ONLY; the
  client writes elsewhere (adds waiting for a sync that failed get READ_ONLY too: they may
  or may not be on disk, and were never acknowledged)
- a read of a ledger this bookie does not know: NO_SUCH_LEDGER; of an entry it does not
  hold: NO_SUCH_ENTRY (an explicit not-found, which recovery counts)
- an entry that fails its checksum on the way back: ErrorResponse INTERNAL, which a
  client counts as "unknown", never as not-found

A frame that is no bookie request gets ErrorResponse BAD_REQUEST. Frames that do not even
decode never get here: the transport closes such a connection.
"""

from __future__ import annotations

import hmac
import operator
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

import msgspec

from quorumlog.codec.wire import (
    AddEntries,
    AddEntriesResult,
    BookieStatus,
    Done,
    DropLedger,
    ErrorCode,
    ErrorResponse,
    LastAddConfirmedResult,
    ReadEntries,
    ReadEntriesResult,
    ReadLastAddConfirmed,
)
from quorumlog.errors import DiskFullError, StorageError
from quorumlog.ledger.bookie_format import ID_MAX
from quorumlog.ledger.bookie_storage import BookieStorage, SyncJob
from quorumlog.runtime.resources import Background

BookieRequest = AddEntries | ReadEntries | ReadLastAddConfirmed | DropLedger
BookieResponse = (
    AddEntriesResult | ReadEntriesResult | LastAddConfirmedResult | Done | ErrorResponse
)
Respond = Callable[[BookieResponse], None]
CallSoon = Callable[[Callable[[], None]], object]


class BookieSettings(msgspec.Struct, frozen=True):
    entry_bytes_max: int = 8 * 1024 * 1024
    request_bytes_max: int = 32 * 1024 * 1024
    """Data bytes of all entries of one AddEntries."""
    entries_per_request_max: int = 100_000
    master_key_bytes_max: int = 64
    read_bytes_max: int = 8 * 1024 * 1024
    """A ReadEntries answer holds at most this many data bytes (less if it asks less),
    but always its first entry."""
    read_entries_max: int = 10_000

    def validate(self) -> None:
        """Raise ValueError naming the first setting out of range."""
        for name in (
            "entry_bytes_max",
            "request_bytes_max",
            "entries_per_request_max",
            "read_bytes_max",
            "read_entries_max",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if not 0 <= self.master_key_bytes_max <= 0xFFFF:
            raise ValueError("master_key_bytes_max must be in 0..65535")
        if self.entry_bytes_max > self.request_bytes_max:
            raise ValueError("entry_bytes_max must not exceed request_bytes_max")


class _Waiter(NamedTuple):
    position: int
    """The log position that must be durable before `response` may go."""
    respond: Respond
    response: BookieResponse
    request: BookieRequest


class Bookie:
    """Answers bookie protocol requests from one `BookieStorage` (see the module docs)."""

    def __init__(
        self,
        storage: BookieStorage,
        background: Background,
        call_soon: CallSoon,
        settings: BookieSettings | None = None,
    ) -> None:
        self.storage = storage
        self.background = background
        self.call_soon = call_soon
        self.settings = settings or BookieSettings()
        self.settings.validate()
        self.waiters: deque[_Waiter] = deque()
        self.sync_scheduled = False
        self.sync_in_flight = False
        self.syncs_completed = 0
        self.disk_full = False
        """The last write found the disk full (cleared by the next write that fits)."""

    @property
    def writable(self) -> bool:
        """Would this bookie take an add now (for its registration as writable)?"""
        return self.storage.writable and not self.disk_full

    def handle(self, request: BookieRequest, respond: Respond) -> None:
        """Act on one request; `respond` is called exactly once (maybe before this returns)."""
        if isinstance(request, AddEntries):
            self.add_entries(request, respond)
        elif isinstance(request, ReadEntries):
            respond(self.read_entries(request))
        elif isinstance(request, ReadLastAddConfirmed):
            self.read_last_add_confirmed(request, respond)
        elif isinstance(request, DropLedger):
            self.drop_ledger(request, respond)
        else:
            respond(_not_a_bookie_request(request))

    # --- adds ---------------------------------------------------------------------------

    def add_entries(self, request: AddEntries, respond: Respond) -> None:
        entry_ids = [entry.entry_id for entry in request.entries]
        datas = [entry.data for entry in request.entries]
        status = self.check_add(request, entry_ids, datas)
        position = 0
        if status is BookieStatus.OK:
            try:
                position = self.storage.add_entries(
                    request.ledger_id,
                    request.master_key,
                    request.last_add_confirmed,
                    entry_ids,
                    datas,
                    request.length,
                )
            except StorageError as error:
                status = self.write_failed(error)
        if status is not BookieStatus.OK:
            respond(AddEntriesResult(request.request_id, request.ledger_id, status))
            return
        self.disk_full = False
        result = AddEntriesResult(request.request_id, request.ledger_id, status, entry_ids)
        self.after_durable(_Waiter(position, respond, result, request))

    def check_add(
        self, request: AddEntries, entry_ids: list[int], datas: list[bytes]
    ) -> BookieStatus:
        settings = self.settings
        if not (
            _is_id(request.ledger_id)
            and -1 <= request.last_add_confirmed <= ID_MAX
            and -1 <= request.length <= ID_MAX
            and (not entry_ids or (entry_ids[0] >= 0 and entry_ids[-1] <= ID_MAX))
            and all(map(operator.lt, entry_ids, entry_ids[1:]))
        ):
            return BookieStatus.BAD_REQUEST
        if (
            len(entry_ids) > settings.entries_per_request_max
            or len(request.master_key) > settings.master_key_bytes_max
            or (datas and max(map(len, datas)) > settings.entry_bytes_max)
            or sum(map(len, datas)) > settings.request_bytes_max
        ):
            return BookieStatus.TOO_LARGE
        if not self.storage.writable:
            return BookieStatus.READ_ONLY
        state = self.storage.ledger(request.ledger_id)
        if state is not None:
            if not hmac.compare_digest(state.master_key, request.master_key):
                return BookieStatus.UNAUTHORIZED
            if state.fenced and not request.recovery:
                return BookieStatus.FENCED
        return BookieStatus.OK

    # --- reads --------------------------------------------------------------------------

    def read_entries(self, request: ReadEntries) -> ReadEntriesResult | ErrorResponse:
        request_id, ledger_id = request.request_id, request.ledger_id
        if not (
            _is_id(ledger_id)
            and 0 <= request.first_entry_id <= request.last_entry_id <= ID_MAX
            and request.bytes_max >= 1
        ):
            return ReadEntriesResult(request_id, ledger_id, BookieStatus.BAD_REQUEST)
        state = self.storage.ledger(ledger_id)
        if state is None:
            return ReadEntriesResult(request_id, ledger_id, BookieStatus.NO_SUCH_LEDGER)
        lac = state.last_add_confirmed
        if state.index.get(request.first_entry_id) is None:
            return ReadEntriesResult(
                request_id, ledger_id, BookieStatus.NO_SUCH_ENTRY, last_add_confirmed=lac
            )
        try:
            entries = self.storage.read_entries(
                ledger_id,
                request.first_entry_id,
                request.last_entry_id,
                min(request.bytes_max, self.settings.read_bytes_max),
                self.settings.read_entries_max,
            )
        except StorageError as error:
            # Damage or an I/O error: an unknown to the client, never a not-found.
            return ErrorResponse(request_id, ErrorCode.INTERNAL, str(error))
        return ReadEntriesResult(request_id, ledger_id, BookieStatus.OK, entries, lac)

    def read_last_add_confirmed(self, request: ReadLastAddConfirmed, respond: Respond) -> None:
        request_id, ledger_id = request.request_id, request.ledger_id
        if not _is_id(ledger_id):
            respond(LastAddConfirmedResult(request_id, ledger_id, BookieStatus.BAD_REQUEST))
            return
        if request.fence:
            self.fence(request, respond)
            return
        state = self.storage.ledger(ledger_id)
        if state is None:
            respond(LastAddConfirmedResult(request_id, ledger_id, BookieStatus.NO_SUCH_LEDGER))
            return
        respond(
            LastAddConfirmedResult(
                request_id,
                ledger_id,
                BookieStatus.OK,
                state.last_add_confirmed,
                state.last_entry_id,
                state.length,
            )
        )

    def fence(self, request: ReadLastAddConfirmed, respond: Respond) -> None:
        """Fence durably, then answer the LAC: every add taken before the fence is in the
        index by now, and none but a recovery add is taken after it."""
        request_id, ledger_id = request.request_id, request.ledger_id
        state = self.storage.ledger(ledger_id)
        status = BookieStatus.OK
        position = 0
        if len(request.master_key) > self.settings.master_key_bytes_max:
            status = BookieStatus.TOO_LARGE
        elif state is not None and not hmac.compare_digest(state.master_key, request.master_key):
            status = BookieStatus.UNAUTHORIZED
        elif not self.storage.writable:
            status = BookieStatus.READ_ONLY
        else:
            try:
                position = self.storage.fence(ledger_id, request.master_key)
            except StorageError as error:
                status = self.write_failed(error)
        fenced = self.storage.ledger(ledger_id)
        if status is not BookieStatus.OK or fenced is None:
            respond(LastAddConfirmedResult(request_id, ledger_id, status))
            return
        result = LastAddConfirmedResult(
            request_id,
            ledger_id,
            status,
            fenced.last_add_confirmed,
            fenced.last_entry_id,
            fenced.length,
        )
        self.after_durable(_Waiter(position, respond, result, request))

    # --- drops --------------------------------------------------------------------------

    def drop_ledger(self, request: DropLedger, respond: Respond) -> None:
        if not _is_id(request.ledger_id):
            respond(
                ErrorResponse(request.request_id, ErrorCode.BAD_REQUEST, "ledger id out of range")
            )
            return
        try:
            position = self.storage.drop(request.ledger_id)
        except StorageError as error:
            self.write_failed(error)
            respond(ErrorResponse(request.request_id, ErrorCode.UNAVAILABLE, str(error)))
            return
        self.after_durable(_Waiter(position, respond, Done(request.request_id), request))

    # --- group commit -------------------------------------------------------------------

    def after_durable(self, waiter: _Waiter) -> None:
        if waiter.position <= self.storage.durable_position:
            waiter.respond(waiter.response)
            return
        self.waiters.append(waiter)
        if not self.sync_scheduled and not self.sync_in_flight:
            self.sync_scheduled = True
            self.call_soon(self.start_sync)

    def start_sync(self) -> None:
        self.sync_scheduled = False
        if self.sync_in_flight:
            return
        try:
            job = self.storage.begin_sync()
        except StorageError:
            self.fail_waiters()
            return
        if job is None:
            self.answer_durable()
            return
        self.sync_in_flight = True
        self.background.submit(job.run, lambda error: self.sync_done(job, error))

    def sync_done(self, job: SyncJob, error: BaseException | None) -> None:
        self.sync_in_flight = False
        self.storage.finish_sync(job, error)
        if error is not None:
            self.fail_waiters()
            return
        self.syncs_completed += 1
        self.answer_durable()
        if self.waiters:
            # They arrived while this sync ran: the next one covers them all at once.
            self.start_sync()

    def answer_durable(self) -> None:
        durable = self.storage.durable_position
        waiters = self.waiters
        while waiters and waiters[0].position <= durable:
            waiter = waiters.popleft()
            waiter.respond(waiter.response)

    def fail_waiters(self) -> None:
        """A sync failed: nothing waiting is acknowledged (it may or may not be on disk)."""
        waiters, self.waiters = self.waiters, deque()
        for waiter in waiters:
            waiter.respond(
                _refusal(waiter.request, BookieStatus.READ_ONLY, "the journal sync failed")
            )

    def write_failed(self, error: StorageError) -> BookieStatus:
        if isinstance(error, DiskFullError):
            self.disk_full = True
        return BookieStatus.READ_ONLY

    def close(self) -> None:
        self.storage.close()


def _is_id(value: int) -> bool:
    return 0 <= value <= ID_MAX


def _not_a_bookie_request(frame: object) -> ErrorResponse:
    """The answer to a frame of another protocol handed to the bookie by mistake."""
    request_id = getattr(frame, "request_id", 0)
    return ErrorResponse(
        request_id if isinstance(request_id, int) else 0,
        ErrorCode.BAD_REQUEST,
        f"{type(frame).__name__} is not a bookie request",
    )


def _refusal(request: BookieRequest, status: BookieStatus, message: str) -> BookieResponse:
    """The answer to a write that waited for a sync that failed (reads never wait)."""
    if isinstance(request, AddEntries):
        return AddEntriesResult(request.request_id, request.ledger_id, status)
    if isinstance(request, ReadLastAddConfirmed):
        return LastAddConfirmedResult(request.request_id, request.ledger_id, status)
    return ErrorResponse(request.request_id, ErrorCode.UNAVAILABLE, message)
