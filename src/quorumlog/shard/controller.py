"""The shard controller's state machine: the numbered history of shard configurations.

The controller is its own Raft group. Each committed controller entry is applied here with
`apply`; replicas that apply the same entries in the same order hold the same history and
return the same results, and their snapshots are the same bytes. Nothing here reads a
clock or does I/O: time is the leader's stamp on each entry.

Join, leave and move each append one configuration (number = previous + 1); join and leave
rebalance (`shard.balance`), move pins one shard where it was told until the next join or
leave. Configuration 0 is the empty one: no groups, every shard unassigned.

Writes are deduplicated by (client id, sequence) through the same `SessionTable` the KV
machine uses, so a retried join is not applied twice. A session stores KV-shaped results
(`ok`, one optional string): for a controller write that string is the error when the
command was rejected, or the decimal number of the configuration it created. Queries are
read-only and never stored: a retried query simply reads again, which is as linearizable
as the first answer would have been and keeps whole configurations out of the sessions.

A well-formed entry never makes `apply` raise (a command that cannot be carried out gets
`ok=False` and changes nothing); bytes that do not decode are corruption and raise
`MalformedEntryError`.
"""

from __future__ import annotations

import msgspec

from quorumlog.codec import wire
from quorumlog.codec.wire import KVCommandResult
from quorumlog.kv.machine import MalformedEntryError, decode_log_entry
from quorumlog.kv.sessions import (
    SESSION_COUNT_MAX_DEFAULT,
    SESSION_RESULTS_MAX_DEFAULT,
    SESSION_TTL_MS_DEFAULT,
    SessionRecord,
    SessionTable,
    apply_deduplicated,
)
from quorumlog.raft.invariants import InvariantViolation
from quorumlog.shard.balance import rebalance
from quorumlog.shard.config import (
    SHARD_COUNT_DEFAULT,
    UNASSIGNED_GID,
    ShardConfiguration,
    check_configuration,
    empty_configuration,
    make_configuration,
)
from quorumlog.shard.controller_commands import (
    ControllerCommand,
    ControllerEntry,
    ControllerResult,
    Join,
    Leave,
    Move,
    Query,
    decode_entry,
)

SNAPSHOT_FORMAT_VERSION = 1

GROUP_COUNT_MAX_DEFAULT = 4096
"""Groups one configuration may list. Every configuration copies the group table, so the
table's size bounds the cost of each join, leave and move."""

SERVERS_PER_GROUP_MAX = 64
"""Servers one group may list: a Raft group larger than this is a configuration mistake."""


class ControllerSnapshot(msgspec.Struct, frozen=True, array_like=True):
    format_version: int
    applied_index: int
    clock_ms: int
    shard_count: int
    configurations: list[ShardConfiguration]
    sessions: list[SessionRecord]


_snapshot_encoder = msgspec.msgpack.Encoder()
_snapshot_decoder = msgspec.msgpack.Decoder(ControllerSnapshot)


def rejected(error: str) -> ControllerResult:
    return ControllerResult(ok=False, error=error)


class ControllerMachine:
    """Configurations 0..latest, client sessions, and the index of the last entry applied."""

    def __init__(
        self,
        shard_count: int = SHARD_COUNT_DEFAULT,
        group_count_max: int = GROUP_COUNT_MAX_DEFAULT,
        session_ttl_ms: int = SESSION_TTL_MS_DEFAULT,
        session_count_max: int = SESSION_COUNT_MAX_DEFAULT,
        session_results_max: int = SESSION_RESULTS_MAX_DEFAULT,
    ) -> None:
        if group_count_max <= 0:
            raise ValueError(f"group_count_max must be positive, got {group_count_max}")
        self.configurations: list[ShardConfiguration] = [empty_configuration(shard_count)]
        self.group_count_max = group_count_max
        self.sessions = SessionTable(session_ttl_ms, session_count_max, session_results_max)
        self._applied_index = 0
        self.duplicate_count = 0

    # --- reads --------------------------------------------------------------------------

    @property
    def applied_index(self) -> int:
        return self._applied_index

    @property
    def shard_count(self) -> int:
        return self.configurations[0].shard_count

    @property
    def latest(self) -> ShardConfiguration:
        return self.configurations[-1]

    @property
    def session_count(self) -> int:
        return len(self.sessions)

    def query(self, number: int = -1) -> ShardConfiguration:
        """Configuration `number`; -1 or a number past the latest gives the latest."""
        if number < -1:
            raise ValueError(f"configuration number must be -1 or more, got {number}")
        if number == -1 or number >= len(self.configurations):
            return self.configurations[-1]
        return self.configurations[number]

    # --- apply --------------------------------------------------------------------------

    def apply(self, index: int, data: bytes) -> list[list[ControllerResult]]:
        """Apply the controller entry at `index`; one result list per client batch, in order.

        An index at or below `applied_index` is already in the state (a snapshot covering
        it was restored): it is skipped and gets no results.
        """
        if index <= self._applied_index:
            return []
        entry = decode_log_entry(decode_entry, data, index, "controller")
        results = self.apply_entry(entry)
        self._applied_index = index
        return results

    def mark_applied(self, index: int) -> None:
        """Record an entry that carries no controller commands (leader no-op, membership)."""
        if index > self._applied_index:
            self._applied_index = index

    def apply_entry(self, entry: ControllerEntry) -> list[list[ControllerResult]]:
        self.sessions.advance_clock(entry.timestamp_ms)
        results, duplicates = apply_deduplicated(
            self.sessions,
            entry.batches,
            self.execute,
            deduplicated_sequence,
            to_session_result,
            from_session_result,
        )
        self.duplicate_count += duplicates
        return results

    def execute(self, command: ControllerCommand) -> ControllerResult:
        """Carry out one command that is not a duplicate."""
        if isinstance(command, Join):
            return self.join(command.groups)
        if isinstance(command, Leave):
            return self.leave(command.gids)
        if isinstance(command, Move):
            return self.move(command.shard, command.gid)
        if command.number < -1:
            return rejected(f"configuration number must be -1 or more, got {command.number}")
        return ControllerResult(ok=True, configuration=self.query(command.number))

    def join(self, groups: dict[int, list[str]]) -> ControllerResult:
        latest = self.latest
        if not groups:
            return rejected("join names no group")
        if len(latest.groups) + len(groups) > self.group_count_max:
            return rejected(
                f"join would make {len(latest.groups) + len(groups)} groups; "
                f"at most {self.group_count_max}"
            )
        for gid in sorted(groups):
            error = self.check_new_group(gid, groups[gid])
            if error is not None:
                return rejected(error)
        merged = dict(latest.groups)
        merged.update(groups)
        return self.append(rebalance(latest.shards, merged), merged)

    def check_new_group(self, gid: int, servers: list[str]) -> str | None:
        if gid <= UNASSIGNED_GID:
            return f"gid must be positive, got {gid}"
        if gid in self.latest.groups:
            # Rejected rather than ignored or merged: a join that silently did nothing
            # would hide a mistake, and changing a live group's servers is its own command.
            return f"group {gid} has already joined"
        if not servers:
            return f"group {gid} has no servers"
        if len(servers) > SERVERS_PER_GROUP_MAX:
            return f"group {gid} lists {len(servers)} servers; at most {SERVERS_PER_GROUP_MAX}"
        if any(not server for server in servers):
            return f"group {gid} lists an empty server name"
        return None

    def leave(self, gids: list[int]) -> ControllerResult:
        latest = self.latest
        if not gids:
            return rejected("leave names no group")
        unknown = sorted({gid for gid in gids if gid not in latest.groups})
        if unknown:
            return rejected(f"groups {unknown} are not in configuration {latest.number}")
        leaving = set(gids)
        remaining = {gid: servers for gid, servers in latest.groups.items() if gid not in leaving}
        return self.append(rebalance(latest.shards, remaining), remaining)

    def move(self, shard: int, gid: int) -> ControllerResult:
        latest = self.latest
        if not 0 <= shard < latest.shard_count:
            return rejected(f"shard {shard} is outside 0..{latest.shard_count - 1}")
        if gid not in latest.groups:
            return rejected(f"group {gid} is not in configuration {latest.number}")
        shards = list(latest.shards)
        shards[shard] = gid
        return self.append(shards, latest.groups)

    def append(self, shards: list[int], groups: dict[int, list[str]]) -> ControllerResult:
        number = len(self.configurations)
        try:
            configuration = make_configuration(number, shards, groups)
        except ValueError as error:
            # The commands were validated above, so a malformed result is our bug: stop
            # rather than hand clients a map that routes to no group.
            raise InvariantViolation(f"controller built a bad configuration: {error}") from error
        self.configurations.append(configuration)
        return ControllerResult(ok=True, configuration_number=number)

    # --- snapshots ----------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The whole state (history, sessions, applied index) as deterministic bytes."""
        snapshot = ControllerSnapshot(
            format_version=SNAPSHOT_FORMAT_VERSION,
            applied_index=self._applied_index,
            clock_ms=self.sessions.clock_ms,
            shard_count=self.shard_count,
            configurations=self.configurations,
            sessions=self.sessions.to_records(),
        )
        return _snapshot_encoder.encode(snapshot)

    def restore(self, data: bytes) -> None:
        """Replace the whole state with a snapshot's; the state is unchanged if it fails."""
        try:
            snapshot = _snapshot_decoder.decode(data)
        except wire.DECODE_ERRORS as error:
            raise MalformedEntryError(
                f"controller snapshot ({len(data)} bytes) does not decode: {error}"
            ) from error
        if snapshot.format_version != SNAPSHOT_FORMAT_VERSION:
            raise MalformedEntryError(
                f"controller snapshot format {snapshot.format_version}; this build reads "
                f"{SNAPSHOT_FORMAT_VERSION}"
            )
        if snapshot.shard_count != self.shard_count:
            # Shard count is fixed for a cluster's life: keys would hash to other shards.
            raise MalformedEntryError(
                f"controller snapshot has {snapshot.shard_count} shards; this machine "
                f"has {self.shard_count}"
            )
        check_history(snapshot.configurations, snapshot.shard_count)
        restored = SessionTable(
            self.sessions.session_ttl_ms,
            self.sessions.session_count_max,
            self.sessions.session_results_max,
        )
        try:
            restored.load_records(snapshot.clock_ms, snapshot.sessions)
        except ValueError as error:
            raise MalformedEntryError(f"controller snapshot: {error}") from error
        self.sessions = restored
        self.configurations = snapshot.configurations
        self._applied_index = snapshot.applied_index


def check_history(configurations: list[ShardConfiguration], shard_count: int) -> None:
    """Raise MalformedEntryError unless the history is 0..n, well formed, of one shard count."""
    if not configurations:
        raise MalformedEntryError("controller snapshot holds no configuration")
    for position, configuration in enumerate(configurations):
        if configuration.number != position:
            raise MalformedEntryError(
                f"controller snapshot: configuration at {position} is numbered "
                f"{configuration.number}"
            )
        if configuration.shard_count != shard_count:
            raise MalformedEntryError(
                f"controller snapshot: configuration {position} has "
                f"{configuration.shard_count} shards, not {shard_count}"
            )
        try:
            check_configuration(configuration)
        except ValueError as error:
            raise MalformedEntryError(f"controller snapshot: {error}") from error
    if configurations[0].groups:
        raise MalformedEntryError("controller snapshot: configuration 0 is not empty")


def to_session_result(result: ControllerResult) -> KVCommandResult:
    """The KV-shaped record a session keeps for a controller write (see module docstring)."""
    if not result.ok:
        return KVCommandResult(ok=False, value=result.error)
    number = result.configuration_number
    return KVCommandResult(ok=True, value=None if number is None else str(number))


def from_session_result(stored: KVCommandResult) -> ControllerResult:
    if not stored.ok:
        return ControllerResult(ok=False, error=stored.value)
    number = None if stored.value is None else int(stored.value)
    return ControllerResult(ok=True, configuration_number=number)


__all__ = [
    "GROUP_COUNT_MAX_DEFAULT",
    "SERVERS_PER_GROUP_MAX",
    "ControllerMachine",
    "ControllerSnapshot",
    "check_history",
    "from_session_result",
    "to_session_result",
]


def deduplicated_sequence(command: ControllerCommand) -> int | None:
    """Queries are read again on a retry; every change runs once per (client, sequence)."""
    return None if isinstance(command, Query) else command.sequence
