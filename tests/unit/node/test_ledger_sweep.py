"""The sweep of deleted ledger topics' leftovers (node/ledger_sweep.py), on an in-memory
KV: a gone incarnation's records, leases and ledgers (listed or not) are removed; a live
topic's, and a re-created topic's new incarnation's, are never touched; a topic found
present on the second read is kept."""

from __future__ import annotations

from quorumlog.codec import wire
from quorumlog.ledger.managed_format import (
    EPOCH_PROPERTY,
    TOPIC_PROPERTY,
    ManagedLedgerInfo,
    ManagedLedgerRecord,
    encode_record,
    managed_ledger_key,
)
from quorumlog.ledger.metadata import new_ledger_metadata
from quorumlog.ledger.metadata_kv import KVMetadataStore
from quorumlog.ledger.ownership import OwnerLease, encode_lease, owner_key
from quorumlog.ledger.registry import ledger_key
from quorumlog.node.ledger_sweep import incarnation_gone, sweep_deleted_topics
from quorumlog.stream.topics import TOPIC_PREFIX, encode_descriptor, topic_key
from tests.unit.ledger.test_managed_kv import DictKV


def descriptor(name: str, created_ms: int) -> wire.TopicDescriptor:
    return wire.TopicDescriptor(
        name=name,
        settings=wire.TopicSettings(partitions=1, replication=1),
        replicas=[["n1"]],
        addresses={},
        created_ms=created_ms,
    )


def add_topic(kv: DictKV, name: str, created_ms: int) -> None:
    kv.data[topic_key(name)] = encode_descriptor(descriptor(name, created_ms))


def add_partition(
    kv: DictKV, store: KVMetadataStore, name: str, listed: int, orphans: int
) -> list[int]:
    """A managed ledger's record listing `listed` new ledgers, its lease, and `orphans`
    more ledgers naming it that the record does not list; every ledger id."""
    ids = [create_ledger(store, name) for _ in range(listed + orphans)]
    infos = ledger_list(ids[:listed])
    kv.data[managed_ledger_key(name)] = encode_record(
        ManagedLedgerRecord(name=name, owner_epoch=1, owner="n1", ledgers=infos)
    )
    kv.data[owner_key(name)] = encode_lease(OwnerLease("n1", epoch=1))
    return ids


def ledger_list(ledger_ids: list[int]) -> list[ManagedLedgerInfo]:
    """A well-formed list: one entry in each closed ledger, the last one open."""
    last = len(ledger_ids) - 1
    return [
        ManagedLedgerInfo(
            ledger_id=ledger_id,
            first_offset=position,
            closed=position < last,
            last_entry_id=0 if position < last else -1,
        )
        for position, ledger_id in enumerate(ledger_ids)
    ]


def create_ledger(store: KVMetadataStore, name: str) -> int:
    metadata = new_ledger_metadata(
        ensemble=["b1"],
        write_quorum_size=1,
        ack_quorum_size=1,
        password=b"",
        properties={TOPIC_PROPERTY: name},
    )
    return store.create_ledger(metadata).ledger_id


def keys_of(kv: DictKV, name: str, ledger_ids: list[int]) -> list[str]:
    keys = [managed_ledger_key(name), owner_key(name), *map(ledger_key, ledger_ids)]
    return [key for key in keys if key in kv.data]


def test_an_incarnation_is_gone_when_its_topic_is_absent_or_was_created_again() -> None:
    topics = {"live": 5, "again": 9}
    assert incarnation_gone("deleted@5/0", topics)
    assert not incarnation_gone("live@5/0", topics)
    assert incarnation_gone("again@5/1", topics)
    assert not incarnation_gone("again@9/1", topics)
    # A name whose stamp is larger than the stored descriptor's is gone too (that topic
    # was created again by a leader whose clock was behind); one we do not make: not ours.
    assert incarnation_gone("live@7/0", topics)
    assert not incarnation_gone("bad@5/0", {"bad": -1})  # a descriptor that does not decode
    assert not incarnation_gone("deleted/0", topics)
    assert not incarnation_gone("deleted@x/0", topics)


def test_a_deleted_topics_keys_and_ledgers_are_swept_and_a_live_ones_are_kept() -> None:
    kv = DictKV()
    store = KVMetadataStore(kv)
    add_topic(kv, "live", 5)
    add_topic(kv, "again", 9)
    live = add_partition(kv, store, "live@5/0", listed=2, orphans=0)
    deleted = add_partition(kv, store, "deleted@3/0", listed=2, orphans=1)
    old = add_partition(kv, store, "again@4/0", listed=1, orphans=0)
    new = add_partition(kv, store, "again@9/0", listed=1, orphans=0)
    swept = sweep_deleted_topics(kv, store)
    assert swept.names == ["again@4/0", "deleted@3/0"]
    assert sorted(ledger.ledger_id for ledger in swept.ledgers) == sorted(old + deleted)
    assert keys_of(kv, "deleted@3/0", deleted) == []
    assert keys_of(kv, "again@4/0", old) == []
    assert len(keys_of(kv, "live@5/0", live)) == 4
    assert len(keys_of(kv, "again@9/0", new)) == 3
    assert sweep_deleted_topics(kv, store).names == []


def test_only_a_lease_left_behind_is_swept_too() -> None:
    kv = DictKV()
    kv.data[owner_key("gone@1/0")] = encode_lease(OwnerLease("n2", epoch=4))
    assert sweep_deleted_topics(kv, KVMetadataStore(kv)).names == ["gone@1/0"]
    assert kv.data == {}


class TopicScanMisses(DictKV):
    """The listing of topics misses them all (as a paged scan racing a create might)."""

    def scan_prefix(
        self, prefix: str, stale: bool = False, page_keys: int = 1000
    ) -> list[tuple[str, str]]:
        if prefix == TOPIC_PREFIX:
            return []
        return super().scan_prefix(prefix, stale, page_keys)


def test_a_topic_found_on_the_second_read_is_kept() -> None:
    kv = TopicScanMisses()
    store = KVMetadataStore(kv)
    add_topic(kv, "live", 5)
    live = add_partition(kv, store, "live@5/0", listed=1, orphans=1)
    assert sweep_deleted_topics(kv, store).names == []
    assert len(keys_of(kv, "live@5/0", live)) == 4


def test_a_ledger_that_no_record_lists_is_swept_by_the_name_in_its_metadata() -> None:
    # Its owner created it, crashed before listing it, and the topic was deleted since.
    kv = DictKV()
    store = KVMetadataStore(kv)
    ledger_id = create_ledger(store, "gone@1/0")
    swept = sweep_deleted_topics(kv, store)
    assert (swept.names, [ledger.ledger_id for ledger in swept.ledgers]) == (
        ["gone@1/0"],
        [ledger_id],
    )
    assert ledger_key(ledger_id) not in kv.data


def create_stamped(store: KVMetadataStore, name: str, epoch: int | None) -> int:
    properties = {TOPIC_PROPERTY: name}
    if epoch is not None:
        properties[EPOCH_PROPERTY] = str(epoch)
    metadata = new_ledger_metadata(
        ensemble=["b1"], write_quorum_size=1, ack_quorum_size=1, password=b"", properties=properties
    )
    return store.create_ledger(metadata).ledger_id


def test_a_live_topics_ledger_from_an_earlier_owner_epoch_that_no_record_lists_is_swept() -> None:
    kv = DictKV()
    store = KVMetadataStore(kv)
    add_topic(kv, "live", 5)
    name = "live@5/0"
    listed = [create_stamped(store, name, 1), create_stamped(store, name, 2)]
    orphan = create_stamped(store, name, 1)  # its owner crashed before listing it
    pending = create_stamped(store, name, 2)  # the current owner may be listing it now
    older_release = create_stamped(store, name, None)
    infos = ledger_list(listed)
    kv.data[managed_ledger_key(name)] = encode_record(
        ManagedLedgerRecord(name=name, owner_epoch=2, owner="n2", ledgers=infos)
    )
    swept = sweep_deleted_topics(kv, store)
    assert (swept.names, [ledger.ledger_id for ledger in swept.ledgers]) == ([], [orphan])
    assert sorted(store.list_ledgers()) == sorted([*listed, pending, older_release])
    assert managed_ledger_key(name) in kv.data


def test_a_live_topics_unlisted_ledger_is_kept_while_there_is_no_record() -> None:
    kv = DictKV()
    store = KVMetadataStore(kv)
    add_topic(kv, "live", 5)
    ledger_id = create_stamped(store, "live@5/0", 1)  # the first owner's, before its record
    assert sweep_deleted_topics(kv, store).ledgers == []
    assert store.list_ledgers() == [ledger_id]


def test_a_topic_created_again_by_a_clock_behind_the_first_still_sweeps_the_first() -> None:
    # The metadata leader that created "again" the second time had a clock behind the one
    # that created it first (leadership moved to a node with a slower clock), so the new
    # incarnation's created_ms is the smaller one. The first incarnation is gone all the
    # same: a descriptor is never rewritten, so one holding another created_ms means the
    # one a name was made from was deleted.
    kv = DictKV()
    store = KVMetadataStore(kv)
    add_topic(kv, "again", 4)
    old = add_partition(kv, store, "again@9/0", listed=2, orphans=1)
    new = add_partition(kv, store, "again@4/0", listed=1, orphans=0)
    swept = sweep_deleted_topics(kv, store)
    assert swept.names == ["again@9/0"]
    assert sorted(ledger.ledger_id for ledger in swept.ledgers) == sorted(old)
    assert keys_of(kv, "again@9/0", old) == []
    assert len(keys_of(kv, "again@4/0", new)) == 3
