"""Ledger metadata: what the metadata group keeps for each ledger, and the store interface.

A ledger's metadata is small and changes rarely: at creation, at each ensemble change, when
recovery begins and when the ledger closes. Every change is one compare-and-set on the
metadata version (`MetadataStore.update_ledger`), so a store on the Raft metadata group
needs nothing but a CAS on one key: a writer and a recoverer that race both read, both try,
and exactly one wins; the loser re-reads and decides again.

The password is never stored. The metadata keeps a digest that proves a password right, and
bookies get a master key derived from the password with another prefix, so reading the
metadata neither reveals the password nor lets a reader write to the bookies.
"""

from __future__ import annotations

import bisect
import enum
import hashlib
import hmac
import itertools
from typing import Protocol

import msgspec

from quorumlog.errors import (
    BadPasswordError,
    LedgerMetadataConflictError,
    LedgerMetadataFormatError,
    LedgerNotFoundError,
)

METADATA_FORMAT_VERSION = 1
_FORMAT_MAGIC = b"QLLM"
"""Encoded metadata starts with these bytes and one format-version byte."""

_PASSWORD_DIGEST_PREFIX = b"quorumlog ledger password digest\x00"
_MASTER_KEY_PREFIX = b"quorumlog ledger master key\x00"


class LedgerState(enum.Enum):
    OPEN = "open"
    IN_RECOVERY = "in_recovery"
    """A recoverer fenced (or is fencing) the ledger; the writer can no longer change it."""
    CLOSED = "closed"


class LedgerMetadata(msgspec.Struct, frozen=True, kw_only=True):
    """One ledger's metadata. `version` counts updates: each one stores version + 1."""

    ledger_id: int
    version: int = 0
    ensemble_size: int
    write_quorum_size: int
    ack_quorum_size: int
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1
    """The last entry of a CLOSED ledger (-1: none); meaningless before it closes."""
    length: int = 0
    """Data bytes of entries 0..last_entry_id of a CLOSED ledger."""
    ensembles: dict[int, list[str]]
    """Fragments: first entry id -> the bookies (in position order) holding entries from it
    up to the next fragment's first entry."""
    password_digest: bytes
    length_before_last_fragment: int = 0
    """Data bytes of the entries before the last fragment's first entry. A writer starts a
    fragment at its LAC + 1, so these entries are all acknowledged and recovery can start
    there knowing the length."""
    properties: dict[str, str] = {}
    """Free-form labels for the ledger's user (a managed ledger names its topic here)."""

    @property
    def fragment_first_entries(self) -> list[int]:
        return sorted(self.ensembles)

    @property
    def last_fragment_first_entry(self) -> int:
        return max(self.ensembles)

    @property
    def last_ensemble(self) -> list[str]:
        return self.ensembles[self.last_fragment_first_entry]

    def ensemble_for(self, entry_id: int) -> list[str]:
        """The bookies of the fragment that holds `entry_id`."""
        firsts = self.fragment_first_entries
        index = bisect.bisect_right(firsts, entry_id) - 1
        if index < 0:
            raise ValueError(f"entry {entry_id} is before the ledger's first fragment")
        return self.ensembles[firsts[index]]

    @property
    def known_last_add_confirmed(self) -> int:
        """The highest entry the metadata alone proves acknowledged: the last entry of a
        closed ledger, else the entry before the last fragment (a fragment starts at the
        writer's LAC + 1)."""
        if self.state is LedgerState.CLOSED:
            return self.last_entry_id
        return self.last_fragment_first_entry - 1

    def updated(self, **changes: object) -> LedgerMetadata:
        """A copy with `changes` applied and the version one higher: the next update."""
        return msgspec.structs.replace(self, version=self.version + 1, **changes)


def check_metadata(metadata: LedgerMetadata) -> None:
    """Raise LedgerMetadataFormatError unless the relations between the fields hold."""
    problem = metadata_problem(metadata)
    if problem is not None:
        raise LedgerMetadataFormatError(f"ledger {metadata.ledger_id}: {problem}")


def metadata_problem(metadata: LedgerMetadata) -> str | None:
    """What is wrong with `metadata`, or None when it is consistent."""
    ensemble_size = metadata.ensemble_size
    if not 1 <= metadata.ack_quorum_size <= metadata.write_quorum_size <= ensemble_size:
        return "sizes must satisfy 1 <= ack quorum <= write quorum <= ensemble"
    if metadata.version < 0:
        return "negative version"
    if not metadata.ensembles or min(metadata.ensembles) != 0:
        return "the first fragment must start at entry 0"
    for first_entry, bookies in metadata.ensembles.items():
        if len(bookies) != ensemble_size or len(set(bookies)) != ensemble_size:
            return f"fragment {first_entry} needs {ensemble_size} distinct bookies"
    if metadata.state is LedgerState.CLOSED:
        if metadata.last_entry_id < -1 or metadata.length < 0:
            return "a closed ledger needs last_entry_id >= -1 and length >= 0"
        if metadata.last_entry_id < metadata.last_fragment_first_entry - 1:
            return "a closed ledger ends before its last fragment begins"
    return None


def new_ledger_metadata(
    *,
    ensemble: list[str],
    write_quorum_size: int,
    ack_quorum_size: int,
    password: bytes,
    properties: dict[str, str] | None = None,
) -> LedgerMetadata:
    """The metadata of a ledger about to be created (the store assigns `ledger_id`)."""
    metadata = LedgerMetadata(
        ledger_id=-1,
        ensemble_size=len(ensemble),
        write_quorum_size=write_quorum_size,
        ack_quorum_size=ack_quorum_size,
        ensembles={0: list(ensemble)},
        password_digest=password_digest(password),
        properties=dict(properties or {}),
    )
    check_metadata(metadata)
    return metadata


# --- passwords -----------------------------------------------------------------------------


def password_digest(password: bytes) -> bytes:
    return hashlib.sha256(_PASSWORD_DIGEST_PREFIX + password).digest()


def master_key(password: bytes) -> bytes:
    """The key bookies check on every add and fence (never stored in the metadata)."""
    return hashlib.sha256(_MASTER_KEY_PREFIX + password).digest()


def check_password(metadata: LedgerMetadata, password: bytes) -> bytes:
    """The master key for `password`; BadPasswordError unless it is the ledger's."""
    if not hmac.compare_digest(password_digest(password), metadata.password_digest):
        raise BadPasswordError(f"wrong password for ledger {metadata.ledger_id}")
    return master_key(password)


# --- encoding ------------------------------------------------------------------------------

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(LedgerMetadata)


def encode_metadata(metadata: LedgerMetadata) -> bytes:
    return _FORMAT_MAGIC + bytes([METADATA_FORMAT_VERSION]) + _encoder.encode(metadata)


def decode_metadata(data: bytes) -> LedgerMetadata:
    """Decode stored metadata; LedgerMetadataFormatError for anything this version cannot
    read (a newer format is refused, never misread)."""
    header_size = len(_FORMAT_MAGIC) + 1
    if len(data) < header_size or data[: len(_FORMAT_MAGIC)] != _FORMAT_MAGIC:
        raise LedgerMetadataFormatError("not ledger metadata (bad magic)")
    format_version = data[len(_FORMAT_MAGIC)]
    if format_version != METADATA_FORMAT_VERSION:
        raise LedgerMetadataFormatError(
            f"ledger metadata format {format_version} (this version reads "
            f"{METADATA_FORMAT_VERSION})"
        )
    try:
        metadata: LedgerMetadata = _decoder.decode(data[header_size:])
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise LedgerMetadataFormatError(f"bad ledger metadata: {error}") from error
    check_metadata(metadata)
    return metadata


# --- the store -----------------------------------------------------------------------------


class BookieRegistration(msgspec.Struct, frozen=True):
    """A bookie as the registry lists it."""

    bookie_id: str
    address: str
    """"host:port" the bookie serves on."""
    writable: bool = True
    """False once the bookie stops heartbeating or turns read-only (its disk is full)."""


class MetadataStore(Protocol):
    """Where ledger metadata and the bookie registry live (the metadata group).

    Every update is one compare-and-set on the metadata version, so a store over a
    replicated KV needs one CAS per update. The protocol cores never call a store
    themselves (they do no I/O): they hand out operations (protocol_actions.py) that a
    driver carries out against a store, and get the results back as events.
    """

    def create_ledger(self, metadata: LedgerMetadata) -> LedgerMetadata:
        """Store `metadata` under a new unique ledger id; returns it with that id and
        version 0 (the `ledger_id` and `version` passed in are ignored)."""
        ...

    def read_ledger(self, ledger_id: int) -> LedgerMetadata:
        """The current metadata; LedgerNotFoundError if there is none."""
        ...

    def update_ledger(self, metadata: LedgerMetadata, expected_version: int) -> LedgerMetadata:
        """Store `metadata` (whose version must be expected_version + 1) if the stored
        version is still `expected_version`, else LedgerMetadataConflictError;
        LedgerNotFoundError if the ledger is gone."""
        ...

    def delete_ledger(self, ledger_id: int, expected_version: int | None = None) -> None:
        """Remove the ledger's metadata (only at `expected_version`, if given)."""
        ...

    def list_ledgers(self) -> list[int]:
        """Every ledger id, ascending."""
        ...

    def writable_bookies(self) -> list[BookieRegistration]:
        """The registered bookies that take writes now, ordered by id."""
        ...


class InMemoryMetadataStore:
    """A MetadataStore in a dict, for tests and the simulator's single-process runs.

    It stores encoded bytes, as a real store does, so every read decodes a fresh copy and
    nothing can change stored metadata behind the store's back.
    """

    def __init__(self, first_ledger_id: int = 0) -> None:
        self.ledgers: dict[int, bytes] = {}
        self.bookies: dict[str, BookieRegistration] = {}
        self.ledger_ids = itertools.count(first_ledger_id)

    def create_ledger(self, metadata: LedgerMetadata) -> LedgerMetadata:
        ledger_id = next(self.ledger_ids)
        stored = msgspec.structs.replace(metadata, ledger_id=ledger_id, version=0)
        check_metadata(stored)
        self.ledgers[ledger_id] = encode_metadata(stored)
        return stored

    def read_ledger(self, ledger_id: int) -> LedgerMetadata:
        data = self.ledgers.get(ledger_id)
        if data is None:
            raise LedgerNotFoundError(ledger_id)
        return decode_metadata(data)

    def update_ledger(self, metadata: LedgerMetadata, expected_version: int) -> LedgerMetadata:
        current = self.read_ledger(metadata.ledger_id)
        if current.version != expected_version:
            raise LedgerMetadataConflictError(metadata.ledger_id, expected_version, current.version)
        if metadata.version != expected_version + 1:
            raise ValueError(
                f"an update of version {expected_version} must store version "
                f"{expected_version + 1}, not {metadata.version}"
            )
        check_metadata(metadata)
        self.ledgers[metadata.ledger_id] = encode_metadata(metadata)
        return metadata

    def delete_ledger(self, ledger_id: int, expected_version: int | None = None) -> None:
        current = self.read_ledger(ledger_id)
        if expected_version is not None and current.version != expected_version:
            raise LedgerMetadataConflictError(ledger_id, expected_version, current.version)
        del self.ledgers[ledger_id]

    def list_ledgers(self) -> list[int]:
        return sorted(self.ledgers)

    def writable_bookies(self) -> list[BookieRegistration]:
        return sorted(
            (bookie for bookie in self.bookies.values() if bookie.writable),
            key=lambda bookie: bookie.bookie_id,
        )

    def register_bookie(self, bookie_id: str, address: str = "") -> None:
        self.bookies[bookie_id] = BookieRegistration(bookie_id, address or bookie_id)

    def set_bookie_writable(self, bookie_id: str, writable: bool) -> None:
        registration = self.bookies[bookie_id]
        self.bookies[bookie_id] = msgspec.structs.replace(registration, writable=writable)
