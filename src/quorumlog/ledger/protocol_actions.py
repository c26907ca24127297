"""What the ledger protocol cores take in and hand out, and their settings.

The cores (protocol_write.py, protocol_recovery.py, protocol_read.py) do no I/O and read no
clock, as the Raft core does not. A driver — the asyncio client, the simulator, a test —
feeds each core events:

- `receive(bookie_id, answer)`: a bookie answered one of the core's requests (answers to
  requests the core no longer waits for, and duplicates, are ignored);
- `bookie_unreachable(bookie_id)`: the connection to a bookie failed: every request the
  core has outstanding there is lost (an unknown, never a "not here");
- `metadata_result(result)`: the outcome of a metadata operation the core asked for;
- `tick()`: time passed (timeouts and retry delays are counted in ticks);

and after each event (or a burst of them) collects `take_actions()`, a `LedgerActions`:

1. Send every frame in `sends` to its bookie, in the order given (a writer's adds to one
   bookie go in entry order). Answers may come back in any order, duplicated or never:
   the cores match them by request id and count a lost one as a timeout.
2. Carry out every operation in `metadata_operations` against the metadata store (a core
   has one outstanding at a time) and feed exactly one result back with `metadata_result`:
   `MetadataUnavailable` when the store did not answer in time. `run_metadata_operation`
   does it for a synchronous store.
3. Report the outcome: `last_add_confirmed` (entries up to it are acknowledged, in entry
   order), `failure` (the handle failed: every entry after its last LAC failed with it),
   `closed` (the CLOSED metadata a close or a recovery stored), `entries` of a read.

Collecting actions is where a writer batches: every entry appended since the last
`take_actions` goes out in one AddEntries frame per bookie.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from quorumlog.codec.wire import (
    AddEntries,
    AddEntriesResult,
    ErrorResponse,
    LastAddConfirmedResult,
    LedgerEntryData,
    ReadEntries,
    ReadEntriesResult,
    ReadLastAddConfirmed,
)
from quorumlog.errors import (
    LedgerError,
    LedgerMetadataConflictError,
    LedgerMetadataFormatError,
    LedgerNotFoundError,
)
from quorumlog.ledger.metadata import LedgerMetadata, MetadataStore

BookieRequest = AddEntries | ReadEntries | ReadLastAddConfirmed
BookieAnswer = AddEntriesResult | ReadEntriesResult | LastAddConfirmedResult | ErrorResponse
"""An ErrorResponse (a bookie's storage failed, say) is an unknown for the request it names:
a writer replaces that bookie, a reader or a recoverer asks again or elsewhere."""


class LedgerProtocolConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Every bound has its unit in its name. Times are in ticks: the cores read no clock."""

    request_timeout_ticks: int = 100
    """A bookie request unanswered this long failed (for an add: the bookie is replaced)."""
    retry_delay_ticks: int = 5
    """Wait before asking again after an unknown answer or an unavailable metadata store."""
    batch_entries_max: int = 4096
    """Entries in one AddEntries frame."""
    batch_bytes_max: int = 1024 * 1024
    """Data bytes in one AddEntries frame (one larger entry still goes alone)."""
    inflight_requests_max: int = 64
    """AddEntries frames a writer may have unanswered at one bookie (its pipeline window)."""
    pending_entries_max: int = 200_000
    """Unacknowledged entries a writer holds before appends fail with
    LedgerPendingFullError (it must keep them to resend after an ensemble change)."""
    pending_bytes_max: int = 256 * 1024 * 1024
    """Unacknowledged data bytes a writer holds before appends fail."""
    entry_bytes_max: int = 4 * 1024 * 1024
    """The largest entry an append takes."""
    ensemble_change_attempts_max: int = 10
    """Tries at finding replacement bookies before the handle fails NotEnoughBookies."""
    quarantine_ticks: int = 1000
    """A bookie that failed a writer is not picked as a replacement for this long (unless
    there is no other choice): the registry may still list a bookie that just died."""
    read_entries_max: int = 4096
    """Entries one ReadEntries frame asks for."""
    read_bytes_max: int = 4 * 1024 * 1024
    """`bytes_max` of one ReadEntries frame."""
    read_rounds_max: int = 3
    """Times a read tries every bookie of an entry's write set before it gives up."""
    recovery_restarts_max: int = 16
    """Times one recovery starts over after another client changed the metadata."""

    def validate(self) -> None:
        """Raise ValueError naming the first setting that is out of range."""
        for name in self.__struct_fields__:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.entry_bytes_max > self.pending_bytes_max:
            raise ValueError("entry_bytes_max must not exceed pending_bytes_max")


# --- actions out ---------------------------------------------------------------------------


class BookieSend(msgspec.Struct, frozen=True):
    bookie_id: str
    request: BookieRequest


class ReadLedgerMetadata(msgspec.Struct, frozen=True):
    operation_id: int
    ledger_id: int


class UpdateLedgerMetadata(msgspec.Struct, frozen=True):
    """Compare-and-set: store `metadata` if the stored version is `expected_version`."""

    operation_id: int
    metadata: LedgerMetadata
    expected_version: int


class ListWritableBookies(msgspec.Struct, frozen=True):
    operation_id: int


MetadataOperation = ReadLedgerMetadata | UpdateLedgerMetadata | ListWritableBookies


# --- metadata results in -------------------------------------------------------------------


class MetadataRead(msgspec.Struct, frozen=True):
    """A read, or a successful update: `metadata` is what is stored now."""

    operation_id: int
    metadata: LedgerMetadata


class MetadataConflict(msgspec.Struct, frozen=True):
    """The compare-and-set failed; `current` is the metadata stored now (None: deleted)."""

    operation_id: int
    current: LedgerMetadata | None


class MetadataMissing(msgspec.Struct, frozen=True):
    """The ledger has no metadata (never created, or deleted)."""

    operation_id: int


class WritableBookies(msgspec.Struct, frozen=True):
    operation_id: int
    bookie_ids: list[str]


class MetadataUnavailable(msgspec.Struct, frozen=True):
    """The store did not answer (in time): the operation's outcome is unknown. A core asks
    again after a delay; an update that did happen shows up as a conflict with its own
    result, which the core recognises."""

    operation_id: int


MetadataResult = (
    MetadataRead | MetadataConflict | MetadataMissing | WritableBookies | MetadataUnavailable
)


def run_metadata_operation(store: MetadataStore, operation: MetadataOperation) -> MetadataResult:
    """Carry out `operation` against a synchronous store. Store errors a core can act on
    become results; anything else (a store that is down) propagates to the driver, which
    feeds `MetadataUnavailable` instead."""
    operation_id = operation.operation_id
    if isinstance(operation, ListWritableBookies):
        bookies = [bookie.bookie_id for bookie in store.writable_bookies()]
        return WritableBookies(operation_id, bookies)
    if isinstance(operation, ReadLedgerMetadata):
        try:
            return MetadataRead(operation_id, store.read_ledger(operation.ledger_id))
        except LedgerNotFoundError:
            return MetadataMissing(operation_id)
    ledger_id = operation.metadata.ledger_id
    try:
        stored = store.update_ledger(operation.metadata, operation.expected_version)
        return MetadataRead(operation_id, stored)
    except LedgerMetadataConflictError:
        try:
            return MetadataConflict(operation_id, store.read_ledger(ledger_id))
        except LedgerNotFoundError:
            return MetadataConflict(operation_id, None)
    except LedgerNotFoundError:
        return MetadataConflict(operation_id, None)
    except LedgerMetadataFormatError:
        # Whatever is stored cannot be read: treat it as someone else's change we cannot
        # follow, so the core gives up instead of overwriting it.
        return MetadataConflict(operation_id, None)


@dataclass(slots=True)
class LedgerActions:
    """One batch of what a core wants done (see the module docstring for the order)."""

    sends: list[BookieSend] = field(default_factory=list)
    metadata_operations: list[MetadataOperation] = field(default_factory=list)
    last_add_confirmed: int | None = None
    """Set when the LAC advanced: entries up to it are acknowledged."""
    failure: LedgerError | None = None
    """Set once, when the handle (or the read, or the recovery) failed for good."""
    closed: LedgerMetadata | None = None
    """A writer's close (or a recovery) stored this CLOSED metadata."""
    entries: list[LedgerEntryData] | None = None
    """A finished read's entries, in entry order."""

    def is_empty(self) -> bool:
        return not (
            self.sends
            or self.metadata_operations
            or self.last_add_confirmed is not None
            or self.failure is not None
            or self.closed is not None
            or self.entries is not None
        )


class LedgerCore(Protocol):
    """What every protocol core takes and hands out (writer, recovery, reads)."""

    def receive(self, bookie_id: str, answer: BookieAnswer) -> None: ...

    def bookie_unreachable(self, bookie_id: str) -> None: ...

    def metadata_result(self, result: MetadataResult) -> None: ...

    def tick(self) -> None: ...

    def take_actions(self) -> LedgerActions: ...


RequestIds = Callable[[], int]
"""Hands out request ids. One source per bookie connection set (a driver shares it among
every core it runs), so answers can be routed back to the core that asked."""


def request_id_counter(first: int = 1) -> RequestIds:
    counter: Iterator[int] = itertools.count(first)
    return counter.__next__


class MetadataCalls:
    """A core's metadata operations: one at a time, asked again after a delay when the
    store was unavailable (each attempt under a new operation id, so a late result of an
    abandoned attempt is never taken for the current one)."""

    def __init__(self, retry_delay_ticks: int, operation_ids: Iterator[int] | None = None) -> None:
        self.retry_delay_ticks = retry_delay_ticks
        self.operation_ids = operation_ids if operation_ids is not None else itertools.count(1)
        """Shared by cores that one driver feeds through one entry point (a recovery and
        its re-writer), so their operations never share an id."""
        self.pending: MetadataOperation | None = None
        self.retry_at_tick: int | None = None

    def read(self, ledger_id: int) -> MetadataOperation:
        return self.issue(ReadLedgerMetadata(next(self.operation_ids), ledger_id))

    def update(self, metadata: LedgerMetadata, expected_version: int) -> MetadataOperation:
        operation = UpdateLedgerMetadata(next(self.operation_ids), metadata, expected_version)
        return self.issue(operation)

    def list_bookies(self) -> MetadataOperation:
        return self.issue(ListWritableBookies(next(self.operation_ids)))

    def issue(self, operation: MetadataOperation) -> MetadataOperation:
        self.pending = operation
        self.retry_at_tick = None
        return operation

    def accept(self, result: MetadataResult, now_tick: int) -> MetadataResult | None:
        """The result if it answers the pending operation (None for a stale result, or an
        unavailable store: then the operation is asked again `retry_delay_ticks` later)."""
        if self.pending is None or result.operation_id != self.pending.operation_id:
            return None
        if isinstance(result, MetadataUnavailable):
            self.retry_at_tick = now_tick + self.retry_delay_ticks
            return None
        self.pending = None
        return result

    def retry_later(self, now_tick: int) -> None:
        """Ask the pending operation again only after the retry delay."""
        self.retry_at_tick = now_tick + self.retry_delay_ticks

    def due(self, now_tick: int) -> MetadataOperation | None:
        """The pending operation again, under a new id, once its retry delay is over."""
        if self.pending is None or self.retry_at_tick is None or now_tick < self.retry_at_tick:
            return None
        again = msgspec.structs.replace(self.pending, operation_id=next(self.operation_ids))
        return self.issue(again)

    def cancel(self) -> None:
        self.pending = None
        self.retry_at_tick = None
