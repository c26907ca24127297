"""The sweep: remove what deleted ledger topics left in the metadata group, and the
ledgers no live topic will ever list.

A deleted topic's owner deletes its partitions' ledgers, ledger lists (`__managed/<name>`)
and leases (`__owners/<name>`), retrying a few times. A node that stopped in the middle,
or an owner that created a ledger and crashed before listing it, leaves these behind, and
no node hosts the deleted topic any more to try again. So one node (the "kv" group's
leader) sweeps every `sweep_seconds`: every managed-ledger name (from records, leases and
the `managed.name` property of ledgers) whose topic incarnation is gone is cleaned up.

A managed ledger's name is `<topic>@<created_ms>/<partition>` (stream/topics.py
`group_id`): the incarnation is gone when no descriptor `__topics/<topic>` exists, or the
one there has another `created_ms` (the topic was deleted and created again under the same
name; that new incarnation's names differ, so it is never touched). Another, not only a
later one: a descriptor is never rewritten, so a live name's `created_ms` is always its
descriptor's, and the metadata leader that created the topic again may have had a clock
behind the first one's (a name kept only because its stamp was the larger would never be
swept).

Why a live topic is never swept (`sweep_deleted_topics`, in this order):

1. The candidates (records, leases, ledgers) are listed before the topic descriptors: a
   candidate's topic existed before the candidate was written, so a topic created during
   the sweep already has its descriptor in the listing, or has no candidates in it.
2. Before anything of a name is deleted, its topic's descriptor is read again on its own
   (linearizably): a name whose topic is there after all is kept.

Orphans of a live topic: a ledger that names a managed ledger whose topic lives, that its
record does not list, and whose `managed.epoch` property is below the record's owner
epoch. Its creator's compare-and-set would have stored the record with that lower epoch,
over a version it had read; the record's versions only go up and its epoch never goes
down, so a record at a higher epoch means that write can never succeed: nobody will ever
list the ledger (an owner that crashed between creating it and listing it, whose successor
took over). A ledger of the current epoch is left alone (its owner may be about to list
it), and so is one without the property (written by an older release).

Ledgers go first (metadata deleted; the caller asks their bookies to drop them, and a
bookie that misses it collects them itself, ledger/bookie_garbage.py), then the record,
then the lease, each by compare-and-set against the value just read, so a write in between
(an old owner still renewing) only postpones it to the next sweep.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import msgspec

from quorumlog.errors import LedgerMetadataFormatError, LedgerNotFoundError
from quorumlog.kv.internal_keys import internal_keys
from quorumlog.ledger.managed_format import (
    EPOCH_PROPERTY,
    MANAGED_PREFIX,
    TOPIC_PROPERTY,
    decode_record,
)
from quorumlog.ledger.metadata import LedgerMetadata
from quorumlog.ledger.metadata_kv import KeyValueStore, KVMetadataStore
from quorumlog.ledger.ownership import OWNER_PREFIX
from quorumlog.ledger.registry import LEDGER_PREFIX, decode_ledger_value, ledger_id_of_key
from quorumlog.stream.topics import TOPIC_PREFIX, decode_descriptor, topic_key

log = logging.getLogger("quorumlog.ledger_topics")

SWEEP_INTERVAL_SECONDS_DEFAULT = 300.0
UNKNOWN_CREATED_MS = -1
"""A descriptor that does not decode: its topic counts as present (never swept)."""


class SweptGarbage(msgspec.Struct, frozen=True):
    names: list[str]
    """The managed ledgers of deleted topics that this sweep removed."""
    ledgers: list[LedgerMetadata]
    """The ledgers deleted (their metadata as it was: the bookies to ask to drop them)."""


def incarnation_of(name: str) -> tuple[str, int] | None:
    """(topic, created_ms) of a managed ledger name; None if it is not one we make."""
    head, slash, partition = name.rpartition("/")
    topic, at, created = head.rpartition("@")
    if not (slash and at and topic and created.isdigit() and partition.isdigit()):
        return None
    return topic, int(created)


def incarnation_gone(name: str, topics: Mapping[str, int]) -> bool:
    """Whether `name` belongs to a topic incarnation that no longer exists; `topics` maps
    each topic to its descriptor's `created_ms`."""
    incarnation = incarnation_of(name)
    if incarnation is None:
        return False  # not a name this code makes: not ours to delete
    topic, created_ms = incarnation
    current = topics.get(topic)
    if current is None:
        return True
    return current != UNKNOWN_CREATED_MS and current != created_ms


def read_topics(kv: KeyValueStore) -> dict[str, int]:
    topics: dict[str, int] = {}
    for key, value in kv.scan_prefix(TOPIC_PREFIX):
        try:
            topics[key.removeprefix(TOPIC_PREFIX)] = decode_descriptor(value).created_ms
        except (msgspec.DecodeError, msgspec.ValidationError):
            topics[key.removeprefix(TOPIC_PREFIX)] = UNKNOWN_CREATED_MS
    return topics


def read_topic(kv: KeyValueStore, topic: str) -> dict[str, int]:
    """The one topic's entry as `read_topics` would make it (empty: no descriptor)."""
    value = kv.get(topic_key(topic))
    if value is None:
        return {}
    try:
        return {topic: decode_descriptor(value).created_ms}
    except (msgspec.DecodeError, msgspec.ValidationError):
        return {topic: UNKNOWN_CREATED_MS}


class NamedLedger(msgspec.Struct, frozen=True):
    ledger_id: int
    epoch: int | None
    """Its `managed.epoch` property (None: absent or not a number)."""


def ledgers_by_name(kv: KeyValueStore) -> dict[str, list[NamedLedger]]:
    """Managed-ledger name -> the ledgers whose metadata names it (`managed.name`)."""
    found: dict[str, list[NamedLedger]] = {}
    for key, value in kv.scan_prefix(LEDGER_PREFIX):
        ledger_id = ledger_id_of_key(key)
        if ledger_id is None:
            continue
        try:
            properties = decode_ledger_value(value).properties
        except LedgerMetadataFormatError:
            continue
        name = properties.get(TOPIC_PROPERTY)
        epoch = properties.get(EPOCH_PROPERTY, "")
        if name is not None:
            parsed = int(epoch) if epoch.isascii() and epoch.isdigit() else None
            found.setdefault(name, []).append(NamedLedger(ledger_id, parsed))
    return found


def sweep_deleted_topics(kv: KeyValueStore, metadata: KVMetadataStore) -> SweptGarbage:
    """One sweep (blocking; see the module docs for the order and why)."""
    kv = internal_keys(kv)
    records = dict(kv.scan_prefix(MANAGED_PREFIX))
    leases = dict(kv.scan_prefix(OWNER_PREFIX))
    ledgers = ledgers_by_name(kv)
    topics = read_topics(kv)
    names = {key.removeprefix(MANAGED_PREFIX) for key in records}
    names |= {key.removeprefix(OWNER_PREFIX) for key in leases}
    names |= set(ledgers)
    swept: list[str] = []
    deleted: list[LedgerMetadata] = []
    for name in sorted(names):
        if not incarnation_gone(name, topics):
            deleted += delete_ledgers(metadata, orphans(kv, name, ledgers.get(name, [])))
            continue
        incarnation = incarnation_of(name)
        if incarnation is None or not incarnation_gone(name, read_topic(kv, incarnation[0])):
            continue  # the second read: present after all
        named = [ledger.ledger_id for ledger in ledgers.get(name, [])]
        deleted += delete_ledgers(metadata, listed_ledgers(kv, name) + named)
        delete_key(kv, MANAGED_PREFIX + name)
        delete_key(kv, OWNER_PREFIX + name)
        swept.append(name)
    if swept or deleted:
        log.info("swept deleted topics %s and %d ledgers", swept, len(deleted))
    return SweptGarbage(swept, deleted)


def orphans(kv: KeyValueStore, name: str, named: list[NamedLedger]) -> list[int]:
    """The ledgers of a live managed ledger that its record will never list (see the
    module docs); the record is read after the ledgers were listed."""
    if not named:
        return []
    value = kv.get(MANAGED_PREFIX + name)
    if value is None:
        return []  # its first owner may be about to store it
    try:
        record = decode_record(value)
    except LedgerMetadataFormatError:
        return []
    listed = {ledger.ledger_id for ledger in record.ledgers}
    return [
        ledger.ledger_id
        for ledger in named
        if ledger.ledger_id not in listed
        and ledger.epoch is not None
        and ledger.epoch < record.owner_epoch
    ]


def listed_ledgers(kv: KeyValueStore, name: str) -> list[int]:
    """The ledgers a managed ledger's record lists now (none: no record, or unreadable)."""
    value = kv.get(MANAGED_PREFIX + name)
    if value is None:
        return []
    try:
        return [ledger.ledger_id for ledger in decode_record(value).ledgers]
    except LedgerMetadataFormatError:
        return []


def delete_ledgers(metadata: KVMetadataStore, ledger_ids: list[int]) -> list[LedgerMetadata]:
    deleted: list[LedgerMetadata] = []
    for ledger_id in sorted(set(ledger_ids)):
        try:
            ledger = metadata.read_ledger(ledger_id)
            metadata.delete_ledger(ledger_id)
        except LedgerNotFoundError:
            continue  # deleted already (by the owner's own delete, say)
        except LedgerMetadataFormatError as error:
            log.warning("ledger %d left alone: %s", ledger_id, error)
            continue
        deleted.append(ledger)
    return deleted


def delete_key(kv: KeyValueStore, key: str) -> None:
    """Delete `key` if it holds what it held a moment ago; a write in between wins (the
    next sweep looks again)."""
    value = kv.get(key)
    if value is not None:
        kv.cas(key, value, None)
