"""What a managed ledger asks of the metadata group, answered asynchronously.

`ManagedLedgerStore` is the managed ledger's one window on metadata: its record (the
partition's ledger list, a compare-and-set per change), and the ledgers it creates, reads
and deletes. Every call returns a `Completion` on the managed ledger's scheduler and never
completes inside the call, so the same `ManagedLedger` runs over the in-memory store here
(tests, the simulator) and over the metadata group's KV in a node.

Deleting a ledger removes its metadata; the bookies' copies go with the store's own
means (a node's store sends DropLedger to the ensemble; bookies also collect ledgers whose
metadata is gone, as BookKeeper's garbage collector does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from quorumlog.errors import ManagedLedgerConflictError, QuorumLogError
from quorumlog.ledger.managed_format import (
    ManagedLedgerRecord,
    decode_record,
    encode_record,
)
from quorumlog.ledger.metadata import InMemoryMetadataStore, LedgerMetadata
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.resources import Scheduler

ResultType = TypeVar("ResultType")


class ManagedLedgerStore(Protocol):
    def read_record(self, name: str) -> Completion[ManagedLedgerRecord | None]:
        """The managed ledger's record (None: there is none yet)."""
        ...

    def write_record(
        self, record: ManagedLedgerRecord, expected_version: int | None
    ) -> Completion[ManagedLedgerRecord]:
        """Store `record` if the stored one has `expected_version` (None: only if there is
        no record yet); completes with what is stored, or fails with
        ManagedLedgerConflictError."""
        ...

    def create_ledger(self, metadata: LedgerMetadata) -> Completion[LedgerMetadata]:
        """Store a new ledger's metadata under a new id (as MetadataStore.create_ledger)."""
        ...

    def read_ledger(self, ledger_id: int) -> Completion[LedgerMetadata]:
        """A ledger's metadata; fails with LedgerNotFoundError if there is none."""
        ...

    def delete_ledger(self, ledger_id: int) -> Completion[None]:
        """Delete a ledger (a ledger already gone counts as deleted)."""
        ...

    def writable_bookies(self) -> Completion[list[str]]:
        """The ids of the bookies that take writes now."""
        ...


class InMemoryManagedLedgerStore:
    """A ManagedLedgerStore over an InMemoryMetadataStore (the one the ledger driver's
    metadata access uses, so writers, recoveries and the managed ledger see one world).
    Records are kept encoded, as the KV keeps them, so no caller can change a stored one
    behind the store's back; answers come through the scheduler."""

    def __init__(self, scheduler: Scheduler, ledgers: InMemoryMetadataStore) -> None:
        self.scheduler = scheduler
        self.ledgers = ledgers
        self.records: dict[str, str] = {}
        self.record_writes = 0
        """Successful record writes (a test can see that a change was stored)."""

    def answer(self, work: Callable[[], ResultType]) -> Completion[ResultType]:
        """Run `work` on a later turn of the scheduler and complete with its outcome."""
        completion: Completion[ResultType] = Completion(self.scheduler)

        def run() -> None:
            try:
                completion.set_result(work())
            except QuorumLogError as error:  # typed store errors travel in the completion
                completion.set_exception(error)

        self.scheduler.call_soon(run)
        return completion

    def read_record(self, name: str) -> Completion[ManagedLedgerRecord | None]:
        def read() -> ManagedLedgerRecord | None:
            value = self.records.get(name)
            return None if value is None else decode_record(value)

        return self.answer(read)

    def write_record(
        self, record: ManagedLedgerRecord, expected_version: int | None
    ) -> Completion[ManagedLedgerRecord]:
        def write() -> ManagedLedgerRecord:
            value = self.records.get(record.name)
            actual = None if value is None else decode_record(value).version
            if actual != expected_version:
                raise ManagedLedgerConflictError(record.name, expected_version, actual)
            encoded = encode_record(record)
            decode_record(encoded)  # refuses a malformed list before it is stored
            self.records[record.name] = encoded
            self.record_writes += 1
            return record

        return self.answer(write)

    def create_ledger(self, metadata: LedgerMetadata) -> Completion[LedgerMetadata]:
        return self.answer(lambda: self.ledgers.create_ledger(metadata))

    def read_ledger(self, ledger_id: int) -> Completion[LedgerMetadata]:
        return self.answer(lambda: self.ledgers.read_ledger(ledger_id))

    def delete_ledger(self, ledger_id: int) -> Completion[None]:
        def delete() -> None:
            if ledger_id in self.ledgers.list_ledgers():
                self.ledgers.delete_ledger(ledger_id)

        return self.answer(delete)

    def writable_bookies(self) -> Completion[list[str]]:
        return self.answer(lambda: [bookie.bookie_id for bookie in self.ledgers.writable_bookies()])
