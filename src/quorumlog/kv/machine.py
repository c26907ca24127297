"""The replicated KV state machine: keys to values, plus the client sessions that dedup.

The node applies each committed KV log entry with `apply`; every replica that applies the
same entries in the same order ends in the same state and returns the same results. The
machine is total: a well-formed entry never makes it raise (a command it cannot carry out
gets `ok=False`); bytes that do not decode as an entry are corruption and raise
`MalformedEntryError`, because the log only ever holds what a leader encoded.

A batch from a client whose session the machine no longer has (expired or evicted) is
refused, not run: each of its commands gets `SESSION_EXPIRED_RESULT` (see `kv.sessions`
for how a new client is told from such a one; the plain KV uses the `FIRST_SEQUENCE` rule).

Snapshots are msgspec MessagePack of the whole state — keys sorted, sessions in activity
order — so the same state always gives the same bytes (replicas can compare checksums).
Format 2 added the records of dropped sessions (`SessionRecord.expired`); format 1 (none)
is still read. A build that knows neither refuses the snapshot, naming both formats.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import msgspec

from quorumlog.auth.commands import AUTH_OP, apply_auth
from quorumlog.codec import wire
from quorumlog.codec.wire import KVCommand, KVCommandResult
from quorumlog.errors import QuorumLogError
from quorumlog.kv.commands import KVEntry, decode_entry
from quorumlog.kv.sessions import (
    EXPIRED_COUNT_MAX_DEFAULT,
    EXPIRED_TTL_MS_DEFAULT,
    SESSION_COUNT_MAX_DEFAULT,
    SESSION_EXPIRED_RESULT,
    SESSION_RESULTS_MAX_DEFAULT,
    SESSION_TTL_MS_DEFAULT,
    NewClientRule,
    SessionRecord,
    SessionTable,
    lookup_duplicate,
)

SNAPSHOT_FORMAT_VERSION = 2
"""The format `snapshot` writes."""
SNAPSHOT_FORMAT_VERSIONS_READ = frozenset({1, SNAPSHOT_FORMAT_VERSION})
"""1: before dropped sessions were recorded; its records read as live sessions, which is
what they are."""

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


_snapshot_encoder = msgspec.msgpack.Encoder()
_snapshot_decoder = msgspec.msgpack.Decoder(KVSnapshot)


class KVStateMachine:
    """Keys and values, client sessions, and the index of the last entry applied."""

    def __init__(
        self,
        session_ttl_ms: int = SESSION_TTL_MS_DEFAULT,
        session_count_max: int = SESSION_COUNT_MAX_DEFAULT,
        session_results_max: int = SESSION_RESULTS_MAX_DEFAULT,
        expired_ttl_ms: int = EXPIRED_TTL_MS_DEFAULT,
        expired_count_max: int = EXPIRED_COUNT_MAX_DEFAULT,
    ) -> None:
        self.data: dict[str, str] = {}
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
        return len(self.data)

    @property
    def session_count(self) -> int:
        return len(self.sessions)

    def get(self, key: str) -> str | None:
        return self.data.get(key)

    def read(self, keys: list[str]) -> list[str | None]:
        data = self.data
        return [data.get(key) for key in keys]

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
        all_results: list[list[KVCommandResult]] = []
        for batch in entry.batches:
            if not sessions.admits(batch.client_id, batch.first_unacknowledged):
                self.session_expired_count += len(batch.commands)
                all_results.append([SESSION_EXPIRED_RESULT] * len(batch.commands))
                continue
            session = sessions.touch(batch.client_id, batch.first_unacknowledged)
            batch_results: list[KVCommandResult] = []
            for command in batch.commands:
                result = lookup_duplicate(session, command.sequence)
                if result is None:
                    result = self.execute(command)
                    sessions.remember(session, command.sequence, result)
                else:
                    self.duplicate_count += 1
                batch_results.append(result)
            all_results.append(batch_results)
        return all_results

    def execute(self, command: KVCommand) -> KVCommandResult:
        """Carry out one command that is not a duplicate."""
        if command.op == AUTH_OP:
            # Users, roles and the auth switch (quorumlog.auth): only nodes build these.
            self.auth_generation += 1
            result = apply_auth(self.data, command)
            if self.auth_changed is not None:
                self.auth_changed()
            return result
        return execute_write(self.data, command)

    # --- snapshots ----------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The whole state (data, sessions, applied index) as deterministic bytes."""
        snapshot = KVSnapshot(
            format_version=SNAPSHOT_FORMAT_VERSION,
            applied_index=self._applied_index,
            clock_ms=self.sessions.clock_ms,
            data=dict(sorted(self.data.items())),
            sessions=self.sessions.to_records(),
        )
        return _snapshot_encoder.encode(snapshot)

    def restore(self, data: bytes) -> None:
        """Replace the whole state with a snapshot's; the state is unchanged if it fails."""
        try:
            snapshot = _snapshot_decoder.decode(data)
        except wire.DECODE_ERRORS as error:
            raise MalformedEntryError(
                f"KV snapshot ({len(data)} bytes) does not decode: {error}"
            ) from error
        if snapshot.format_version not in SNAPSHOT_FORMAT_VERSIONS_READ:
            raise MalformedEntryError(
                f"KV snapshot format {snapshot.format_version}; this build reads formats "
                f"{sorted(SNAPSHOT_FORMAT_VERSIONS_READ)}"
            )
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
        self.sessions = restored
        self.data = snapshot.data
        self._applied_index = snapshot.applied_index
        self.auth_generation += 1
        if self.auth_changed is not None:
            self.auth_changed()


__all__ = ["KVSnapshot", "KVStateMachine", "MalformedEntryError"]


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
