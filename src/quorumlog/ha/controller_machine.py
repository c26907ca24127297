"""The HA controller's replicated state machine (reference 003): per broker group, its
brokers, master, MasterEpoch and SyncStateSet.

Every controller replica applies the same committed entries in the same order and so holds
the same groups and returns the same results; snapshots of the same state are the same
bytes. Nothing here reads a clock or does I/O: time is the proposing leader's stamp on each
entry (`HAControllerEntry.timestamp_ms`), made monotonic, so "alive" (a heartbeat within
`broker_heartbeat_timeout_ms`) is decided identically everywhere.

The rules, after RocketMQ's ReplicasInfoManager and DefaultElectPolicy:

- A new master comes from the alive members of the SyncStateSet, the most caught-up first
  (highest epoch, then highest max offset, from their heartbeats; then the smallest id, so
  the choice is deterministic). Only a group that allows unclean election may fall back to
  any alive broker, and only when no SyncStateSet member is alive. A group that never had a
  master (empty SyncStateSet: nothing was ever acknowledged) takes any alive broker; the
  first broker to register becomes its master.
- Every election bumps MasterEpoch, which only the controller issues and which never goes
  back; a new master makes the SyncStateSet {master} under a bumped SyncStateSet epoch.
- An automatic election whose master is gone and that finds nobody to elect still bumps
  MasterEpoch and leaves the group without a master (the silent master, if it lives on
  behind a partition, is fenced: its epoch is stale); the SyncStateSet is kept, so a member
  that comes back is elected by a later check.
- AlterSyncStateSet is taken only from the current master with the current MasterEpoch and
  SyncStateSet epoch; the new set holds the master and registered brokers only, and any
  broker it adds is alive. Anything else is refused and changes nothing.

Writes other than heartbeats and automatic elections are deduplicated by (client id,
sequence) through the same `SessionTable` the KV machine uses; a session keeps each result
as its JSON text (`deduplicated_sequence` says why those two are not). A well-formed entry
never makes `apply` raise; bytes that do not decode are corruption.
"""

from __future__ import annotations

import msgspec

from quorumlog.codec import wire
from quorumlog.codec.wire import KVCommandResult
from quorumlog.ha.controller_model import (
    AlterSyncStateSet,
    BrokerGroupInfo,
    BrokerHeartbeat,
    BrokerInfo,
    ConfigureGroup,
    ElectMaster,
    GetGroup,
    HAControllerCommand,
    HAControllerEntry,
    HAControllerResult,
    ListGroups,
    Refusal,
    RegisterBroker,
    decode_entry,
    result_from_text,
    result_to_text,
)
from quorumlog.kv.machine import MalformedEntryError, decode_log_entry
from quorumlog.kv.sessions import (
    SESSION_COUNT_MAX_DEFAULT,
    SESSION_RESULTS_MAX_DEFAULT,
    SESSION_TTL_MS_DEFAULT,
    SessionRecord,
    SessionTable,
    apply_deduplicated,
)
from quorumlog.raft.invariants import require

SNAPSHOT_FORMAT_VERSION = 1

BROKER_HEARTBEAT_TIMEOUT_MS_DEFAULT = 1_500
"""A broker not heard from for this long is dead. Brokers heartbeat several times within it
(a few hundred ms apart); it bounds the detection part of a failover."""
GROUP_COUNT_MAX_DEFAULT = 4_096
BROKERS_PER_GROUP_MAX_DEFAULT = 16
NAME_BYTES_MAX = 256
"""Group names, broker ids and addresses longer than this are refused."""


class BrokerState(msgspec.Struct, array_like=True):
    broker_id: str
    address: str
    max_offset: int = 0
    epoch: int = 0
    last_heartbeat_ms: int = 0


class GroupState(msgspec.Struct, array_like=True):
    group: str
    brokers: dict[str, BrokerState]
    master_id: str | None = None
    master_epoch: int = 0
    sync_state_set: list[str] = msgspec.field(default_factory=list)
    sync_state_set_epoch: int = 0
    allow_unclean_election: bool = False


class HAControllerSnapshot(msgspec.Struct, frozen=True, array_like=True):
    format_version: int
    applied_index: int
    clock_ms: int
    groups: list[GroupState]
    """Sorted by name, each group's brokers by id: the same state gives the same bytes."""
    sessions: list[SessionRecord]


_snapshot_encoder = msgspec.msgpack.Encoder()
_snapshot_decoder = msgspec.msgpack.Decoder(HAControllerSnapshot)


def refused(refusal: Refusal, error: str) -> HAControllerResult:
    return HAControllerResult(ok=False, refusal=refusal, error=error)


class HAControllerMachine:
    """Broker groups by name, client sessions, and the index of the last entry applied."""

    def __init__(
        self,
        broker_heartbeat_timeout_ms: int = BROKER_HEARTBEAT_TIMEOUT_MS_DEFAULT,
        group_count_max: int = GROUP_COUNT_MAX_DEFAULT,
        brokers_per_group_max: int = BROKERS_PER_GROUP_MAX_DEFAULT,
        session_ttl_ms: int = SESSION_TTL_MS_DEFAULT,
        session_count_max: int = SESSION_COUNT_MAX_DEFAULT,
        session_results_max: int = SESSION_RESULTS_MAX_DEFAULT,
    ) -> None:
        for name, bound in (
            ("broker_heartbeat_timeout_ms", broker_heartbeat_timeout_ms),
            ("group_count_max", group_count_max),
            ("brokers_per_group_max", brokers_per_group_max),
        ):
            if bound <= 0:
                raise ValueError(f"{name} must be positive, got {bound}")
        self.broker_heartbeat_timeout_ms = broker_heartbeat_timeout_ms
        self.group_count_max = group_count_max
        self.brokers_per_group_max = brokers_per_group_max
        self.groups: dict[str, GroupState] = {}
        self.sessions = SessionTable(session_ttl_ms, session_count_max, session_results_max)
        self._applied_index = 0
        self.duplicate_count = 0

    # --- reads --------------------------------------------------------------------------

    @property
    def applied_index(self) -> int:
        return self._applied_index

    @property
    def clock_ms(self) -> int:
        """The latest entry stamp applied (monotonic)."""
        return self.sessions.clock_ms

    def master_of(self, name: str) -> str | None:
        state = self.groups.get(name)
        return None if state is None else state.master_id

    def has_election_candidates(self, name: str, now_ms: int) -> bool:
        state = self.groups.get(name)
        return state is not None and bool(self.election_candidates(state, now_ms))

    def is_alive(self, broker: BrokerState, now_ms: int) -> bool:
        return now_ms - broker.last_heartbeat_ms <= self.broker_heartbeat_timeout_ms

    def group_info(self, name: str, now_ms: int | None = None) -> BrokerGroupInfo | None:
        """The view of group `name` with liveness at `now_ms` (default: the machine's clock)."""
        state = self.groups.get(name)
        if state is None:
            return None
        return self.view(state, self.clock_ms if now_ms is None else now_ms)

    def list_groups(self, now_ms: int | None = None) -> list[BrokerGroupInfo]:
        moment_ms = self.clock_ms if now_ms is None else now_ms
        return [self.view(self.groups[name], moment_ms) for name in sorted(self.groups)]

    def view(self, state: GroupState, now_ms: int) -> BrokerGroupInfo:
        brokers = [
            BrokerInfo(
                broker_id=broker.broker_id,
                address=broker.address,
                max_offset=broker.max_offset,
                epoch=broker.epoch,
                last_heartbeat_ms=broker.last_heartbeat_ms,
                alive=self.is_alive(broker, now_ms),
            )
            for _, broker in sorted(state.brokers.items())
        ]
        return BrokerGroupInfo(
            group=state.group,
            brokers=brokers,
            master_id=state.master_id,
            master_epoch=state.master_epoch,
            sync_state_set=list(state.sync_state_set),
            sync_state_set_epoch=state.sync_state_set_epoch,
            allow_unclean_election=state.allow_unclean_election,
        )

    def election_candidates(self, state: GroupState, now_ms: int) -> list[BrokerState]:
        """Who may become master now, the most caught-up first (module docstring)."""
        brokers = state.brokers
        if state.sync_state_set:
            candidates = [
                brokers[broker_id]
                for broker_id in state.sync_state_set
                if self.is_alive(brokers[broker_id], now_ms)
            ]
            if not candidates and state.allow_unclean_election:
                candidates = [b for b in brokers.values() if self.is_alive(b, now_ms)]
        else:
            candidates = [b for b in brokers.values() if self.is_alive(b, now_ms)]
        candidates.sort(key=lambda b: (-b.epoch, -b.max_offset, b.broker_id))
        return candidates

    def groups_needing_election(self, now_ms: int) -> list[tuple[str, int]]:
        """(group, master_epoch) of each group that an automatic election would change at
        `now_ms`: its master is silent, or it has none and someone may be elected. The
        controller leader's periodic check proposes an ElectMaster for each."""
        due = []
        for name in sorted(self.groups):
            state = self.groups[name]
            if state.master_id is not None:
                if not self.is_alive(state.brokers[state.master_id], now_ms):
                    due.append((name, state.master_epoch))
            elif state.sync_state_set and self.election_candidates(state, now_ms):
                due.append((name, state.master_epoch))
        return due

    # --- apply --------------------------------------------------------------------------

    def apply(self, index: int, data: bytes) -> list[list[HAControllerResult]]:
        """Apply the entry at `index`; one result list per client batch, in order. An index
        at or below `applied_index` is already in the state (a restored snapshot)."""
        if index <= self._applied_index:
            return []
        entry = decode_log_entry(decode_entry, data, index, "HA controller")
        results = self.apply_entry(entry)
        self._applied_index = index
        return results

    def mark_applied(self, index: int) -> None:
        """Record an entry that carries no controller commands (leader no-op, membership)."""
        if index > self._applied_index:
            self._applied_index = index

    def apply_entry(self, entry: HAControllerEntry) -> list[list[HAControllerResult]]:
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

    def execute(self, command: HAControllerCommand) -> HAControllerResult:
        """Carry out one command that is not a duplicate."""
        if isinstance(command, GetGroup):
            info = self.group_info(command.group)
            if info is None:
                return refused(Refusal.UNKNOWN_GROUP, f"no broker group {command.group!r}")
            return HAControllerResult(ok=True, group=info)
        if isinstance(command, ListGroups):
            return HAControllerResult(ok=True, groups=self.list_groups())
        before = self.groups.get(command.group)
        epochs_before = (0, 0) if before is None else epochs_of(before)
        if isinstance(command, RegisterBroker):
            result = self.register(command)
        elif isinstance(command, BrokerHeartbeat):
            result = self.heartbeat(command)
        elif isinstance(command, ElectMaster):
            result = self.elect(command)
        elif isinstance(command, AlterSyncStateSet):
            result = self.alter_sync_state_set(command)
        else:
            result = self.configure(command)
        if result.group is not None:
            state = self.groups[result.group.group]
            self.check_group(state)
            require(
                epochs_of(state) >= epochs_before
                and state.sync_state_set_epoch >= epochs_before[1],
                f"{state.group}: epochs went back from {epochs_before} to {epochs_of(state)}",
            )
        return result

    def answer(self, state: GroupState) -> HAControllerResult:
        return HAControllerResult(ok=True, group=self.view(state, self.clock_ms))

    # --- commands -----------------------------------------------------------------------

    def group_for_write(self, name: str) -> GroupState | HAControllerResult:
        """The group `name`, created if absent; a refusal if it cannot be."""
        state = self.groups.get(name)
        if state is not None:
            return state
        if not name or len(name.encode()) > NAME_BYTES_MAX:
            return refused(Refusal.BAD_REQUEST, f"group name must be 1 to {NAME_BYTES_MAX} bytes")
        if len(self.groups) >= self.group_count_max:
            return refused(Refusal.LIMIT_EXCEEDED, f"already {self.group_count_max} groups")
        state = GroupState(group=name, brokers={})
        self.groups[name] = state
        return state

    def register(self, command: RegisterBroker) -> HAControllerResult:
        for what, text in (("broker id", command.broker_id), ("address", command.address)):
            if not text or len(text.encode()) > NAME_BYTES_MAX:
                return refused(Refusal.BAD_REQUEST, f"{what} must be 1 to {NAME_BYTES_MAX} bytes")
        state = self.groups.get(command.group)
        if (
            state is not None
            and command.broker_id not in state.brokers
            and len(state.brokers) >= self.brokers_per_group_max
        ):
            return refused(
                Refusal.LIMIT_EXCEEDED,
                f"group {command.group!r} has {self.brokers_per_group_max} brokers already",
            )
        found = self.group_for_write(command.group)
        if isinstance(found, HAControllerResult):
            return found
        broker = found.brokers.get(command.broker_id)
        if broker is None:
            broker = BrokerState(broker_id=command.broker_id, address=command.address)
            found.brokers[command.broker_id] = broker
        broker.address = command.address
        broker.last_heartbeat_ms = self.clock_ms
        if found.master_id is None and not found.sync_state_set:
            # Never had a master, so nothing was ever acknowledged: anyone may lead.
            self.become_master(found, command.broker_id)
        return self.answer(found)

    def heartbeat(self, command: BrokerHeartbeat) -> HAControllerResult:
        state = self.groups.get(command.group)
        if state is None:
            return refused(Refusal.UNKNOWN_GROUP, f"no broker group {command.group!r}")
        broker = state.brokers.get(command.broker_id)
        if broker is None:
            return refused(
                Refusal.UNKNOWN_BROKER,
                f"broker {command.broker_id!r} is not registered in {command.group!r}",
            )
        broker.last_heartbeat_ms = self.clock_ms
        broker.max_offset = command.max_offset
        broker.epoch = command.epoch
        return self.answer(state)

    def configure(self, command: ConfigureGroup) -> HAControllerResult:
        found = self.group_for_write(command.group)
        if isinstance(found, HAControllerResult):
            return found
        found.allow_unclean_election = command.allow_unclean_election
        return self.answer(found)

    def elect(self, command: ElectMaster) -> HAControllerResult:
        state = self.groups.get(command.group)
        if state is None:
            return refused(Refusal.UNKNOWN_GROUP, f"no broker group {command.group!r}")
        expected = command.expected_master_epoch
        if expected is not None and expected != state.master_epoch:
            return refused(
                Refusal.STALE_MASTER_EPOCH,
                f"group {state.group!r} is at MasterEpoch {state.master_epoch}, "
                f"the election expected {expected}",
            )
        now_ms = self.clock_ms
        master = None if state.master_id is None else state.brokers[state.master_id]
        master_alive = master is not None and self.is_alive(master, now_ms)
        if command.automatic and master_alive:
            return refused(Refusal.MASTER_STILL_ALIVE, f"master {state.master_id!r} is alive")
        if command.broker_id is not None:
            return self.elect_named(state, command.broker_id, now_ms)
        candidates = self.election_candidates(state, now_ms)
        if master_alive and master in candidates:
            # As RocketMQ's policy: an alive master in the SyncStateSet stays master.
            return refused(Refusal.MASTER_STILL_ALIVE, f"master {state.master_id!r} is alive")
        if candidates:
            self.become_master(state, candidates[0].broker_id)
            return self.answer(state)
        if command.automatic and state.master_id is not None:
            self.lose_master(state)
            return self.answer(state)
        return refused(
            Refusal.NO_ELIGIBLE_MASTER,
            f"no alive broker of {state.group!r} may be elected "
            f"(SyncStateSet {state.sync_state_set})",
        )

    def elect_named(self, state: GroupState, broker_id: str, now_ms: int) -> HAControllerResult:
        broker = state.brokers.get(broker_id)
        if broker is None:
            return refused(
                Refusal.UNKNOWN_BROKER, f"broker {broker_id!r} is not registered in {state.group!r}"
            )
        if broker_id == state.master_id:
            return refused(Refusal.MASTER_STILL_ALIVE, f"{broker_id!r} is the master already")
        if broker not in self.election_candidates(state, now_ms):
            return refused(
                Refusal.BROKER_NOT_ELIGIBLE,
                f"broker {broker_id!r} is not an alive member of the SyncStateSet "
                f"{state.sync_state_set} of {state.group!r}",
            )
        self.become_master(state, broker_id)
        return self.answer(state)

    def become_master(self, state: GroupState, broker_id: str) -> None:
        require(broker_id in state.brokers, f"electing unregistered broker {broker_id!r}")
        state.master_id = broker_id
        state.master_epoch += 1
        state.sync_state_set = [broker_id]
        state.sync_state_set_epoch += 1

    def lose_master(self, state: GroupState) -> None:
        """The master is gone and nobody may replace it: no master under a new epoch."""
        state.master_id = None
        state.master_epoch += 1

    def alter_sync_state_set(self, command: AlterSyncStateSet) -> HAControllerResult:
        state = self.groups.get(command.group)
        if state is None:
            return refused(Refusal.UNKNOWN_GROUP, f"no broker group {command.group!r}")
        stale = check_alter_epochs(state, command)
        if stale is not None:
            return stale
        new_set = set(command.new_set)
        problem = None
        if command.master_id not in new_set:
            problem = "it leaves out the master"
        elif len(new_set) != len(command.new_set):
            problem = "it names a broker twice"
        elif not new_set <= state.brokers.keys():
            problem = f"{sorted(new_set - state.brokers.keys())} are not registered"
        else:
            added = sorted(new_set - set(state.sync_state_set))
            dead = [b for b in added if not self.is_alive(state.brokers[b], self.clock_ms)]
            if dead:
                problem = f"{dead} would join but are not alive"
        if problem is not None:
            return refused(
                Refusal.INVALID_SYNC_STATE_SET, f"SyncStateSet {command.new_set} refused: {problem}"
            )
        state.sync_state_set = [command.master_id, *sorted(new_set - {command.master_id})]
        state.sync_state_set_epoch += 1
        return self.answer(state)

    def check_group(self, state: GroupState) -> None:
        """Facts every command must leave true; a violation stops the group."""
        members = state.sync_state_set
        require(set(members) <= state.brokers.keys(), f"{state.group}: SSS {members} unknown")
        require(len(set(members)) == len(members), f"{state.group}: SSS {members} repeats")
        if state.master_id is not None:
            require(
                bool(members) and members[0] == state.master_id,
                f"{state.group}: master {state.master_id} does not lead SSS {members}",
            )

    # --- snapshots ----------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The whole state as deterministic bytes."""
        groups = [
            GroupState(
                group=state.group,
                brokers=dict(sorted(state.brokers.items())),
                master_id=state.master_id,
                master_epoch=state.master_epoch,
                sync_state_set=list(state.sync_state_set),
                sync_state_set_epoch=state.sync_state_set_epoch,
                allow_unclean_election=state.allow_unclean_election,
            )
            for _, state in sorted(self.groups.items())
        ]
        snapshot = HAControllerSnapshot(
            format_version=SNAPSHOT_FORMAT_VERSION,
            applied_index=self._applied_index,
            clock_ms=self.sessions.clock_ms,
            groups=groups,
            sessions=self.sessions.to_records(),
        )
        return _snapshot_encoder.encode(snapshot)

    def restore(self, data: bytes) -> None:
        """Replace the whole state with a snapshot's; the state is unchanged if it fails."""
        try:
            snapshot = _snapshot_decoder.decode(data)
        except wire.DECODE_ERRORS as error:
            raise MalformedEntryError(
                f"HA controller snapshot ({len(data)} bytes) does not decode: {error}"
            ) from error
        if snapshot.format_version != SNAPSHOT_FORMAT_VERSION:
            raise MalformedEntryError(
                f"HA controller snapshot format {snapshot.format_version}; this build reads "
                f"{SNAPSHOT_FORMAT_VERSION}"
            )
        groups = {state.group: state for state in snapshot.groups}
        if len(groups) != len(snapshot.groups):
            raise MalformedEntryError("HA controller snapshot names a group twice")
        restored = SessionTable(
            self.sessions.session_ttl_ms,
            self.sessions.session_count_max,
            self.sessions.session_results_max,
        )
        try:
            restored.load_records(snapshot.clock_ms, snapshot.sessions)
        except ValueError as error:
            raise MalformedEntryError(f"HA controller snapshot: {error}") from error
        self.sessions = restored
        self.groups = groups
        self._applied_index = snapshot.applied_index


def deduplicated_sequence(command: HAControllerCommand) -> int | None:
    """The sequence a session keeps the command's answer under; None for reads, heartbeats
    and automatic elections, which are not kept: a repeat of one is harmless (a read reads
    again, a heartbeat stamps again, an automatic election is guarded by its expected
    MasterEpoch), and keeping them would fill the sessions."""
    if isinstance(command, GetGroup | ListGroups | BrokerHeartbeat):
        return None
    if isinstance(command, ElectMaster) and command.automatic:
        return None
    return command.sequence


def epochs_of(state: GroupState) -> tuple[int, int]:
    return state.master_epoch, state.sync_state_set_epoch


def check_alter_epochs(state: GroupState, command: AlterSyncStateSet) -> HAControllerResult | None:
    """A refusal unless the request comes from the current master at the current epochs."""
    if command.master_id != state.master_id:
        return refused(
            Refusal.NOT_MASTER,
            f"{command.master_id!r} is not the master of {state.group!r} "
            f"(the master is {state.master_id!r})",
        )
    if command.master_epoch != state.master_epoch:
        return refused(
            Refusal.STALE_MASTER_EPOCH,
            f"MasterEpoch {command.master_epoch}; {state.group!r} is at {state.master_epoch}",
        )
    if command.sync_state_set_epoch != state.sync_state_set_epoch:
        return refused(
            Refusal.STALE_SYNC_STATE_SET_EPOCH,
            f"SyncStateSet epoch {command.sync_state_set_epoch}; "
            f"{state.group!r} is at {state.sync_state_set_epoch}",
        )
    return None


def to_session_result(result: HAControllerResult) -> KVCommandResult:
    return KVCommandResult(ok=result.ok, value=result_to_text(result))


def from_session_result(stored: KVCommandResult) -> HAControllerResult:
    if stored.value is None:
        # The client had acknowledged the answer, so the session let it go.
        return HAControllerResult(ok=stored.ok)
    return result_from_text(stored.value)


__all__ = [
    "BROKERS_PER_GROUP_MAX_DEFAULT",
    "BROKER_HEARTBEAT_TIMEOUT_MS_DEFAULT",
    "GROUP_COUNT_MAX_DEFAULT",
    "BrokerState",
    "GroupState",
    "HAControllerMachine",
    "HAControllerSnapshot",
]
