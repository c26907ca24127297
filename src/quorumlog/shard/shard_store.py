"""Each shard's keys as a multi-version store: revisions per shard, and how they move.

A shard group keeps one `kv.mvcc.MVCCStore` per shard (the plain KV's store, not a second
implementation). Revisions are counted per shard, not per group: a shard's revision is
what its writes bumped, wherever it lived, so it moves with the shard and never goes back
when a new group takes the shard over. Every write command is one revision of its shard.

Moving a shard carries everything a watch needs: its keys with their create and mod
revisions and versions, the shard's revision, and its history (each event with its key
before, and the revision it was compacted to): `InsertShards.key_revisions`,
`store_revisions`, `history`, `compacted_revisions`. A chunked pull sends each shard as its
keys, then its sessions, then its history events, so no chunk has to hold all of it. The
new owner's store is then the old one's: a watch (or a read at a past revision) goes on
there from wherever it was, with no gap, as long as its revision was not compacted.

An insert from a build before revisions (no `key_revisions`) makes revisions up from the
entry alone, the same on every replica: each new key the next revision of the shard.
Snapshots of format 1 and 2 (no revisions) are read the same way, as the plain KV does.
An insert from a build with revisions but without history leaves the history behind: the
new owner's history starts at the revision the shard arrived with (`arrived_revision`),
and a watch from before it ends with `ShardMovedError` (a `CompactedError`): re-watch from
a fresh revision.
"""

from __future__ import annotations

from quorumlog.codec.kv_v3 import KeyValue, WatchEvent
from quorumlog.kv.mvcc import EVENT_OVERHEAD_BYTES, MVCCStore, relink_history
from quorumlog.raft.invariants import require

SHARD_HISTORY_EVENTS_MAX_DEFAULT = 10_000
"""Events each shard keeps for watches and reads at a past revision (16 shards by default:
a group holds at most 16 times this)."""
SHARD_HISTORY_BYTES_MAX_DEFAULT = 512 * 1024
"""About how many bytes of keys and values each shard's history may hold (it rides in
every snapshot of the group)."""
KEY_REVISIONS_BYTES = 12
"""What one key's (create, mod, version) adds to a pull chunk (msgpack integers)."""

SHARD_MOVED = "shard_moved"
"""The failure code (`V3Failure.code`) of a watch or read from at or before the revision its
shard arrived with at its group: that history stayed with the previous owner."""

KeyRevisions = tuple[int, int, int]
"""A key's create revision, mod revision and version, as a pull carries them."""


def new_store(history_events_max: int, history_bytes_max: int) -> MVCCStore:
    return MVCCStore(history_events_max, history_bytes_max)


def load_store(
    store: MVCCStore,
    kvs: list[KeyValue],
    revision: int,
    compacted_revision: int,
    history: list[WatchEvent],
    history_base: list[KeyValue],
) -> None:
    """Fill `store` from a snapshot's shard (history as `history_for_snapshot` left it)."""
    store.load(kvs, revision, compacted_revision, relink_history(history, history_base), [], 1)


def made_up_records(data: dict[str, str]) -> list[KeyValue]:
    """Keys of a snapshot before revisions (formats 1 and 2), with revisions made up from it
    alone: in key order, revisions 1, 2, ... (the shard's revision is then their count)."""
    return [
        KeyValue(key, value.encode(), revision, revision, 1, 0)
        for revision, (key, value) in enumerate(sorted(data.items()), start=1)
    ]


def frozen_revisions(store: MVCCStore, keys: list[str]) -> list[KeyRevisions]:
    """What a pull carries of `keys`' revisions, in the same order."""
    records = store.records
    return [
        (records[key].create_revision, records[key].mod_revision, records[key].version)
        for key in keys
    ]


def revisions_fit(
    items: dict[str, str],
    revisions: list[KeyRevisions] | None,
    store_revision: int | None,
    events: list[WatchEvent] | None = None,
    compacted_revision: int | None = None,
) -> bool:
    """Whether a pulled chunk's revisions can be inserted as they are: one per key, none
    past the shard's revision (or none at all: an older build's), history in revision order
    after its compacted revision. Checked before an insert is proposed, so a bad answer
    from another group is asked again rather than applied."""
    if revisions is None and store_revision is None:
        return events is None and compacted_revision is None
    if revisions is None or store_revision is None or len(revisions) != len(items):
        return False
    if not all(0 < create <= mod <= store_revision for create, mod, _ in revisions):
        return False
    if events is None:
        return compacted_revision is None
    if compacted_revision is None or not 0 <= compacted_revision <= store_revision:
        return False
    history_revisions = [event.kv.mod_revision for event in events]
    return history_revisions == sorted(history_revisions) and all(
        compacted_revision < revision <= store_revision for revision in history_revisions
    )


def history_event_bytes(event: WatchEvent) -> int:
    """About what one history event (with its key before) adds to a pull chunk."""
    previous = event.prev_kv
    previous_bytes = 0 if previous is None else len(previous.value) + EVENT_OVERHEAD_BYTES
    return len(event.kv.key) + len(event.kv.value) + EVENT_OVERHEAD_BYTES + previous_bytes


def insert_pulled(
    store: MVCCStore,
    items: dict[str, str],
    revisions: list[KeyRevisions] | None,
    store_revision: int | None,
    events: list[WatchEvent] | None = None,
    compacted_revision: int | None = None,
) -> None:
    """Add one pulled chunk of a shard to its (PULLING) store, revisions and history as
    the previous owner had them; a repeated chunk changes nothing (an event is added only
    after the last one held: each write of a shard is one event at its own revision).
    Without history (an older build), the history starts at the shard's revision."""
    merged = dict(store.records)
    revision = store.revision
    history = list(store.history)
    if revisions is None or store_revision is None:
        # From a build before revisions: each new key the next revision (see the module
        # docstring); a key already here (a repeated chunk) keeps its own.
        for key, value in items.items():
            if key not in merged:
                revision += 1
                merged[key] = KeyValue(key, value.encode(), revision, revision, 1, 0)
        compacted, history = revision, []
    else:
        require(
            len(revisions) == len(items),
            f"a pulled chunk has {len(items)} keys and {len(revisions)} key revisions",
        )
        for (key, value), (create, mod, version) in zip(items.items(), revisions, strict=True):
            require(
                0 < create <= mod <= store_revision,
                f"pulled key {key!r} has revisions {create}..{mod} past {store_revision}",
            )
            merged[key] = KeyValue(key, value.encode(), create, mod, version, 0)
        revision = max(revision, store_revision)
        if events is None or compacted_revision is None:
            compacted, history = revision, []  # the history stayed behind
        else:
            compacted = compacted_revision
            last = history[-1].kv.mod_revision if history else compacted_revision
            history.extend(event for event in events if event.kv.mod_revision > last)
    # Chunks come in key order, so the new keys follow the old ones and the store's sort
    # of them is one pass over an ordered list.
    store.load(list(merged.values()), revision, compacted, history, [], 1)


__all__ = [
    "KEY_REVISIONS_BYTES",
    "SHARD_HISTORY_BYTES_MAX_DEFAULT",
    "SHARD_HISTORY_EVENTS_MAX_DEFAULT",
    "SHARD_MOVED",
    "KeyRevisions",
    "frozen_revisions",
    "history_event_bytes",
    "insert_pulled",
    "load_store",
    "made_up_records",
    "new_store",
    "revisions_fit",
]
