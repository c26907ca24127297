"""The multi-version key space under the KV state machine (etcd's mvcc is the model).

Every key carries its create and mod revisions, its version and its lease; the store has
one revision that each write command bumps once, however many keys it touches (a txn is
one revision). Each change is kept as a `WatchEvent` (with the key before it) in a history
that runs from the last compaction to now: watches read it, and a read at an older
revision undoes it, newest first, from the current keys. `compact` frees history up to a
revision; the history is also bounded (`history_events_max`): past the bound the oldest
revisions are compacted away, the same way on every replica.

Leases carry their expiry in the log's time (the stamps of the entries that granted or
kept them alive), never a replica's clock; only the leader decides that a lease expired,
by proposing its revocation (see `node/kv_leases.py`).

No I/O, no clock: the machine calls this while it applies an entry.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from array import array
from collections.abc import Iterator, Mapping

import msgspec

from quorumlog.codec.kv_v3 import (
    RANGE_END_ALL,
    Compare,
    KeyValue,
    RequestOp,
    ResponseOp,
    Txn,
    TxnResponse,
    V3Failure,
    WatchEvent,
    in_range,
)
from quorumlog.raft.invariants import require

HISTORY_EVENTS_MAX_DEFAULT = 100_000
"""Events kept for watches and past-revision reads before the oldest are compacted."""
HISTORY_BYTES_MAX_DEFAULT = 4 * 1024 * 1024
"""About how many bytes of keys and values the history may hold (it rides in every
snapshot, and a snapshot is what a lagging replica must fetch to catch up)."""
EVENT_OVERHEAD_BYTES = 48
"""What one event is counted for beyond its key and value."""
LEASE_TTL_SECONDS_MAX = 9_000_000_000
"""etcd's bound on a lease's TTL."""


class Lease(msgspec.Struct, frozen=True, array_like=True):
    lease_id: int
    ttl_seconds: int
    expiry_ms: int
    """In the log's time: the stamp of the entry that granted or last kept it, plus TTL."""


def text(value: bytes) -> str:
    """A value as the text API (get, scan, streams' metadata) shows it."""
    return value.decode("utf-8", errors="replace")


class TextView(Mapping[str, str]):
    """The keys and their values as text: what the plain KV's readers (streams' metadata,
    the simulator's checks) read, over the bytes the store keeps."""

    def __init__(self, records: dict[str, KeyValue]) -> None:
        self.records = records

    def __getitem__(self, key: str) -> str:
        return text(self.records[key].value)

    def __iter__(self) -> Iterator[str]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)


class StoreFailure(Exception):
    """A v3 command refused; carries its `V3Failure` answer (nothing was changed)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.failure = V3Failure(code=code, message=message)


class MVCCStore:
    """Keys with revisions, leases, and the history since the last compaction."""

    def __init__(
        self,
        history_events_max: int = HISTORY_EVENTS_MAX_DEFAULT,
        history_bytes_max: int = HISTORY_BYTES_MAX_DEFAULT,
    ) -> None:
        require(history_events_max >= 8, "history_events_max must be at least 8")
        require(history_bytes_max >= 1024, "history_bytes_max must be at least 1024")
        self.history_events_max = history_events_max
        self.history_bytes_max = history_bytes_max
        self.history_bytes = 0
        self.records: dict[str, KeyValue] = {}
        self.ordered_keys: list[str] = []
        """The keys in order as of the last read that needed them; with `keys_added` and
        `keys_removed`, every key now. Kept lazily: inserting each new key into a sorted
        list moves the list (O(keys)) on every put, which cost more than the rest of
        applying a put; a read brings the order up to date once for all changes since."""
        self.keys_added: set[str] = set()
        self.keys_removed: set[str] = set()
        self.revision = 0
        self.compacted_revision = 0
        self.history: list[WatchEvent] = []
        self.history_ends = array("q")
        """Beside `history`: where each event ends, counting every event's bytes (see
        `event_bytes`) since the store began; `history_offset` is where the first one
        starts. A trim finds its cut by bisecting these instead of walking the oldest
        events (cold in memory by then) to add up their sizes."""
        self.history_offset = 0
        self.leases: dict[int, Lease] = {}
        self.lease_keys: dict[int, set[str]] = {}
        self.next_lease_id = 1
        self.pending: list[WatchEvent] = []
        """Changes of the command being applied, all at revision + 1."""
        self.pending_bytes = 0

    # --- changing keys (inside one command) --------------------------------------------

    def put(self, key: str, value: bytes, lease: int = 0) -> KeyValue | None:
        """Set `key` at the next revision; the key before, if any."""
        revision = self.revision + 1
        previous = self.records.get(key)
        if previous is None:
            record = KeyValue(key, value, revision, revision, 1, lease)
            if key in self.keys_removed:
                self.keys_removed.discard(key)  # still in ordered_keys
            else:
                self.keys_added.add(key)
        else:
            record = KeyValue(
                key, value, previous.create_revision, revision, previous.version + 1, lease
            )
            self.detach(previous)
        self.records[key] = record
        if lease:
            self.lease_keys.setdefault(lease, set()).add(key)
        self.pending.append(WatchEvent("PUT", record, previous))
        self.pending_bytes += len(key) + len(value) + EVENT_OVERHEAD_BYTES
        return previous

    def put_commands(self, keys: list[str], values: list[bytes]) -> None:
        """Puts without a lease, each a whole command, in order: for every key and value
        exactly what `put` then `finish` do (one revision each, the history trimmed after
        each as `finish` trims), with the per-put work written out once. The plain KV's
        puts are the bulk of most workloads, and the calls and attribute reads between
        `put` and `finish` cost more than the put itself. Only between commands."""
        records = self.records
        history = self.history
        keys_added = self.keys_added
        keys_removed = self.keys_removed
        history_events_max = self.history_events_max
        history_bytes_max = self.history_bytes_max
        history_bytes = self.history_bytes
        history_ends = self.history_ends
        history_offset = self.history_offset
        revision = self.revision
        for key, value in zip(keys, values, strict=True):
            revision += 1
            previous = records.get(key)
            if previous is None:
                record = KeyValue(key, value, revision, revision, 1, 0)
                if key in keys_removed:
                    keys_removed.discard(key)  # still in ordered_keys
                else:
                    keys_added.add(key)
            else:
                record = KeyValue(
                    key, value, previous.create_revision, revision, previous.version + 1, 0
                )
                if previous.lease:
                    self.detach(previous)
            records[key] = record
            history.append(WatchEvent("PUT", record, previous))
            history_bytes += len(key) + len(value) + EVENT_OVERHEAD_BYTES
            history_ends.append(history_offset + history_bytes)
            if history_bytes > history_bytes_max or len(history) > history_events_max:
                self.revision = revision
                self.history_bytes = history_bytes
                self.trim_history()  # in place: `history` is still the history
                history_bytes = self.history_bytes
                history_offset = self.history_offset
        self.revision = revision
        self.history_bytes = history_bytes

    def delete(self, key: str) -> KeyValue | None:
        previous = self.records.pop(key, None)
        if previous is None:
            return None
        if key in self.keys_added:
            self.keys_added.discard(key)  # never reached ordered_keys
        else:
            self.keys_removed.add(key)
        self.detach(previous)
        tombstone = KeyValue(key, b"", 0, self.revision + 1, 0, 0)
        self.pending.append(WatchEvent("DELETE", tombstone, previous))
        self.pending_bytes += len(key) + EVENT_OVERHEAD_BYTES
        return previous

    def detach(self, record: KeyValue) -> None:
        if record.lease:
            keys = self.lease_keys.get(record.lease)
            if keys is not None:
                keys.discard(record.key)

    def finish(self) -> None:
        """End a command: its changes become one revision (none if it changed nothing)."""
        if not self.pending:
            return
        self.revision += 1
        self.history.extend(self.pending)
        end = self.history_offset + self.history_bytes
        for event in self.pending:
            end += event_bytes(event)
            self.history_ends.append(end)
        self.history_bytes += self.pending_bytes
        self.pending = []
        self.pending_bytes = 0
        if (
            len(self.history) > self.history_events_max
            or self.history_bytes > self.history_bytes_max
        ):
            self.trim_history()

    def trim_history(self) -> None:
        # Down to seven eighths of both bounds, whole revisions at a time, so the trimming
        # (a list shift) happens once per many commands, not on every one.
        events_target = self.history_events_max - self.history_events_max // 8
        bytes_target = self.history_bytes_max - self.history_bytes_max // 8
        history = self.history
        ends = self.history_ends
        count = len(history)
        cut = max(count - events_target, 0)
        # Past the events' cut, as few more events as bring the bytes to the target: the
        # first whose end reaches it is the last one cut.
        bytes_end = self.history_offset + self.history_bytes - bytes_target
        if cut < count and bytes_end > (ends[cut - 1] if cut else self.history_offset):
            cut = bisect.bisect_left(ends, bytes_end, lo=cut) + 1
        if cut == 0:
            return
        revision = history[cut - 1].kv.mod_revision
        # Whole revisions: the rest of the last one cut goes too.
        while cut < count and history[cut].kv.mod_revision == revision:
            cut += 1
        self.drop_history(cut)
        self.compacted_revision = max(self.compacted_revision, revision)

    def drop_history(self, cut: int) -> None:
        """Drop the oldest `cut` events (at least one)."""
        require(
            len(self.history_ends) == len(self.history),
            f"{len(self.history_ends)} history ends for {len(self.history)} events",
        )
        dropped_end = self.history_ends[cut - 1]
        del self.history[:cut]
        del self.history_ends[:cut]
        self.history_bytes -= dropped_end - self.history_offset
        self.history_offset = dropped_end

    def compact_history(self, revision: int) -> None:
        cut = bisect.bisect_right(self.history, revision, key=event_revision)
        if cut:
            self.drop_history(cut)
        self.compacted_revision = max(self.compacted_revision, revision)

    # --- reads -------------------------------------------------------------------------

    @property
    def sorted_keys(self) -> list[str]:
        """Every key, in order (brought up to date with the puts and deletes since the last
        read that asked: one merge for all of them)."""
        if self.keys_removed:
            removed = self.keys_removed
            self.ordered_keys = [key for key in self.ordered_keys if key not in removed]
            self.keys_removed = set()
        if self.keys_added:
            self.ordered_keys = list(heapq.merge(self.ordered_keys, sorted(self.keys_added)))
            self.keys_added = set()
        return self.ordered_keys

    def keys_in(self, key: str, end: str | None) -> list[str]:
        if end is None:
            return [key] if key in self.records else []
        ordered = self.sorted_keys
        low = bisect.bisect_left(ordered, key)
        if end == RANGE_END_ALL:
            return ordered[low:]
        return ordered[low : bisect.bisect_left(ordered, end, lo=low)]

    def range(
        self, key: str, end: str | None, limit: int = 0, revision: int = 0
    ) -> tuple[list[KeyValue], int]:
        """The keys in range at `revision` (0: now) in key order, at most `limit` (0: all),
        and how many there are in all. StoreFailure below the compacted revision."""
        if revision <= 0 or revision >= self.revision:
            if revision > self.revision:
                raise StoreFailure(
                    "future_revision", f"revision {revision} is past {self.revision}"
                )
            keys = self.keys_in(key, end)
            chosen = keys[:limit] if limit > 0 else keys
            return [self.records[name] for name in chosen], len(keys)
        view = self.view_at(key, end, revision)
        keys = sorted(view)
        chosen = keys[:limit] if limit > 0 else keys
        return [view[name] for name in chosen], len(keys)

    def view_at(self, key: str, end: str | None, revision: int) -> dict[str, KeyValue]:
        """The keys in range as they were at `revision`: the current ones with every later
        change undone, newest first."""
        if revision < self.compacted_revision:
            raise StoreFailure(
                "compacted",
                f"revision {revision} was compacted (compacted to {self.compacted_revision})",
            )
        view = {name: self.records[name] for name in self.keys_in(key, end)}
        start = bisect.bisect_right(self.history, revision, key=event_revision)
        for event in reversed(self.history[start:]):
            name = event.kv.key
            if not in_range(name, key, end):
                continue
            if event.prev_kv is None:
                view.pop(name, None)
            else:
                view[name] = event.prev_kv
        return view

    def events_since(
        self, from_revision: int, key: str, end: str | None, events_max: int
    ) -> list[WatchEvent]:
        """Events of keys in range from `from_revision` on, whole revisions only, about
        `events_max` (a revision is never split). StoreFailure if that was compacted."""
        if from_revision <= self.compacted_revision and self.compacted_revision > 0:
            raise StoreFailure(
                "compacted",
                f"revision {from_revision} was compacted (compacted to {self.compacted_revision})",
            )
        start = bisect.bisect_left(self.history, from_revision, key=event_revision)
        events: list[WatchEvent] = []
        for event in self.history[start:]:
            if len(events) >= events_max and event.kv.mod_revision != events[-1].kv.mod_revision:
                break
            if in_range(event.kv.key, key, end):
                events.append(event)
        return events

    # --- txn -----------------------------------------------------------------------------

    def txn(self, command: Txn) -> TxnResponse:
        """Compare, then run one branch; its writes are one revision. StoreFailure (and
        nothing changed) if a put names a lease that does not exist."""
        succeeded = all(self.compare(compare) for compare in command.compares)
        operations = command.success if succeeded else command.failure
        for operation in operations:
            if operation.kind == "put" and operation.lease and operation.lease not in self.leases:
                raise StoreFailure("lease_not_found", f"lease {operation.lease} not found")
            if operation.kind not in ("put", "delete", "get"):
                raise StoreFailure("bad_request", f"unknown txn operation {operation.kind!r}")
        responses = [self.run(operation) for operation in operations]
        self.finish()
        return TxnResponse(succeeded=succeeded, responses=responses, revision=self.revision)

    def compare(self, compare: Compare) -> bool:
        record = self.records.get(compare.key)
        operand = compare.operand
        if compare.target == "value":
            if record is None or not isinstance(operand, bytes):
                return False  # etcd: a value compare with a missing key is false
            return compare_values(record.value, compare.operator, operand)
        if not isinstance(operand, int):
            return False
        if compare.target == "version":
            found = record.version if record else 0
        elif compare.target == "create":
            found = record.create_revision if record else 0
        elif compare.target == "mod":
            found = record.mod_revision if record else 0
        else:
            return False
        return compare_values(found, compare.operator, operand)

    def run(self, operation: RequestOp) -> ResponseOp:
        if operation.kind == "put":
            previous = self.put(operation.key, operation.value, operation.lease)
            prev_kvs = [previous] if operation.prev_kv and previous is not None else []
            return ResponseOp(kind="put", prev_kvs=prev_kvs)
        if operation.kind == "delete":
            deleted = [self.delete(name) for name in self.keys_in(operation.key, operation.end)]
            return ResponseOp(
                kind="delete",
                deleted=len(deleted),
                prev_kvs=[kv for kv in deleted if kv is not None] if operation.prev_kv else [],
            )
        kvs, count = self.range(operation.key, operation.end, operation.limit)
        if operation.keys_only:
            kvs = [msgspec.structs.replace(kv, value=b"") for kv in kvs]
        return ResponseOp(kind="get", kvs=kvs, count=count, more=count > len(kvs))

    # --- leases --------------------------------------------------------------------------

    def lease_grant(self, ttl_seconds: int, clock_ms: int) -> Lease:
        if not 0 < ttl_seconds <= LEASE_TTL_SECONDS_MAX:
            raise StoreFailure("bad_request", f"lease TTL {ttl_seconds} s is out of range")
        lease = Lease(self.next_lease_id, ttl_seconds, clock_ms + ttl_seconds * 1000)
        self.next_lease_id += 1
        self.leases[lease.lease_id] = lease
        self.lease_keys[lease.lease_id] = set()
        return lease

    def lease_keepalive(self, lease_id: int, clock_ms: int) -> Lease:
        lease = self.leases.get(lease_id)
        if lease is None:
            raise StoreFailure("lease_not_found", f"lease {lease_id} not found")
        renewed = Lease(lease_id, lease.ttl_seconds, clock_ms + lease.ttl_seconds * 1000)
        self.leases[lease_id] = renewed
        return renewed

    def lease_revoke(self, lease_id: int) -> None:
        """Drop the lease and delete its keys, in key order, as one revision."""
        if lease_id not in self.leases:
            raise StoreFailure("lease_not_found", f"lease {lease_id} not found")
        for key in sorted(self.lease_keys.pop(lease_id, set())):
            self.delete(key)
        del self.leases[lease_id]
        self.finish()

    def expire(self, lease_ids: list[int], clock_ms: int) -> int:
        """Revoke the leases the leader found expired that still are by the log's clock
        (a keepalive applied since the leader looked keeps its lease); how many."""
        expired = 0
        for lease_id in lease_ids:
            lease = self.leases.get(lease_id)
            if lease is not None and lease.expiry_ms <= clock_ms:
                self.lease_revoke(lease_id)
                expired += 1
        return expired

    # --- compaction ---------------------------------------------------------------------

    def compact(self, revision: int) -> None:
        if revision <= self.compacted_revision:
            raise StoreFailure(
                "compacted",
                f"revision {revision} was compacted (compacted to {self.compacted_revision})",
            )
        if revision > self.revision:
            raise StoreFailure("future_revision", f"revision {revision} is past {self.revision}")
        self.compact_history(revision)

    # --- whole-state ---------------------------------------------------------------------

    def load(
        self,
        records: list[KeyValue],
        revision: int,
        compacted_revision: int,
        history: list[WatchEvent],
        leases: list[Lease],
        next_lease_id: int,
    ) -> None:
        self.records = {record.key: record for record in records}
        self.ordered_keys = sorted(self.records)
        self.keys_added = set()
        self.keys_removed = set()
        self.revision = revision
        self.compacted_revision = compacted_revision
        self.history = list(history)
        self.history_ends = array("q", itertools.accumulate(map(event_bytes, history)))
        self.history_offset = 0
        self.history_bytes = self.history_ends[-1] if history else 0
        self.leases = {lease.lease_id: lease for lease in leases}
        self.lease_keys = {lease.lease_id: set() for lease in leases}
        for record in records:
            if record.lease in self.lease_keys:
                self.lease_keys[record.lease].add(record.key)
        self.next_lease_id = next_lease_id
        self.pending = []
        self.pending_bytes = 0


def event_bytes(event: WatchEvent) -> int:
    """What one event counts for against `history_bytes_max` (as `put`/`delete` count it)."""
    return len(event.kv.key) + len(event.kv.value) + EVENT_OVERHEAD_BYTES


def history_for_snapshot(history: list[WatchEvent]) -> tuple[list[WatchEvent], list[KeyValue]]:
    """The history without each event's key-before (a snapshot would otherwise hold every
    value twice), and the keys as they were before their first event (`relink_history`
    puts the keys-before back from these)."""
    base: list[KeyValue] = []
    seen: set[str] = set()
    bare: list[WatchEvent] = []
    for event in history:
        if event.kv.key not in seen:
            seen.add(event.kv.key)
            if event.prev_kv is not None:
                base.append(event.prev_kv)
        bare.append(WatchEvent(event.type, event.kv) if event.prev_kv else event)
    return bare, base


def relink_history(bare: list[WatchEvent], base: list[KeyValue]) -> list[WatchEvent]:
    """The history with each event's key-before restored (see `history_for_snapshot`)."""
    latest: dict[str, KeyValue | None] = {kv.key: kv for kv in base}
    history: list[WatchEvent] = []
    for event in bare:
        key = event.kv.key
        previous = latest.get(key)
        history.append(WatchEvent(event.type, event.kv, previous))
        latest[key] = event.kv if event.type == "PUT" else None
    return history


def event_revision(event: WatchEvent) -> int:
    """The sort key of history (bisect compares a revision with events by it)."""
    return event.kv.mod_revision


def compare_values(found: bytes | int, operator: str, operand: bytes | int) -> bool:
    if operator == "==":
        return found == operand
    if operator == "!=":
        return found != operand
    if operator == "<":
        return found < operand  # type: ignore[operator]
    if operator == ">":
        return found > operand  # type: ignore[operator]
    return False


__all__ = [
    "HISTORY_EVENTS_MAX_DEFAULT",
    "Lease",
    "MVCCStore",
    "StoreFailure",
    "TextView",
    "history_for_snapshot",
    "relink_history",
    "text",
]
