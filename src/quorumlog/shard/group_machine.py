"""A shard group's replicated state machine: per-shard data, dedup sessions and migration state.

Every replica of a shard group applies the group's committed log entries here, in order.
Nothing here reads a clock or does I/O (time is the leader's stamp on `ClientWrites`), so
replicas that apply the same entries hold the same state and snapshot to the same bytes.
What the leader should propose, and what to ask other groups, is `shard.group_driver`'s job.

Each shard has its own data and its own dedup sessions (`SessionTable`), so a shard moves
with exactly the sessions that can tell a retry of a write applied to it from a new write.

Shard states (the reference's names in brackets)
-------------------------------------------------

* SERVING [Serving] — the resting state. Serves reads and writes if this group owns the
  shard in the current configuration; otherwise holds nothing and waits.
* PULLING [Pulling] — owned now, owned by another group in the previous configuration; the
  data has not arrived yet. Does not serve.
* BE_PULLING [BePulling] — owned in the previous configuration, not now; the data is frozen
  (nothing writes it) until the new owner has it. Does not serve.
* GARBAGE_COLLECTING [GCing] — owned now; the data arrived, but the previous owner still
  holds its copy. Serves (as in the reference): only the clean-up is pending.

Transitions (N = the group's current configuration number; anything else is ignored)
------------------------------------------------------------------------------------

| entry                         | shard state before       | after                          |
|-------------------------------|--------------------------|--------------------------------|
| NewConfiguration N+1, all     | not owned → owned,       | SERVING, empty data            |
|   shards SERVING              |   previous owner gid 0   |                                |
|                               | not owned → owned,       | PULLING                        |
|                               |   previous owner a group |                                |
|                               | owned → owned by a group | BE_PULLING                     |
|                               | owned → gid 0            | SERVING, data dropped (*)      |
|                               | otherwise                | unchanged (keeps serving)      |
| InsertShards N                | PULLING                  | GARBAGE_COLLECTING, data and   |
|                               |                          |   sessions from the entry      |
|                               | any other                | unchanged (a replayed insert)  |
| DeleteShards N                | BE_PULLING               | SERVING, data and sessions     |
|                               |                          |   dropped (not owned)          |
|                               | GARBAGE_COLLECTING       | SERVING                        |
|                               | any other                | unchanged (a replayed delete)  |

A configuration whose number is not N + 1, or that arrives while a shard is not SERVING, is
ignored: the previous change must finish first, one configuration at a time. An insert or
delete for a configuration other than N is ignored too; a delete for an older one is
reported accepted (its work was done before this group could leave N), a newer one not.

The checks on both the configuration number and the shard's state are what make replay
safe: after a restart the driver may see a PULLING shard mid-replay and pull it again, but
by the time that second insert is applied, the first one was, and the shard is no longer
PULLING — so writes applied in between are never overwritten.

(*) When every group leaves, shards go to gid 0 and no group can pull them: their data is
dropped (the reference loses it too). The controller should refuse to remove the last group
while it matters.

Clients: a write or read for a shard this group does not own in the current configuration,
or owns but is PULLING, gets `WrongGroup` and changes nothing.

Dropped sessions: a shard's table remembers the clients whose sessions it dropped (expired
or evicted; `kv.sessions`, rule `NOT_REMEMBERED`: a client numbers its commands across all
shards, so its first write to a shard may carry any sequence). A batch from such a client,
on any shard it touches that this group serves, is refused whole: each of those commands
gets `SESSION_EXPIRED_RESULT` (the others `WrongGroup`) and nothing is applied. The records
move with the shard, in its session records (`SessionRecord.expired`), so the new owner
refuses the client too.

Revisions: each shard's keys live in a multi-version store of their own (`kv.mvcc`, as in
the plain KV), so every key carries create and mod revisions and a version, and each
shard keeps a bounded history for watches. Revisions are per shard and move with it; what
a move carries and what a watch sees across one is in `shard.shard_store`.

Snapshots: format 2 added those records; format 3 the revisions and each shard's history.
Formats 1 and 2 are still read (revisions made up from the snapshot alone).
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import msgspec

from quorumlog.codec import wire
from quorumlog.codec.kv_v3 import KeyValue, WatchEvent
from quorumlog.codec.wire import KVCommandResult
from quorumlog.kv.commands import ClientBatch
from quorumlog.kv.machine import (
    MalformedEntryError,
    decode_log_entry,
    execute_text_write,
    execute_write,
)
from quorumlog.kv.mvcc import MVCCStore, TextView, history_for_snapshot
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
from quorumlog.shard.config import (
    SHARD_COUNT_DEFAULT,
    UNASSIGNED_GID,
    ShardConfiguration,
    check_configuration,
    check_shard_count,
    empty_configuration,
    shard_for_key,
)
from quorumlog.shard.group_commands import (
    ClientWrites,
    ControlApplied,
    DeleteShards,
    EmptyEntry,
    GroupApplyResult,
    GroupEntry,
    InsertShards,
    NewConfiguration,
    PullResponse,
    PullStatus,
    WriteResult,
    WritesApplied,
    WrongGroup,
    decode_entry,
)
from quorumlog.shard.shard_store import (
    KEY_REVISIONS_BYTES,
    SHARD_HISTORY_BYTES_MAX_DEFAULT,
    SHARD_HISTORY_EVENTS_MAX_DEFAULT,
    frozen_revisions,
    history_event_bytes,
    insert_pulled,
    load_store,
    made_up_records,
    new_store,
)

SNAPSHOT_FORMAT_VERSION = 3
"""The format `snapshot` writes."""
SNAPSHOT_FORMAT_VERSIONS_READ = frozenset({1, 2, SNAPSHOT_FORMAT_VERSION})
"""1: before dropped sessions were recorded; its records read as live sessions. 2: text
values, no revisions (`GroupSnapshotV2`)."""

PULL_ITEM_OVERHEAD_BYTES = 8
"""What one key/value pair adds to a pull chunk beyond its characters (msgpack headers)."""

SESSION_SWEEP_INTERVAL_MS = 1_000
"""How often (in entry time) idle sessions of every serving shard are expired. Between
sweeps only the shards a batch touches expire theirs, so an entry costs O(shards touched)."""


class ShardState(enum.Enum):
    SERVING = "serving"
    PULLING = "pulling"
    BE_PULLING = "be_pulling"
    GARBAGE_COLLECTING = "garbage_collecting"


SERVABLE_STATES = frozenset({ShardState.SERVING, ShardState.GARBAGE_COLLECTING})


class Shard:
    """One shard's state, keys (with their revisions) and dedup sessions."""

    __slots__ = ("arrived_revision", "sessions", "state", "store")

    def __init__(self, sessions: SessionTable, store: MVCCStore) -> None:
        self.state = ShardState.SERVING
        self.store = store
        self.sessions = sessions
        self.arrived_revision = 0
        """The shard's revision when it arrived from another group (0: it never did):
        its history here starts after it (see `shard.shard_store`)."""

    @property
    def data(self) -> TextView:
        """The keys and their values as text (read-only; writes go through `store`)."""
        return TextView(self.store.records)


class ShardPiece:
    """What one chunk of a pull carries of one shard (see `ShardGroupMachine.shard_piece`)."""

    __slots__ = ("events", "items", "next_position", "sessions", "size", "total")

    def __init__(self, total: int) -> None:
        self.total = total
        self.items: dict[str, str] = {}
        self.sessions: list[SessionRecord] = []
        self.events: list[WatchEvent] = []
        self.size = 0
        self.next_position = 0


class ShardRecordV2(msgspec.Struct, frozen=True, array_like=True):
    """A shard in snapshot formats 1 and 2."""

    state: ShardState
    data: dict[str, str]
    """Sorted by key."""
    sessions: list[SessionRecord]


class GroupSnapshotV2(msgspec.Struct, frozen=True, array_like=True):
    format_version: int
    gid: int
    shard_count: int
    applied_index: int
    clock_ms: int
    current: ShardConfiguration
    previous: ShardConfiguration
    shards: list[ShardRecordV2]


class ShardRecord(msgspec.Struct, frozen=True, array_like=True):
    """A shard in snapshot format 3."""

    state: ShardState
    kvs: list[KeyValue]
    """In key order."""
    sessions: list[SessionRecord]
    revision: int
    compacted_revision: int
    history: list[WatchEvent]
    """Without each event's key-before (`kv.mvcc.history_for_snapshot`)."""
    history_base: list[KeyValue]
    """Each key in the history as it was before its first event there (if it existed)."""
    arrived_revision: int


class GroupSnapshot(msgspec.Struct, frozen=True, array_like=True):
    format_version: int
    gid: int
    shard_count: int
    applied_index: int
    clock_ms: int
    current: ShardConfiguration
    previous: ShardConfiguration
    shards: list[ShardRecord]


class SnapshotFormat(msgspec.Struct, frozen=True, array_like=True):
    """Every format starts with its number (the rest of the array is skipped here)."""

    format_version: int


_snapshot_encoder = msgspec.msgpack.Encoder()
_format_decoder = msgspec.msgpack.Decoder(SnapshotFormat)
_snapshot_decoder = msgspec.msgpack.Decoder(GroupSnapshot)
_snapshot_v2_decoder = msgspec.msgpack.Decoder(GroupSnapshotV2)


class ShardGroupMachine:
    """The state of shard group `gid`: every shard's state, data and sessions, and the
    current and previous configurations."""

    def __init__(
        self,
        gid: int,
        shard_count: int = SHARD_COUNT_DEFAULT,
        session_ttl_ms: int = SESSION_TTL_MS_DEFAULT,
        session_count_max: int = SESSION_COUNT_MAX_DEFAULT,
        session_results_max: int = SESSION_RESULTS_MAX_DEFAULT,
        expired_ttl_ms: int = EXPIRED_TTL_MS_DEFAULT,
        expired_count_max: int = EXPIRED_COUNT_MAX_DEFAULT,
        history_events_max: int = SHARD_HISTORY_EVENTS_MAX_DEFAULT,
        history_bytes_max: int = SHARD_HISTORY_BYTES_MAX_DEFAULT,
    ) -> None:
        """`history_events_max` and `history_bytes_max` bound each shard's history."""
        if gid <= UNASSIGNED_GID:
            raise ValueError(f"gid must be positive, got {gid}")
        check_shard_count(shard_count)
        self.gid = gid
        self.shard_count = shard_count
        self.session_ttl_ms = session_ttl_ms
        self.session_count_max = session_count_max
        self.session_results_max = session_results_max
        self.expired_ttl_ms = expired_ttl_ms
        self.expired_count_max = expired_count_max
        self.history_events_max = history_events_max
        self.history_bytes_max = history_bytes_max
        self.shards = [self.new_shard() for _ in range(shard_count)]
        self.current_configuration = empty_configuration(shard_count)
        self.previous_configuration = self.current_configuration
        """The configuration before the current one (the current one while it is 0): the
        previous owners, whom PULLING shards are pulled from and GC requests go to."""
        self.clock_ms = 0
        self._applied_index = 0
        self.duplicate_count = 0
        self.session_expired_count = 0
        """Commands refused because their client's session on the shard was gone."""
        self.frozen_cache: dict[int, tuple[list[str], list[SessionRecord], list[WatchEvent]]] = {}
        """BE_PULLING shard → its sorted keys, its sessions and its history (see
        `frozen_contents`); not part of the state."""
        self.revision_listeners: list[Callable[[], None]] = []
        """Called after each entry that may have changed a shard's revision or whether it
        is served (the service wakes its watches; they must not change the machine)."""

    def new_shard(self) -> Shard:
        return Shard(
            self.new_session_table(), new_store(self.history_events_max, self.history_bytes_max)
        )

    def new_session_table(self) -> SessionTable:
        return SessionTable(
            self.session_ttl_ms,
            self.session_count_max,
            self.session_results_max,
            NewClientRule.NOT_REMEMBERED,
            self.expired_ttl_ms,
            self.expired_count_max,
        )

    # --- reads --------------------------------------------------------------------------

    @property
    def applied_index(self) -> int:
        return self._applied_index

    def shard_for_key(self, key: str) -> int:
        return shard_for_key(key, self.shard_count)

    def shard_state(self, shard: int) -> ShardState:
        return self.shards[shard].state

    def shards_in_state(self, state: ShardState) -> list[int]:
        """The shards in `state`, ascending."""
        return [index for index, shard in enumerate(self.shards) if shard.state is state]

    def all_serving(self) -> bool:
        """True when no migration is under way: the next configuration may be applied."""
        return all(shard.state is ShardState.SERVING for shard in self.shards)

    def owns(self, shard: int) -> bool:
        return self.current_configuration.shards[shard] == self.gid

    def can_serve(self, shard: int) -> bool:
        """Owned in the current configuration and holding its data (SERVING or GC pending)."""
        return self.owns(shard) and self.shards[shard].state in SERVABLE_STATES

    def can_serve_key(self, key: str) -> bool:
        return self.can_serve(self.shard_for_key(key))

    def get(self, key: str) -> str | WrongGroup | None:
        """The value of `key` (None when missing), or WrongGroup if its shard is not served.

        Linearizable only behind a read barrier (read index) taken by the runtime.
        """
        shard = self.shard_for_key(key)
        if not self.can_serve(shard):
            return WrongGroup(shard, self.current_configuration.number)
        record = self.shards[shard].store.records.get(key)
        return None if record is None else record.value.decode("utf-8", errors="replace")

    def shard_store(self, shard: int) -> MVCCStore | WrongGroup:
        """Shard `shard`'s store, or WrongGroup if this group does not serve it now."""
        if not self.can_serve(shard):
            return WrongGroup(shard, self.current_configuration.number)
        return self.shards[shard].store

    def shard_data(self, shard: int) -> dict[str, str]:
        """A copy of one shard's keys and values, whatever its state (for tests and tools)."""
        return dict(self.shards[shard].data)

    def stored_key_count(self) -> int:
        return sum(len(shard.data) for shard in self.shards)

    def pull_request_for(
        self,
        configuration_number: int,
        shards: list[int],
        resume_at: tuple[int, int] | None = None,
        bytes_max: int = 0,
        resume_last_key: str | None = None,
    ) -> PullResponse:
        """This group's answer, as the previous owner, to a pull of `shards` for
        `configuration_number`: their data and sessions as frozen when they became
        BE_PULLING. A pure read; any replica that applied the configuration gives the same
        answer, because nothing changes a BE_PULLING shard until it is dropped.

        With `bytes_max`, the answer holds keys from `resume_at` on, in (shard, key) order,
        up to about that many bytes; a shard's sessions follow its keys (see `pull_chunk`)."""
        number = self.current_configuration.number
        if number < configuration_number:
            return PullResponse(self.gid, configuration_number, PullStatus.NOT_READY)
        ready = sorted(
            {
                shard
                for shard in shards
                if 0 <= shard < self.shard_count
                and self.shards[shard].state is ShardState.BE_PULLING
            }
        )
        if number > configuration_number or not ready:
            return PullResponse(self.gid, configuration_number, PullStatus.GONE)
        if (
            resume_at is not None
            and resume_last_key is not None
            and not self.resume_point_holds(ready, resume_at, resume_last_key)
        ):
            resume_at = None  # start over: slower, never a gap
        if resume_at is None and bytes_max <= 0:
            contents = {shard: self.frozen_contents(shard)[0] for shard in ready}
            insert = InsertShards(
                configuration_number=configuration_number,
                shards={
                    shard: {key: self.shards[shard].data[key] for key in keys}
                    for shard, keys in contents.items()
                },
                sessions={shard: self.shards[shard].sessions.to_records() for shard in ready},
                clock_ms=self.clock_ms,
                key_revisions={
                    shard: frozen_revisions(self.shards[shard].store, keys)
                    for shard, keys in contents.items()
                },
                store_revisions={shard: self.shards[shard].store.revision for shard in ready},
                history={shard: self.frozen_contents(shard)[2] for shard in ready},
                compacted_revisions={
                    shard: self.shards[shard].store.compacted_revision for shard in ready
                },
            )
            return PullResponse(self.gid, configuration_number, PullStatus.OK, insert)
        return self.pull_chunk(configuration_number, ready, resume_at or (-1, 0), bytes_max)

    def pull_chunk(
        self,
        configuration_number: int,
        ready: list[int],
        resume_at: tuple[int, int],
        bytes_max: int,
    ) -> PullResponse:
        """One chunk of a chunked pull. Each shard is a sequence of its keys (sorted), its
        dedup sessions (in activity order), then its history events (oldest first);
        `resume_at` is (shard, position in that sequence). Sessions and events count
        against `bytes_max` too: results can carry values, and a shard with many clients
        or a long history would otherwise make one chunk larger than a frame."""
        resume_shard, resume_position = resume_at
        pieces: dict[int, ShardPiece] = {}
        finished: list[int] = []
        size = 0
        next_resume: tuple[int, int] | None = None
        for shard_index in ready:
            if shard_index < resume_shard:
                continue
            position = resume_position if shard_index == resume_shard else 0
            piece = self.shard_piece(shard_index, position, bytes_max - size, bytes_max <= 0)
            pieces[shard_index] = piece
            size += piece.size
            if piece.next_position < piece.total:
                next_resume = (shard_index, piece.next_position)
                break
            finished.append(shard_index)
        insert = InsertShards(
            configuration_number=configuration_number,
            shards={index: piece.items for index, piece in pieces.items()},
            sessions={index: piece.sessions for index, piece in pieces.items() if piece.sessions},
            finished=finished,
            clock_ms=self.clock_ms,
            key_revisions={
                index: frozen_revisions(self.shards[index].store, list(piece.items))
                for index, piece in pieces.items()
            },
            store_revisions={index: self.shards[index].store.revision for index in pieces},
            history={index: piece.events for index, piece in pieces.items()},
            compacted_revisions={
                index: self.shards[index].store.compacted_revision for index in pieces
            },
        )
        return PullResponse(
            self.gid, configuration_number, PullStatus.OK, insert, resume_at=next_resume
        )

    def shard_piece(
        self, shard_index: int, position: int, bytes_left: int, unbounded: bool
    ) -> ShardPiece:
        """What of one frozen shard fits in `bytes_left`, from `position` in its sequence
        of keys, sessions and events. The first shard of a chunk has all of `bytes_max`
        left, so every chunk carries at least one item."""
        keys, records, events = self.frozen_contents(shard_index)
        data = self.shards[shard_index].data
        piece = ShardPiece(len(keys) + len(records) + len(events))
        while position < piece.total and (unbounded or piece.size < bytes_left):
            if position < len(keys):
                key = keys[position]
                value = data[key]
                piece.items[key] = value
                piece.size += len(key) + len(value) + PULL_ITEM_OVERHEAD_BYTES
                piece.size += KEY_REVISIONS_BYTES
            elif position < len(keys) + len(records):
                record = records[position - len(keys)]
                piece.sessions.append(record)
                piece.size += session_record_bytes(record)
            else:
                event = events[position - len(keys) - len(records)]
                piece.events.append(event)
                piece.size += history_event_bytes(event)
            position += 1
        piece.next_position = position
        return piece

    def resume_point_holds(
        self, ready: list[int], resume_at: tuple[int, int], last_key: str
    ) -> bool:
        """A resume point the requester worked out itself: it must be in the first shard
        still to send, within its keys, and just after the key the requester holds last
        (what it holds is then exactly the keys before it: chunks arrive in key order)."""
        shard_index, position = resume_at
        if not ready or shard_index != ready[0]:
            return False
        keys, _, _ = self.frozen_contents(shard_index)
        return 0 < position <= len(keys) and keys[position - 1] == last_key

    def frozen_contents(
        self, shard_index: int
    ) -> tuple[list[str], list[SessionRecord], list[WatchEvent]]:
        """The sorted keys, the session records and the history of a BE_PULLING shard,
        computed once: none can change until the shard is dropped, and a chunked pull
        reads them many times."""
        contents = self.frozen_cache.get(shard_index)
        if contents is None:
            shard = self.shards[shard_index]
            contents = (
                list(shard.store.sorted_keys),
                shard.sessions.to_records(),
                list(shard.store.history),
            )
            self.frozen_cache[shard_index] = contents
        return contents

    # --- apply --------------------------------------------------------------------------

    def apply(self, index: int, data: bytes) -> GroupApplyResult | None:
        """Apply the entry at `index`. An index at or below `applied_index` is already in
        the state (a restored snapshot covers it): it is skipped and returns None."""
        if index <= self._applied_index:
            return None
        entry = decode_log_entry(decode_entry, data, index, f"shard group {self.gid}")
        result = self.apply_entry(entry)
        self._applied_index = index
        return result

    def mark_applied(self, index: int) -> None:
        """Record an entry that carries nothing for the machine (Raft no-op, membership)."""
        if index > self._applied_index:
            self._applied_index = index

    def apply_entry(self, entry: GroupEntry) -> GroupApplyResult:
        result: GroupApplyResult
        if isinstance(entry, ClientWrites):
            result = self.apply_client_writes(entry)
        elif isinstance(entry, NewConfiguration):
            result = self.apply_new_configuration(entry.configuration)
        elif isinstance(entry, InsertShards):
            result = self.apply_insert_shards(entry)
        elif isinstance(entry, DeleteShards):
            result = self.apply_delete_shards(entry)
        else:
            require(isinstance(entry, EmptyEntry), f"unknown shard group entry {entry!r}")
            return ControlApplied(
                accepted=True, configuration_number=self.current_configuration.number
            )
        for listener in self.revision_listeners:
            listener()
        return result

    def apply_client_writes(self, entry: ClientWrites) -> WritesApplied:
        self.advance_clock(entry.timestamp_ms)
        return WritesApplied([self.apply_batch(batch) for batch in entry.batches])

    def apply_batch(self, batch: ClientBatch) -> list[WriteResult]:
        """One client batch. It may span shards; each shard keeps its own session for the
        client, and the batch is refused whole if any served shard dropped that session."""
        indexes = [self.shard_for_key(command.key) for command in batch.commands]
        served = {index for index in indexes if self.can_serve(index)}
        refused = False
        for index in sorted(served):
            sessions = self.shards[index].sessions
            sessions.advance_clock(self.clock_ms)
            if not sessions.admits(batch.client_id, batch.first_unacknowledged):
                refused = True
        if refused:
            self.session_expired_count += sum(1 for index in indexes if index in served)
            return [
                SESSION_EXPIRED_RESULT
                if index in served
                else WrongGroup(index, self.current_configuration.number)
                for index in indexes
            ]
        touched: dict[int, Session] = {}
        batch_results: list[WriteResult] = []
        for command, index in zip(batch.commands, indexes, strict=True):
            if index not in served:
                batch_results.append(WrongGroup(index, self.current_configuration.number))
                continue
            shard = self.shards[index]
            session = touched.get(index)
            if session is None:
                session = shard.sessions.touch(batch.client_id, batch.first_unacknowledged)
                touched[index] = session
            result = lookup_duplicate(session, command.sequence)
            if result is None:
                # The plain KV's text commands over the shard's store: one revision each.
                result = execute_text_write(shard.store, command)
                shard.store.finish()
                shard.sessions.remember(session, command.sequence, result)
            else:
                self.duplicate_count += 1
            batch_results.append(result)
        return batch_results

    def advance_clock(self, timestamp_ms: int) -> None:
        """Move entry time forward (never back) and, once per sweep interval, expire idle
        sessions of the shards being served. BE_PULLING and PULLING shards are left alone:
        their sessions must stay as frozen as their data until they move."""
        before_ms = self.clock_ms
        if timestamp_ms > before_ms:
            self.clock_ms = timestamp_ms
        if self.clock_ms // SESSION_SWEEP_INTERVAL_MS == before_ms // SESSION_SWEEP_INTERVAL_MS:
            return
        for shard in self.shards:
            if shard.state in SERVABLE_STATES:
                shard.sessions.advance_clock(self.clock_ms)

    def apply_new_configuration(self, configuration: ShardConfiguration) -> ControlApplied:
        number = self.current_configuration.number
        if configuration.number != number + 1:
            return self.refused(f"configuration {configuration.number} is not {number + 1}")
        if not self.all_serving():
            busy = [
                index
                for index, shard in enumerate(self.shards)
                if shard.state is not ShardState.SERVING
            ]
            return self.refused(f"shards {busy} are still migrating")
        if configuration.shard_count != self.shard_count:
            return self.refused(
                f"configuration {configuration.number} has {configuration.shard_count} shards, "
                f"not {self.shard_count}"
            )
        try:
            check_configuration(configuration)
        except ValueError as error:
            return self.refused(str(error))
        changed: list[int] = []
        for index, (old_owner, new_owner) in enumerate(
            zip(self.current_configuration.shards, configuration.shards, strict=True)
        ):
            if self.change_ownership(index, old_owner, new_owner):
                changed.append(index)
        self.previous_configuration = self.current_configuration
        self.current_configuration = configuration
        return ControlApplied(
            accepted=True, configuration_number=configuration.number, shards=changed
        )

    def change_ownership(self, index: int, old_owner: int, new_owner: int) -> bool:
        """Set one shard's state for a new configuration; True if it changed."""
        gid = self.gid
        shard = self.shards[index]
        if new_owner == gid and old_owner != gid:
            # Not owned and SERVING means empty: deletes and drops leave nothing behind.
            require(
                not shard.store.records and not len(shard.sessions),
                f"group {gid}: shard {index} holds data it does not own",
            )
            shard.state = ShardState.SERVING if old_owner == UNASSIGNED_GID else ShardState.PULLING
            return True
        if old_owner == gid and new_owner != gid:
            if new_owner == UNASSIGNED_GID:
                self.drop(index)  # no group will ever pull it (see the module docstring)
            else:
                shard.state = ShardState.BE_PULLING
            return True
        return False

    def apply_insert_shards(self, entry: InsertShards) -> ControlApplied:
        number = self.current_configuration.number
        if entry.configuration_number != number:
            return self.refused(
                f"insert for configuration {entry.configuration_number}, current is {number}"
            )
        # Sessions merge at this group's clock: bring it up to the sender's first (see
        # InsertShards.clock_ms).
        self.advance_clock(entry.clock_ms)
        inserted: list[int] = []
        for index in sorted(set(entry.shards) | set(entry.sessions)):
            if not 0 <= index < self.shard_count:
                continue
            shard = self.shards[index]
            if shard.state is not ShardState.PULLING:
                continue  # inserted before: overwriting would lose writes applied since
            # A chunk adds to what earlier chunks brought; a repeated chunk (a pull
            # restarted by a new leader) writes the same frozen values and merges the same
            # sessions again, which changes nothing.
            insert_pulled(
                shard.store,
                entry.shards.get(index, {}),
                None if entry.key_revisions is None else entry.key_revisions.get(index),
                None if entry.store_revisions is None else entry.store_revisions.get(index),
                None if entry.history is None else entry.history.get(index),
                None if entry.compacted_revisions is None else entry.compacted_revisions.get(index),
            )
            # Without history (an older build's insert) it stayed behind: see shard_store.
            carried = entry.history is not None and entry.key_revisions is not None
            shard.arrived_revision = 0 if carried else shard.store.revision
            merge_session_records(shard.sessions, entry.sessions.get(index, []), self.clock_ms)
            if entry.is_finished(index):
                shard.state = ShardState.GARBAGE_COLLECTING
                inserted.append(index)
        return ControlApplied(accepted=True, configuration_number=number, shards=inserted)

    def apply_delete_shards(self, entry: DeleteShards) -> ControlApplied:
        number = self.current_configuration.number
        if entry.configuration_number > number:
            return self.refused(
                f"delete for configuration {entry.configuration_number}, current is {number}"
            )
        if entry.configuration_number < number:
            # This group left that configuration, which needed every shard SERVING: the
            # delete was done then.
            return ControlApplied(accepted=True, configuration_number=number)
        deleted: list[int] = []
        for index in sorted(set(entry.shards)):
            if not 0 <= index < self.shard_count:
                continue
            shard = self.shards[index]
            if shard.state is ShardState.BE_PULLING:
                self.drop(index)
            elif shard.state is ShardState.GARBAGE_COLLECTING:
                shard.state = ShardState.SERVING
            else:
                continue
            deleted.append(index)
        return ControlApplied(accepted=True, configuration_number=number, shards=deleted)

    def drop(self, index: int) -> None:
        self.frozen_cache.pop(index, None)
        self.shards[index] = self.new_shard()

    def refused(self, reason: str) -> ControlApplied:
        return ControlApplied(
            accepted=False, configuration_number=self.current_configuration.number, reason=reason
        )

    # --- snapshots ----------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The whole state as deterministic bytes (keys sorted, sessions in activity order)."""
        snapshot = GroupSnapshot(
            format_version=SNAPSHOT_FORMAT_VERSION,
            gid=self.gid,
            shard_count=self.shard_count,
            applied_index=self._applied_index,
            clock_ms=self.clock_ms,
            current=self.current_configuration,
            previous=self.previous_configuration,
            shards=[shard_record(shard) for shard in self.shards],
        )
        return _snapshot_encoder.encode(snapshot)

    def restore(self, data: bytes) -> None:
        """Replace the whole state with a snapshot's; the state is unchanged if it fails."""
        snapshot = self.decode_snapshot(data)
        self.check_snapshot(snapshot)
        shards: list[Shard] = []
        for record in snapshot.shards:
            shard = self.new_shard()
            shard.state = record.state
            shard.arrived_revision = record.arrived_revision
            load_store(
                shard.store,
                record.kvs,
                record.revision,
                record.compacted_revision,
                record.history,
                record.history_base,
            )
            try:
                shard.sessions.load_records(snapshot.clock_ms, record.sessions)
            except ValueError as error:
                raise MalformedEntryError(f"shard group {self.gid} snapshot: {error}") from error
            shards.append(shard)
        self.shards = shards
        self.frozen_cache = {}
        self.current_configuration = snapshot.current
        self.previous_configuration = snapshot.previous
        self.clock_ms = snapshot.clock_ms
        self._applied_index = snapshot.applied_index
        for listener in self.revision_listeners:
            listener()

    def decode_snapshot(self, data: bytes) -> GroupSnapshot:
        """A snapshot of any format read, as format 3 (see the module docstring)."""
        try:
            format_version = _format_decoder.decode(data).format_version
            if format_version == SNAPSHOT_FORMAT_VERSION:
                snapshot: GroupSnapshot = _snapshot_decoder.decode(data)
                return snapshot
            if format_version in SNAPSHOT_FORMAT_VERSIONS_READ:
                return upgrade_snapshot(_snapshot_v2_decoder.decode(data))
        except wire.DECODE_ERRORS as error:
            raise MalformedEntryError(
                f"shard group {self.gid}: snapshot ({len(data)} bytes) does not decode: {error}"
            ) from error
        raise MalformedEntryError(
            f"shard group {self.gid} snapshot: format {format_version}; this build reads "
            f"formats {sorted(SNAPSHOT_FORMAT_VERSIONS_READ)}"
        )

    def check_snapshot(self, snapshot: GroupSnapshot) -> None:
        """Raise MalformedEntryError unless the snapshot fits this group and is consistent."""
        problem = snapshot_problem(snapshot, self.gid, self.shard_count)
        if problem is not None:
            raise MalformedEntryError(f"shard group {self.gid} snapshot: {problem}")


def snapshot_problem(snapshot: GroupSnapshot, gid: int, shard_count: int) -> str | None:
    if snapshot.format_version not in SNAPSHOT_FORMAT_VERSIONS_READ:
        return (
            f"format {snapshot.format_version}; this build reads formats "
            f"{sorted(SNAPSHOT_FORMAT_VERSIONS_READ)}"
        )
    if snapshot.gid != gid:
        return f"taken by group {snapshot.gid}"
    if snapshot.shard_count != shard_count or len(snapshot.shards) != shard_count:
        # Shard count is fixed for a cluster's life: keys would hash to other shards.
        return f"has {len(snapshot.shards)} shards, this machine {shard_count}"
    current, previous = snapshot.current, snapshot.previous
    for configuration in (current, previous):
        if configuration.shard_count != shard_count:
            return f"configuration {configuration.number} has {configuration.shard_count} shards"
        try:
            check_configuration(configuration)
        except ValueError as error:
            return str(error)
    # Configuration 0 is its own previous; every later one follows the one before it.
    if previous.number != max(current.number - 1, 0):
        return f"configurations {previous.number} and {current.number} do not follow each other"
    for index, record in enumerate(snapshot.shards):
        owned = current.shards[index] == gid
        if record.state in (ShardState.PULLING, ShardState.GARBAGE_COLLECTING) and not owned:
            return f"shard {index} is {record.state.value} but not owned"
        if record.state is ShardState.BE_PULLING and owned:
            return f"shard {index} is be_pulling but owned"
        if record.state is ShardState.SERVING and not owned and record.kvs:
            return f"shard {index} holds data it does not own"
        if not 0 <= record.compacted_revision <= record.revision:
            return f"shard {index} is compacted to {record.compacted_revision}, past its revision"
    return None


def shard_record(shard: Shard) -> ShardRecord:
    """One shard as a snapshot holds it (deterministic: keys in order)."""
    store = shard.store
    history, history_base = history_for_snapshot(store.history)
    return ShardRecord(
        state=shard.state,
        kvs=[store.records[key] for key in store.sorted_keys],
        sessions=shard.sessions.to_records(),
        revision=store.revision,
        compacted_revision=store.compacted_revision,
        history=history,
        history_base=history_base,
        arrived_revision=shard.arrived_revision,
    )


def upgrade_snapshot(snapshot: GroupSnapshotV2) -> GroupSnapshot:
    """A format 1 or 2 snapshot as format 3: each shard's revisions made up from it alone
    (`shard_store.made_up_records`), its history starting at its last revision."""
    shards: list[ShardRecord] = []
    for record in snapshot.shards:
        kvs = made_up_records(record.data)
        shards.append(
            ShardRecord(
                state=record.state,
                kvs=kvs,
                sessions=record.sessions,
                revision=len(kvs),
                compacted_revision=len(kvs),
                history=[],
                history_base=[],
                arrived_revision=0,
            )
        )
    return GroupSnapshot(
        format_version=SNAPSHOT_FORMAT_VERSION,
        gid=snapshot.gid,
        shard_count=snapshot.shard_count,
        applied_index=snapshot.applied_index,
        clock_ms=snapshot.clock_ms,
        current=snapshot.current,
        previous=snapshot.previous,
        shards=shards,
    )


def session_record_bytes(record: SessionRecord) -> int:
    """About what one session record adds to a pull chunk."""
    return (
        len(record.client_id) + 24 + sum(len(result.value or "") + 12 for result in record.results)
    )


def merge_session_records(table: SessionTable, records: list[SessionRecord], clock_ms: int) -> None:
    """Merge sessions that arrived with a shard into `table`, per client keeping everything
    either side knows: the higher `first_unacknowledged` and every stored result at or
    above it. A retry of any write applied on either side is then still a duplicate.

    A session either side dropped stays dropped (results gone on one side cannot be told
    apart from writes never made): its client is refused here too.

    Merged sessions count as active now (`clock_ms`, this group's entry time) and go to the
    back of the activity order: the other group's clock is not ours, and keeping the order
    sorted by activity is what makes expiry look only at the front.
    """
    table.advance_clock(clock_ms)
    sessions = table.sessions
    for record in records:
        require(
            len(record.sequences) == len(record.results),
            f"session {record.client_id!r}: sequences and results differ in length",
        )
        if record.expired:
            require(not record.sequences, f"dropped session {record.client_id!r} has results")
            sessions.pop(record.client_id, None)
            table.remember_dropped(record.client_id)
            continue
        if record.client_id in table.expired:
            continue
        existing = sessions.pop(record.client_id, None)
        first_unacknowledged = record.first_unacknowledged
        results: dict[int, KVCommandResult] = {}
        if existing is not None:
            first_unacknowledged = max(first_unacknowledged, existing.first_unacknowledged)
            results = {
                sequence: result
                for sequence, result in existing.results.items()
                if sequence >= first_unacknowledged
            }
        for sequence, result in zip(record.sequences, record.results, strict=True):
            if sequence >= first_unacknowledged:
                results.setdefault(sequence, result)
        merged = Session(
            last_active_ms=table.clock_ms,
            first_unacknowledged=first_unacknowledged,
            results=dict(sorted(results.items())),
        )
        while len(merged.results) > table.session_results_max:
            # Same rule as SessionTable.remember: forget the lowest, never apply it twice.
            lowest = next(iter(merged.results))
            del merged.results[lowest]
            merged.first_unacknowledged = max(merged.first_unacknowledged, lowest + 1)
        if len(sessions) >= table.session_count_max:
            table.evict_least_recent()
        sessions[record.client_id] = merged


__all__ = [
    "SERVABLE_STATES",
    "SESSION_SWEEP_INTERVAL_MS",
    "GroupSnapshot",
    "GroupSnapshotV2",
    "Shard",
    "ShardGroupMachine",
    "ShardRecord",
    "ShardRecordV2",
    "ShardState",
    "execute_write",
    "merge_session_records",
    "snapshot_problem",
]
