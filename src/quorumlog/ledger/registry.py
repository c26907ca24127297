"""Where ledger metadata and bookie registrations live in the metadata group's KV.

The metadata group (the Raft "kv" group every node runs) is quorumlog's ZooKeeper. Ledger
state takes three kinds of key there, all under reserved prefixes:

- `__ledgers/next-id`: the next ledger id, a decimal counter moved with compare-and-set
  (ids are unique and never reused, even after a delete);
- `__ledgers/<id as 20 digits>`: one ledger's metadata, `encode_metadata` bytes in base64
  (the KV holds text). Every update is a compare-and-set against the exact value read, and
  the value carries the metadata version, so the CAS is the version check 001 describes.
  Zero-padded ids make a key-order scan an id-order listing;
- `__bookies/<bookie id>`: a bookie's registration, JSON `BookieRecord`, rewritten by the
  bookie at every heartbeat.

A bookie counts as writable while its last heartbeat is younger than
`BOOKIE_LIVENESS_SECONDS` by the reader's clock and it said it takes writes. Heartbeats
carry the bookie's wall clock, so this leans on clocks agreeing to within a few seconds
(ZooKeeper's ephemeral nodes do not; a session-bound registration is the stronger design).
A stale "writable" costs little: a writer that picks a dead bookie replaces it at once.
"""

from __future__ import annotations

import base64
import binascii

import msgspec

from quorumlog.errors import LedgerMetadataFormatError
from quorumlog.ledger.metadata import (
    BookieRegistration,
    LedgerMetadata,
    decode_metadata,
    encode_metadata,
)

LEDGER_PREFIX = "__ledgers/"
NEXT_LEDGER_ID_KEY = LEDGER_PREFIX + "next-id"
LEDGER_ID_DIGITS = 20
BOOKIE_PREFIX = "__bookies/"

BOOKIE_HEARTBEAT_SECONDS = 2.0
"""How often a bookie rewrites its registration: a third of the liveness window, so two
heartbeats in a row may fail before writers stop offering it. Each one is a replicated,
fsynced write to the metadata group on every node: at 1 s, the three bookies of an idle
3-node cluster were about 45% of its idle CPU."""
BOOKIE_LIVENESS_SECONDS = 6.0
"""A registration older than this is not offered to writers."""


def ledger_key(ledger_id: int) -> str:
    return f"{LEDGER_PREFIX}{ledger_id:0{LEDGER_ID_DIGITS}d}"


def ledger_id_of_key(key: str) -> int | None:
    """The ledger id a metadata key names; None for any other key under the prefix."""
    digits = key.removeprefix(LEDGER_PREFIX)
    if len(digits) == LEDGER_ID_DIGITS and digits.isascii() and digits.isdigit():
        return int(digits)
    return None


def encode_ledger_value(metadata: LedgerMetadata) -> str:
    return base64.b64encode(encode_metadata(metadata)).decode("ascii")


def decode_ledger_value(value: str) -> LedgerMetadata:
    """LedgerMetadataFormatError for a value that is not stored metadata (its format
    version, when that is the problem, is named by `decode_metadata`)."""
    try:
        data = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as error:
        raise LedgerMetadataFormatError(f"ledger metadata is not base64: {error}") from error
    return decode_metadata(data)


def bookie_key(bookie_id: str) -> str:
    return BOOKIE_PREFIX + bookie_id


class BookieRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What a bookie writes at every heartbeat."""

    bookie_id: str
    address: str
    """"host:port" where it serves the bookie protocol."""
    writable: bool
    """False while its disk is full or its storage stopped (it still serves reads)."""
    heartbeat_ms: int
    """The bookie's wall clock when it wrote this."""
    ledgers: int = 0
    journal_bytes: int = 0


_record_decoder = msgspec.json.Decoder(BookieRecord)


def encode_bookie_record(record: BookieRecord) -> str:
    return msgspec.json.encode(record).decode("utf-8")


def decode_bookie_record(value: str) -> BookieRecord | None:
    """None for a value that does not decode (a registration from a newer release, say:
    such a bookie is simply not offered)."""
    try:
        return _record_decoder.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def is_live(
    record: BookieRecord, now_ms: int, liveness_seconds: float = BOOKIE_LIVENESS_SECONDS
) -> bool:
    """`liveness_seconds` is a parameter so that a test can shrink the window."""
    return now_ms - record.heartbeat_ms < liveness_seconds * 1000


def registration(
    record: BookieRecord, now_ms: int, liveness_seconds: float = BOOKIE_LIVENESS_SECONDS
) -> BookieRegistration:
    return BookieRegistration(
        record.bookie_id,
        record.address,
        record.writable and is_live(record, now_ms, liveness_seconds),
    )
