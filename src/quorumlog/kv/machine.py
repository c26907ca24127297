"""The replicated KV state machine: keys to values, plus the client sessions that dedup.

The node applies each committed KV log entry with `apply`; every replica that applies the
same entries in the same order ends in the same state and returns the same results. The
machine is total: a well-formed entry never makes it raise (a command it cannot carry out
gets `ok=False`); bytes that do not decode as an entry are corruption and raise
`MalformedEntryError`, because the log only ever holds what a leader encoded.

A batch from a client whose session the machine no longer has (expired or evicted) is
refused, not run: each of its commands gets `SESSION_EXPIRED_RESULT` (see `kv.sessions`
for how a new client is told from such a one; the plain KV uses the `FIRST_SEQUENCE` rule).

Values are bytes in a multi-version store (`kv.mvcc`: revisions, leases, the history
kept for watches); the plain text commands (put, append, delete, cas) are thin layers over
it (text in as UTF-8; `get`/`read`/`data` show values as text, `get_bytes` as stored).
Internal users (streams' metadata, auth's `__auth/` keys) keep reading text through `get`.

Snapshots are msgspec MessagePack of the whole state — keys sorted, sessions in activity
order — so the same state always gives the same bytes (replicas can compare checksums).
Format 3 carries revisions, leases and the history. Formats 1 (no dropped sessions) and 2
(text values) are still read: values become their UTF-8 bytes, and revisions are made up
from the snapshot alone, so every replica makes up the same ones: the keys in key order get
revisions 1, 2, ... as their create and mod revision, version 1, no lease; the store's
revision is the key count, and history starts there (compacted to it). A build that knows
none of these refuses the snapshot, naming the formats.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TypeVar

import msgspec

from quorumlog.auth.commands import AUTH_KEYS, AUTH_OP, apply_auth
from quorumlog.codec import kv_v3, wire
from quorumlog.codec.kv_v3 import V3_OP, KeyValue, WatchEvent
from quorumlog.codec.wire import KVCommand, KVCommandResult
from quorumlog.errors import QuorumLogError
from quorumlog.kv.commands import KVEntry, decode_entry
from quorumlog.kv.mvcc import (
    HISTORY_BYTES_MAX_DEFAULT,
    HISTORY_EVENTS_MAX_DEFAULT,
    Lease,
    MVCCStore,
    StoreFailure,
    TextView,
    history_for_snapshot,
    relink_history,
    text,
)
from quorumlog.kv.sessions import (
    EXPIRED_COUNT_MAX_DEFAULT,
    EXPIRED_TTL_MS_DEFAULT,
    SESSION_COUNT_MAX_DEFAULT,
    SESSION_EXPIRED_RESULT,
    SESSION_RESULTS_MAX_DEFAULT,
    SESSION_TTL_MS_DEFAULT,
    NewClientRule,
    Session,
    SessionRecord,
    SessionTable,
    lookup_duplicate,
)
from quorumlog.raft.invariants import require

SNAPSHOT_FORMAT_VERSION = 3
"""The format `snapshot` writes."""
SNAPSHOT_FORMAT_VERSIONS_READ = frozenset({1, 2, SNAPSHOT_FORMAT_VERSION})
"""1: before dropped sessions were recorded; its records read as live sessions, which is
what they are. 2: text values, no revisions (`KVSnapshot`)."""

REJECTED_RESULT = KVCommandResult(ok=False, value=None)
OK_RESULT = KVCommandResult(ok=True, value=None)
"""What put and append answer: no old value, so replies and session results stay small
(an appended key's old value can be large). delete and cas still say what they found."""
"""A command the machine cannot carry out (unknown op, missing value): nothing changes."""


class MalformedEntryError(QuorumLogError, ValueError):
    """A log entry or snapshot whose bytes do not decode: corruption, never client input."""


DecodedEntry = TypeVar("DecodedEntry")


def decode_log_entry(
    decode: Callable[[bytes], DecodedEntry], data: bytes, index: int, what: str
) -> DecodedEntry:
    """Decode the log entry at `index` for a state machine; MalformedEntryError if it does
    not decode (the log only ever holds what a leader encoded, so this is corruption)."""
    try:
        return decode(data)
    except wire.DECODE_ERRORS as error:
        raise MalformedEntryError(
            f"{what} log entry {index} ({len(data)} bytes) does not decode: {error}"
        ) from error


class KVSnapshot(msgspec.Struct, frozen=True, array_like=True):
    format_version: int
    applied_index: int
    clock_ms: int
    data: dict[str, str]
    sessions: list[SessionRecord]


class KVSnapshotV3(msgspec.Struct, frozen=True, array_like=True):
    format_version: int
    applied_index: int
    clock_ms: int
    sessions: list[SessionRecord]
    revision: int
    compacted_revision: int
    kvs: list[KeyValue]
    """In key order."""
    history: list[WatchEvent]
    """Without each event's key-before (`kv.mvcc.history_for_snapshot`)."""
    history_base: list[KeyValue]
    """Each key in the history as it was before its first event there (if it existed)."""
    leases: list[Lease]
    """In id order."""
    next_lease_id: int


class SnapshotFormat(msgspec.Struct, frozen=True, array_like=True):
    """Every format starts with its number (the rest of the array is skipped here)."""

    format_version: int


_snapshot_encoder = msgspec.msgpack.Encoder()
_format_decoder = msgspec.msgpack.Decoder(SnapshotFormat)
_snapshot_decoder = msgspec.msgpack.Decoder(KVSnapshot)
_snapshot_v3_decoder = msgspec.msgpack.Decoder(KVSnapshotV3)


class KVStateMachine:
    """Keys and values, client sessions, and the index of the last entry applied."""

    def __init__(
        self,
        session_ttl_ms: int = SESSION_TTL_MS_DEFAULT,
        session_count_max: int = SESSION_COUNT_MAX_DEFAULT,
        session_results_max: int = SESSION_RESULTS_MAX_DEFAULT,
        expired_ttl_ms: int = EXPIRED_TTL_MS_DEFAULT,
        expired_count_max: int = EXPIRED_COUNT_MAX_DEFAULT,
        history_events_max: int = HISTORY_EVENTS_MAX_DEFAULT,
        history_bytes_max: int = HISTORY_BYTES_MAX_DEFAULT,
    ) -> None:
        self.store = MVCCStore(history_events_max, history_bytes_max)
        self.revision_listeners: list[Callable[[], None]] = []
        """Called after an entry that changed the store's revision or its leases (the
        service wakes its watches and lease timer; they must not change the machine)."""
        self.sessions = SessionTable(
            session_ttl_ms,
            session_count_max,
            session_results_max,
            NewClientRule.FIRST_SEQUENCE,
            expired_ttl_ms,
            expired_count_max,
        )
        self._applied_index = 0
        self.duplicate_count = 0
        self.session_expired_count = 0
        """Commands refused because their client's session was gone."""
        self.auth_generation = 0
        """Counts changes of the auth state (auth commands applied, snapshots restored):
        readers of it (`quorumlog.auth.state`) decode it again when this moves."""
        self.auth_changed: Callable[[], None] | None = None
        """Called after each change of the auth state (the node's auth guard listens)."""

    # --- reads --------------------------------------------------------------------------

    @property
    def applied_index(self) -> int:
        return self._applied_index

    @property
    def key_count(self) -> int:
        return len(self.store.records)

    @property
    def data(self) -> TextView:
        """Keys and their values as text (read-only)."""
        return TextView(self.store.records)

    @property
    def revision(self) -> int:
        return self.store.revision

    @property
    def session_count(self) -> int:
        return len(self.sessions)

    def get(self, key: str) -> str | None:
        """The value of `key` as text (for internal keys and the plain text API)."""
        record = self.store.records.get(key)
        return None if record is None else text(record.value)

    def get_bytes(self, key: str) -> bytes | None:
        """The value of `key` as stored."""
        record = self.store.records.get(key)
        return None if record is None else record.value

    def read(self, keys: list[str]) -> list[str | None]:
        return [self.get(key) for key in keys]

    # --- apply --------------------------------------------------------------------------

    def apply(self, index: int, data: bytes) -> list[list[KVCommandResult]]:
        """Apply the KV entry at `index`; one result list per client batch, in order.

        An index at or below `applied_index` is already in the state (a snapshot covering
        it was restored): it is skipped and gets no results.
        """
        if index <= self._applied_index:
            return []
        entry = decode_log_entry(decode_entry, data, index, "KV")
        results = self.apply_entry(entry)
        self._applied_index = index
        return results

    def mark_applied(self, index: int) -> None:
        """Record an entry that carries no KV commands (leader no-op, configuration)."""
        if index > self._applied_index:
            self._applied_index = index

    def apply_entry(self, entry: KVEntry) -> list[list[KVCommandResult]]:
        sessions = self.sessions
        sessions.advance_clock(entry.timestamp_ms)
        require(not self.store.pending, "a KV entry applied with a command left unfinished")
        revision = self.store.revision
        lease_count = len(self.store.leases)
        all_results: list[list[KVCommandResult]] = []
        for batch in entry.batches:
            if not sessions.admits(batch.client_id, batch.first_unacknowledged):
                self.session_expired_count += len(batch.commands)
                all_results.append([SESSION_EXPIRED_RESULT] * len(batch.commands))
                continue
            session = sessions.touch(batch.client_id, batch.first_unacknowledged)
            all_results.append(self.apply_batch(session, batch.commands))
        if entry.expired_leases:
            self.store.expire(entry.expired_leases, sessions.clock_ms)
        if self.store.revision != revision or len(self.store.leases) != lease_count:
            for listener in self.revision_listeners:
                listener()
        return all_results

    def apply_batch(self, session: Session, commands: list[KVCommand]) -> list[KVCommandResult]:
        """One client batch, each command at most once: a duplicate gets its stored answer."""
        puts = fresh_puts(session, commands, self.sessions.session_results_max)
        if puts is not None:
            # The common batch, applied per batch: see `fresh_puts`.
            sequences, keys, values = puts
            self.store.put_commands(keys, values)
            session.results.update(zip(sequences, itertools.repeat(OK_RESULT)))
            return [OK_RESULT] * len(commands)
        sessions = self.sessions
        batch_results: list[KVCommandResult] = []
        for command in commands:
            result = lookup_duplicate(session, command.sequence)
            if result is None:
                result = self.execute(command)
                sessions.remember(session, command.sequence, result)
            else:
                self.duplicate_count += 1
            batch_results.append(result)
        return batch_results

    def execute(self, command: KVCommand) -> KVCommandResult:
        """Carry out one command that is not a duplicate."""
        if command.op == AUTH_OP:
            # Users, roles and the auth switch (quorumlog.auth): only nodes build these.
            self.auth_generation += 1
            result = execute_auth(self.store, command)
            if self.auth_changed is not None:
                self.auth_changed()
            return result
        if command.op == V3_OP:
            return execute_v3(self.store, command, self.sessions.clock_ms)
        result = execute_text_write(self.store, command)
        self.store.finish()
        return result

    # --- snapshots ----------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The whole state (data, sessions, applied index) as deterministic bytes."""
        store = self.store
        history, history_base = history_for_snapshot(store.history)
        snapshot = KVSnapshotV3(
            format_version=SNAPSHOT_FORMAT_VERSION,
            applied_index=self._applied_index,
            clock_ms=self.sessions.clock_ms,
            sessions=self.sessions.to_records(),
            revision=store.revision,
            compacted_revision=store.compacted_revision,
            kvs=[store.records[key] for key in store.sorted_keys],
            history=history,
            history_base=history_base,
            leases=[store.leases[lease_id] for lease_id in sorted(store.leases)],
            next_lease_id=store.next_lease_id,
        )
        return _snapshot_encoder.encode(snapshot)

    def restore(self, data: bytes) -> None:
        """Replace the whole state with a snapshot's; the state is unchanged if it fails."""
        snapshot = decode_snapshot(data)
        current = self.sessions
        restored = SessionTable(
            current.session_ttl_ms,
            current.session_count_max,
            current.session_results_max,
            current.new_client_rule,
            current.expired_ttl_ms,
            current.expired_count_max,
        )
        try:
            restored.load_records(snapshot.clock_ms, snapshot.sessions)
        except ValueError as error:
            raise MalformedEntryError(f"KV snapshot: {error}") from error
        store = MVCCStore(self.store.history_events_max, self.store.history_bytes_max)
        store.load(
            snapshot.kvs,
            snapshot.revision,
            snapshot.compacted_revision,
            relink_history(snapshot.history, snapshot.history_base),
            snapshot.leases,
            snapshot.next_lease_id,
        )
        self.sessions = restored
        self.store = store
        self._applied_index = snapshot.applied_index
        self.auth_generation += 1
        if self.auth_changed is not None:
            self.auth_changed()
        for listener in self.revision_listeners:
            listener()


__all__ = ["KVSnapshot", "KVSnapshotV3", "KVStateMachine", "MalformedEntryError"]


def decode_snapshot(data: bytes) -> KVSnapshotV3:
    """A snapshot of any format read, as format 3 (see the module docstring)."""
    try:
        format_version = _format_decoder.decode(data).format_version
        if format_version == SNAPSHOT_FORMAT_VERSION:
            snapshot: KVSnapshotV3 = _snapshot_v3_decoder.decode(data)
            return snapshot
        if format_version in SNAPSHOT_FORMAT_VERSIONS_READ:
            return upgrade_snapshot(_snapshot_decoder.decode(data))
    except wire.DECODE_ERRORS as error:
        raise MalformedEntryError(
            f"KV snapshot ({len(data)} bytes) does not decode: {error}"
        ) from error
    raise MalformedEntryError(
        f"KV snapshot format {format_version}; this build reads formats "
        f"{sorted(SNAPSHOT_FORMAT_VERSIONS_READ)}"
    )


def upgrade_snapshot(snapshot: KVSnapshot) -> KVSnapshotV3:
    """A format 1 or 2 snapshot as format 3, revisions made up from it alone."""
    kvs = [
        KeyValue(key, value.encode(), revision, revision, 1, 0)
        for revision, (key, value) in enumerate(sorted(snapshot.data.items()), start=1)
    ]
    return KVSnapshotV3(
        format_version=SNAPSHOT_FORMAT_VERSION,
        applied_index=snapshot.applied_index,
        clock_ms=snapshot.clock_ms,
        sessions=snapshot.sessions,
        revision=len(kvs),
        compacted_revision=len(kvs),
        kvs=kvs,
        history=[],
        history_base=[],
        leases=[],
        next_lease_id=1,
    )


def fresh_puts(
    session: Session, commands: list[KVCommand], session_results_max: int
) -> tuple[list[int], list[str], list[bytes]] | None:
    """The sequences, keys and values (as bytes) of a batch that is only plain puts, none
    of them a duplicate, whose answers fit in the session without dropping any; None for
    any other batch (it is applied command by command).

    Such a batch is what a client sends most: consecutive new sequences, all "put". For
    it, command by command would do for each exactly what one `put_commands` and one
    update of the session's results do for all (every put its own revision, each answer
    OK_RESULT, remembered in order, nothing dropped), so it is applied that way: the
    checks here are per-batch list work, cheaper than a put's share of the calls."""
    count = len(commands)
    results = session.results
    if not commands or len(results) + count > session_results_max:
        return None
    sequences = [command.sequence for command in commands]
    first = sequences[0]
    # Consecutive and from first_unacknowledged on: none repeats another or is answered
    # as forgotten; and none has a stored answer.
    if first < session.first_unacknowledged or sequences != list(range(first, first + count)):
        return None
    if not results.keys().isdisjoint(sequences):
        return None
    texts = [command.value for command in commands if command.op == "put"]
    if len(texts) != count or None in texts:
        return None
    keys = [command.key for command in commands]
    return sequences, keys, [text.encode() for text in texts]  # type: ignore[union-attr]


def execute_auth(store: MVCCStore, command: KVCommand) -> KVCommandResult:
    """One auth command over the store: applied to the auth keys' text, and what changed
    written back as one revision (a refused command changes nothing)."""
    records = store.records
    before = {key: text(records[key].value) for key in AUTH_KEYS if key in records}
    data = dict(before)
    result = apply_auth(data, command)
    if result.ok:
        for key in AUTH_KEYS:
            value = data.get(key)
            if value is not None and value != before.get(key):
                store.put(key, value.encode())
        store.finish()
    return result


def execute_text_write(store: MVCCStore, command: KVCommand) -> KVCommandResult:
    """The plain text commands over the multi-version store, answering as `execute_write`
    answers over a dict (the shard groups' rules), so both KVs behave alike."""
    key = command.key
    operation = command.op
    if operation in ("put", "append"):
        if command.value is None:
            return REJECTED_RESULT
        value = command.value.encode()
        previous = store.records.get(key)
        if operation == "append" and previous is not None:
            value = previous.value + value
        store.put(key, value)
        return OK_RESULT
    if operation == "delete":
        deleted = store.delete(key)
        return KVCommandResult(ok=True, value=None if deleted is None else text(deleted.value))
    if operation == "cas":
        record = store.records.get(key)
        current = None if record is None else text(record.value)
        if current != command.expected:
            return KVCommandResult(ok=False, value=current)
        # A new value of None deletes: "cas to missing".
        if command.value is None:
            store.delete(key)
        else:
            store.put(key, command.value.encode())
        return KVCommandResult(ok=True, value=current)
    return REJECTED_RESULT


def execute_v3(store: MVCCStore, command: KVCommand, clock_ms: int) -> KVCommandResult:
    """One v3 command; its answer (or its refusal, `V3Failure`) rides in `payload`."""
    if command.payload is None:
        return REJECTED_RESULT
    try:
        v3_command = kv_v3.decode_command(command.payload)
    except wire.DECODE_ERRORS:
        # The service checks payloads before proposing; an older build's leader may not.
        return REJECTED_RESULT
    response: kv_v3.V3Response
    try:
        if isinstance(v3_command, kv_v3.Txn):
            response = store.txn(v3_command)
        elif isinstance(v3_command, kv_v3.LeaseGrant):
            lease = store.lease_grant(v3_command.ttl_seconds, clock_ms)
            response = kv_v3.LeaseResponse(lease.lease_id, lease.ttl_seconds, store.revision)
        elif isinstance(v3_command, kv_v3.LeaseKeepAlive):
            lease = store.lease_keepalive(v3_command.lease_id, clock_ms)
            response = kv_v3.LeaseResponse(lease.lease_id, lease.ttl_seconds, store.revision)
        elif isinstance(v3_command, kv_v3.LeaseRevoke):
            store.lease_revoke(v3_command.lease_id)
            response = kv_v3.LeaseResponse(v3_command.lease_id, 0, store.revision)
        else:
            store.compact(v3_command.revision)
            response = kv_v3.CompactResponse(store.revision)
    except StoreFailure as failure:
        response = failure.failure
    return KVCommandResult(ok=True, value=None, payload=kv_v3.encode_response(response))


def execute_write(data: dict[str, str], command: KVCommand) -> KVCommandResult:
    """Carry out one write that is not a duplicate on `data`: the rules every replicated KV
    (the plain KV group, each shard of a shard group) applies the same way."""
    key = command.key
    operation = command.op
    if operation == "put":
        if command.value is None:
            return REJECTED_RESULT
        data[key] = command.value
        return OK_RESULT
    if operation == "append":
        if command.value is None:
            return REJECTED_RESULT
        previous = data.get(key)
        data[key] = command.value if previous is None else previous + command.value
        return OK_RESULT
    if operation == "delete":
        return KVCommandResult(ok=True, value=data.pop(key, None))
    if operation == "cas":
        current = data.get(key)
        if current != command.expected:
            return KVCommandResult(ok=False, value=current)
        # A new value of None deletes: "cas to missing".
        if command.value is None:
            data.pop(key, None)
        else:
            data[key] = command.value
        return KVCommandResult(ok=True, value=current)
    return REJECTED_RESULT
