"""`KVManagedLedgerStore`: the `ManagedLedgerStore` of a node, on the metadata group's KV.

A managed ledger's record lives at `__managed/<name>` (managed_format.py), stored as the
text `encode_record` makes; a change is one KV compare-and-set against the exact text read
before, so the KV's CAS is the record's version check. Ledgers go through the same
`KVMetadataStore` the ledger driver uses, so the managed ledger, its writers and its
recoveries see one world.

Every KV call blocks, so each runs through a `BlockingCalls` (a node: an executor thread,
the outcome handed back to the event loop) and completes a `Completion` on the managed
ledger's scheduler, never inside the call that started it.

A compare-and-set whose outcome is unknown (the KV client gave up after sending it) is
settled by reading the key back: the record carries its version, owner and epoch, so the
exact text we meant to store is there only if our write took effect.

Deleting a ledger removes its metadata first (that is what makes it deleted), then asks
each bookie that held it to drop its entries (best effort, `drop_ledger`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol, TypeVar

from quorumlog.errors import (
    LedgerNotFoundError,
    ManagedLedgerConflictError,
    QuorumLogError,
    UnknownOutcomeError,
)
from quorumlog.kv.internal_keys import internal_keys
from quorumlog.ledger.managed_format import (
    ManagedLedgerRecord,
    decode_record,
    encode_record,
    managed_ledger_key,
)
from quorumlog.ledger.metadata import LedgerMetadata
from quorumlog.ledger.metadata_kv import KeyValueStore, KVMetadataStore
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.resources import Scheduler

log = logging.getLogger("quorumlog.ledger.managed_kv")
CAS_SETTLE_ATTEMPTS = 3
"""Compare-and-sets sent again after an unknown outcome before giving up as unknown."""

ResultType = TypeVar("ResultType")


class BlockingCalls(Protocol):
    def run(self, job: Callable[[], ResultType], completion: Completion[ResultType]) -> None:
        """Run `job` away from the scheduler's thread; settle `completion` with its value or
        its error on the scheduler's thread. A typed error (QuorumLogError) or an OSError
        fails the completion; anything else is a bug and is left to surface."""
        ...


DropLedger = Callable[[str, int], None]
"""(bookie id, ledger id): ask a bookie to forget a deleted ledger; called on the
scheduler's thread, never raises, nobody waits for it."""


class KVManagedLedgerStore:
    def __init__(
        self,
        scheduler: Scheduler,
        kv: KeyValueStore,
        ledgers: KVMetadataStore,
        calls: BlockingCalls,
        drop_ledger: DropLedger,
    ) -> None:
        self.scheduler = scheduler
        self.kv: KeyValueStore = internal_keys(kv)  # "__managed/" keys are internal
        self.ledgers = ledgers
        self.calls = calls
        self.drop_ledger = drop_ledger

    def call(self, job: Callable[[], ResultType]) -> Completion[ResultType]:
        completion: Completion[ResultType] = Completion(self.scheduler)
        self.calls.run(job, completion)
        return completion

    # --- the record ----------------------------------------------------------------------

    def read_record(self, name: str) -> Completion[ManagedLedgerRecord | None]:
        def read() -> ManagedLedgerRecord | None:
            value = self.kv.get(managed_ledger_key(name))
            return None if value is None else decode_record(value)

        return self.call(read)

    def write_record(
        self, record: ManagedLedgerRecord, expected_version: int | None
    ) -> Completion[ManagedLedgerRecord]:
        new_value = encode_record(record)
        decode_record(new_value)  # refuses a malformed list before it is stored
        key = managed_ledger_key(record.name)

        def write() -> ManagedLedgerRecord:
            current = self.kv.get(key)
            actual = None if current is None else decode_record(current).version
            if actual != expected_version:
                raise ManagedLedgerConflictError(record.name, expected_version, actual)
            if compare_and_set(self.kv, key, current, new_value):
                return record
            after = self.kv.get(key)
            found = None if after is None else decode_record(after).version
            raise ManagedLedgerConflictError(record.name, expected_version, found)

        return self.call(write)

    # --- ledgers -------------------------------------------------------------------------

    def create_ledger(self, metadata: LedgerMetadata) -> Completion[LedgerMetadata]:
        return self.call(lambda: self.ledgers.create_ledger(metadata))

    def read_ledger(self, ledger_id: int) -> Completion[LedgerMetadata]:
        return self.call(lambda: self.ledgers.read_ledger(ledger_id))

    def delete_ledger(self, ledger_id: int) -> Completion[None]:
        def delete() -> list[str]:
            try:
                metadata = self.ledgers.read_ledger(ledger_id)
                self.ledgers.delete_ledger(ledger_id)
            except LedgerNotFoundError:
                return []  # already gone: deleted
            return sorted(
                {bookie for ensemble in metadata.ensembles.values() for bookie in ensemble}
            )

        deleted = self.call(delete)
        result: Completion[None] = Completion(self.scheduler)

        def dropped(done: Completion[list[str]]) -> None:
            error = done.exception()
            if error is not None:
                result.set_exception(error)
                return
            for bookie_id in done.result():
                self.drop_ledger(bookie_id, ledger_id)
            result.set_result(None)

        deleted.add_done_callback(dropped)
        return result

    def writable_bookies(self) -> Completion[list[str]]:
        return self.call(lambda: [bookie.bookie_id for bookie in self.ledgers.writable_bookies()])


def compare_and_set(kv: KeyValueStore, key: str, expected: str | None, new: str | None) -> bool:
    """`kv.cas`, with an unknown outcome settled: True if `new` is stored now (ours took
    effect), False if something else is. A read back that still finds `expected` proves
    nothing (the first write may yet apply), so the same compare-and-set is sent again:
    whichever of the two applies first decides, and the other then fails its compare.
    UnknownOutcomeError if no attempt settles it; typed errors of the read back propagate."""
    try:
        return kv.cas(key, expected, new)
    except QuorumLogError as error:
        problem: QuorumLogError = error
    for _ in range(CAS_SETTLE_ATTEMPTS):
        log.info("compare-and-set of %s: outcome unknown (%s); reading it back", key, problem)
        after = kv.get(key)
        if after == new:
            return True
        if after != expected:
            return False
        try:
            if kv.cas(key, expected, new):
                return True
        except QuorumLogError as error:
            problem = error
    raise UnknownOutcomeError(f"compare-and-set of {key}: outcome unknown: {problem}")
