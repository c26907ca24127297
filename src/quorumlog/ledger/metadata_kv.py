"""`KVMetadataStore`: the ledger `MetadataStore` on the metadata group, through a `KVClient`.

Keys and values follow registry.py. Every change is one compare-and-set against the exact
value read before it, so the KV's CAS is the version check: a writer and a recoverer that
race both read, both try, and one wins. A CAS that loses to a change made between our read
and our write is simply tried again from a fresh read (the fresh read then decides: a
version conflict, a missing ledger, or, rarely, a clean retry); each such loop is bounded.

The blocking `KVClient` is thread-safe, so one store may serve the ledger client's metadata
thread and its users' threads alike. Bookie liveness is judged by this process's wall
clock against the heartbeat times bookies write (see registry.py for what that leans on).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import msgspec

from quorumlog.errors import (
    LedgerError,
    LedgerMetadataConflictError,
    LedgerNotFoundError,
)
from quorumlog.kv.internal_keys import internal_keys
from quorumlog.ledger.metadata import BookieRegistration, LedgerMetadata, check_metadata
from quorumlog.ledger.registry import (
    BOOKIE_PREFIX,
    LEDGER_PREFIX,
    NEXT_LEDGER_ID_KEY,
    BookieRecord,
    decode_bookie_record,
    decode_ledger_value,
    encode_ledger_value,
    ledger_id_of_key,
    ledger_key,
    registration,
)

CAS_ATTEMPTS_MAX = 64
"""Compare-and-set rounds one call makes before it gives up: each lost round means another
client changed the same key in between, so this many in a row is contention no caller
should wait out."""


class KeyValueStore(Protocol):
    """What the store needs from a KV client (KVClient has all of it)."""

    def get(self, key: str, stale: bool = False) -> str | None: ...

    def cas(self, key: str, expected: str | None, new: str | None) -> bool: ...

    def scan_prefix(
        self, prefix: str, stale: bool = False, page_keys: int = 1000
    ) -> list[tuple[str, str]]: ...


def wall_time_ms() -> int:
    return int(time.time() * 1000)


class KVMetadataStore:
    def __init__(self, kv: KeyValueStore, *, clock_ms: Callable[[], int] = wall_time_ms) -> None:
        # Ledger and bookie keys are internal ("__ledgers/", "__bookies/"): a KVClient is
        # used through its internal view, which the node lets write and scan them.
        self.kv: KeyValueStore = internal_keys(kv)
        self.clock_ms = clock_ms

    # --- ledgers -----------------------------------------------------------------------

    def create_ledger(self, metadata: LedgerMetadata) -> LedgerMetadata:
        for _ in range(CAS_ATTEMPTS_MAX):
            ledger_id = self.take_ledger_id()
            stored = msgspec.structs.replace(metadata, ledger_id=ledger_id, version=0)
            check_metadata(stored)
            # Ids come from the counter only, so the key is absent unless something other
            # than a ledger client wrote it; the id is then burnt and the next one taken.
            if self.kv.cas(ledger_key(ledger_id), None, encode_ledger_value(stored)):
                return stored
        raise LedgerError(f"no free ledger id after {CAS_ATTEMPTS_MAX} attempts")

    def take_ledger_id(self) -> int:
        """The next id of the `next-id` counter, moved on by compare-and-set."""
        for _ in range(CAS_ATTEMPTS_MAX):
            current = self.kv.get(NEXT_LEDGER_ID_KEY)
            ledger_id = int(current) if current is not None else 0
            if self.kv.cas(NEXT_LEDGER_ID_KEY, current, str(ledger_id + 1)):
                return ledger_id
        raise LedgerError(f"the ledger id counter moved {CAS_ATTEMPTS_MAX} times under us")

    def read_ledger(self, ledger_id: int) -> LedgerMetadata:
        return self.read_stored(ledger_id)[0]

    def read_stored(self, ledger_id: int) -> tuple[LedgerMetadata, str]:
        """The metadata and the exact value it was decoded from (what a CAS expects)."""
        value = self.kv.get(ledger_key(ledger_id))
        if value is None:
            raise LedgerNotFoundError(ledger_id)
        return decode_ledger_value(value), value

    def update_ledger(self, metadata: LedgerMetadata, expected_version: int) -> LedgerMetadata:
        if metadata.version != expected_version + 1:
            raise ValueError(
                f"an update of version {expected_version} must store version "
                f"{expected_version + 1}, not {metadata.version}"
            )
        check_metadata(metadata)
        new_value = encode_ledger_value(metadata)
        key = ledger_key(metadata.ledger_id)
        for _ in range(CAS_ATTEMPTS_MAX):
            current, value = self.read_stored(metadata.ledger_id)
            if current.version != expected_version:
                raise LedgerMetadataConflictError(
                    metadata.ledger_id, expected_version, current.version
                )
            if self.kv.cas(key, value, new_value):
                return metadata
        raise LedgerError(f"ledger {metadata.ledger_id}: metadata kept changing under us")

    def delete_ledger(self, ledger_id: int, expected_version: int | None = None) -> None:
        key = ledger_key(ledger_id)
        for _ in range(CAS_ATTEMPTS_MAX):
            current, value = self.read_stored(ledger_id)
            if expected_version is not None and current.version != expected_version:
                raise LedgerMetadataConflictError(ledger_id, expected_version, current.version)
            if self.kv.cas(key, value, None):
                return
        raise LedgerError(f"ledger {ledger_id}: metadata kept changing under us")

    def allocated_id_watermark(self) -> int:
        """Every ledger id below this has been handed out (its metadata may still be on its
        way); no id at or above it has. Read linearizably."""
        current = self.kv.get(NEXT_LEDGER_ID_KEY)
        return int(current) if current is not None else 0

    def ledger_exists(self, ledger_id: int) -> bool:
        """Whether the ledger's metadata is there now (a linearizable read)."""
        return self.kv.get(ledger_key(ledger_id)) is not None

    def list_ledgers(self) -> list[int]:
        ids = (ledger_id_of_key(key) for key, _ in self.kv.scan_prefix(LEDGER_PREFIX))
        return sorted(ledger_id for ledger_id in ids if ledger_id is not None)

    # --- bookies -----------------------------------------------------------------------

    def all_bookies(self) -> list[BookieRecord]:
        """Every registration that decodes, live or not, ordered by bookie id."""
        records = (decode_bookie_record(value) for _, value in self.kv.scan_prefix(BOOKIE_PREFIX))
        return sorted(
            (record for record in records if record is not None),
            key=lambda record: record.bookie_id,
        )

    def writable_bookies(self) -> list[BookieRegistration]:
        now_ms = self.clock_ms()
        registrations = (registration(record, now_ms) for record in self.all_bookies())
        return [bookie for bookie in registrations if bookie.writable]

    def bookie_address(self, bookie_id: str) -> str | None:
        """Where a bookie serves, from its registration (None: not registered)."""
        value = self.kv.get(BOOKIE_PREFIX + bookie_id)
        record = decode_bookie_record(value) if value is not None else None
        return record.address if record is not None else None
