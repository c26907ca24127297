"""The master side of a broker group's replication (reference 003, AutoSwitchHAService).

Becoming master (the constructor): the log ends at a whole message; epoch entries past its
end (left by a crash between a slave's log truncation and its epoch file's) are dropped;
<MasterEpoch, max offset> is appended to the epoch file, durably, BEFORE any write is taken,
so every offset this master writes is described by an epoch entry already on disk.

Per slave connection: the handshake answer (the master's epoch list and max offset), then,
from the offset the slave acks after truncating, transfer batches. A batch holds messages
of one epoch (the commit log's read stops where the epoch changes), so a slave sees every
change of epoch in a header. Every batch carries confirmOffset; an idle connection gets an
empty batch every `heartbeat_interval_ms`, so acks, and so catching up, keep being dated.

confirmOffset = min over the SyncStateSet of each member's durable offset: the master's
durable offset (what its commit log reports durable after a sync returned, `synced`), each
slave's last ack (slaves ack only what is durable at them). It never goes back.
While an AlterSyncStateSet is outstanding, the min runs over the old set AND the proposed
one: the controller may have applied the change already (its answer can be lost), and from
then on it may elect any member of the new set, so a joining slave must be counted at once
(apache/rocketmq #5663: an ack lost while the set expands), and a leaving one until the
controller has let it go. Only the controller's answer, or a view of the group with a newer
SyncStateSet epoch, settles an outstanding change.

lastCaughtUpTime, as 003 defines it: on each transfer the master notes (now, its max
offset); when an ack reaches a noted max offset, the slave was caught up at that time. We
keep every noted pair a connection has in flight (003 keeps the last only, which under a
steady stream of produces never lets a pipelined slave count as caught up). Shrink: a member
whose lastCaughtUpTime is older than `ha_max_time_slave_not_catch_up_ms` leaves the set.
Expand: a connected slave (not an async learner) whose ack is at or past confirmOffset
joins. One AlterSyncStateSet at a time.

Produces: refused with NotEnoughReplicasError while the SyncStateSet is smaller than
`min_in_sync`; acknowledged once confirmOffset passes their end, and only while the set
holds at least `min_in_sync` members (the acknowledged offset waits otherwise).

A master that learns of a newer MasterEpoch (from a slave's handshake or the controller)
is fenced: it takes no writes, acknowledges nothing more, and asks for no more changes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from quorumlog.errors import MasterFencedError, NotEnoughReplicasError
from quorumlog.ha.commit_log import CommitLog
from quorumlog.ha.epoch_file import EpochFile
from quorumlog.ha.replication_actions import (
    Disconnect,
    HAReplicationConfig,
    MasterActions,
    RequestAlterSyncStateSet,
    Send,
)
from quorumlog.ha.wire import Ack, HAFrame, HandshakeRequest, HandshakeResponse, TransferBatch
from quorumlog.raft.invariants import require


@dataclass
class SlaveConnection:
    """What the master knows of one slave connection."""

    connection_id: int
    slave_id: str
    address: str
    async_learner: bool
    transferring: bool = False
    """False until the slave's first ack (after its truncation) says where to start."""
    next_transfer_offset: int = 0
    acked_offset: int = 0
    last_send_time_ms: int | None = None
    transfers: deque[tuple[int, int]] = field(default_factory=deque)
    """(time, master max offset) at each transfer not yet caught up with, oldest first."""


@dataclass
class PendingAlter:
    request: RequestAlterSyncStateSet
    sent_time_ms: int
    outcome_unknown: bool = False


def ordered_set(master_id: str, members: set[str] | Sequence[str]) -> list[str]:
    """The controller's order: the master first, then the others by broker id."""
    return [master_id, *sorted(set(members) - {master_id})]


class MasterCore:
    """One mastership of one broker group: from election to fencing."""

    def __init__(
        self,
        *,
        group: str,
        broker_id: str,
        master_epoch: int,
        sync_state_set: Sequence[str],
        sync_state_set_epoch: int,
        commit_log: CommitLog,
        epoch_file: EpochFile,
        now_ms: int,
        config: HAReplicationConfig | None = None,
        confirm_offset: int = 0,
    ) -> None:
        self.config = config or HAReplicationConfig()
        self.config.validate()
        require(broker_id in sync_state_set, f"master {broker_id} is not in {sync_state_set}")
        self.group = group
        self.broker_id = broker_id
        self.master_epoch = master_epoch
        self.sync_state_set = ordered_set(broker_id, sync_state_set)
        self.sync_state_set_epoch = sync_state_set_epoch
        self.commit_log = commit_log
        self.epoch_file = epoch_file
        self.fenced = False
        self._become_master()
        self._durable_offset = commit_log.max_offset
        self.confirm_offset = min(confirm_offset, self._durable_offset)
        self.acknowledged_offset = self.confirm_offset
        self._connections: dict[int, SlaveConnection] = {}
        self._acked_by_broker: dict[str, int] = {}
        self._caught_up_ms: dict[str, int] = dict.fromkeys(self.sync_state_set, now_ms)
        """Each member's lastCaughtUpTime; a new master gives every member a full period."""
        self._pending_alter: PendingAlter | None = None
        self._actions = MasterActions()

    def _become_master(self) -> None:
        log, epochs, epoch = self.commit_log, self.epoch_file, self.master_epoch
        offset = log.truncate_to_last_whole_message()
        log.sync()  # what the log holds now counts as the master's durable offset
        epochs.truncate_from(offset + 1)
        require(
            epoch >= epochs.last_epoch and (log.last_epoch or 0) <= epoch,
            f"master epoch {epoch} is older than the broker's epochs "
            f"(file {epochs.last_epoch}, log {log.last_epoch})",
        )
        if epochs.last_epoch == epoch:
            return  # the same mastership after a restart: its range runs on
        epochs.append(epoch, offset)  # durable before any write is taken

    # --- produces -------------------------------------------------------------------

    def append(self, messages: Sequence[bytes]) -> int:
        """Write a produce; returns its end offset (acknowledged once `acknowledged_offset`
        reaches it). Not durable until `sync`."""
        if self.fenced:
            raise MasterFencedError(
                f"broker {self.broker_id} is no longer master of {self.group} "
                f"(its MasterEpoch {self.master_epoch} is stale)"
            )
        if len(self.sync_state_set) < self.config.min_in_sync:
            raise NotEnoughReplicasError(list(self.sync_state_set), self.config.min_in_sync)
        return self.commit_log.append(messages, self.master_epoch)

    def sync(self) -> None:
        """Make every write so far durable on the master (group commit), here and now."""
        self.commit_log.sync()
        self.synced()

    def synced(self) -> None:
        """A sync of the commit log returned (here or off the loop): what the log reports
        durable now counts as the master's own offset in confirmOffset."""
        durable = self.commit_log.durable_offset
        require(
            durable <= self.commit_log.max_offset,
            f"durable offset {durable} is past the log's end {self.commit_log.max_offset}",
        )
        self._durable_offset = max(self._durable_offset, durable)
        self._advance_confirm()

    # --- slave connections ----------------------------------------------------------

    def receive(self, connection_id: int, frame: HAFrame, now_ms: int) -> None:
        if isinstance(frame, HandshakeRequest):
            self._handshake(connection_id, frame)
        elif isinstance(frame, Ack):
            self._ack(connection_id, frame.max_offset)
        else:
            self._disconnect(connection_id, f"a slave sent {type(frame).__name__}")

    def connection_closed(self, connection_id: int) -> None:
        self._connections.pop(connection_id, None)

    def _handshake(self, connection_id: int, request: HandshakeRequest) -> None:
        refusal = self._handshake_refusal(connection_id, request)
        if refusal is not None:
            response = HandshakeResponse(self.broker_id, self.master_epoch, 0, 0, [], refusal)
            self._actions.sends.append(Send(connection_id, response))
            return
        for other in list(self._connections.values()):
            if other.slave_id == request.slave_id:  # the slave reconnected: the old one is dead
                self._disconnect(other.connection_id, "replaced by a newer connection")
        self._connections[connection_id] = SlaveConnection(
            connection_id, request.slave_id, request.address, request.async_learner
        )
        response = HandshakeResponse(
            master_id=self.broker_id,
            master_epoch=self.master_epoch,
            max_offset=self.commit_log.max_offset,
            min_offset=self.commit_log.min_offset,
            epochs=list(self.epoch_file.entries),
        )
        self._actions.sends.append(Send(connection_id, response))

    def _handshake_refusal(self, connection_id: int, request: HandshakeRequest) -> str | None:
        if request.master_epoch > self.master_epoch:
            self.fenced = True  # the slave knows of a newer master than this one
            return (
                f"master epoch {self.master_epoch} is stale "
                f"(the slave expects {request.master_epoch})"
            )
        if self.fenced:
            return f"broker {self.broker_id} is fenced"
        if connection_id in self._connections:
            return "a second handshake on one connection"
        if request.slave_id == self.broker_id:
            return "a broker cannot be its own slave"
        if request.data_file_bytes != self.commit_log.data_file_bytes:
            return (
                f"commit log layouts differ: data_file_bytes {request.data_file_bytes} at "
                f"the slave, {self.commit_log.data_file_bytes} at the master"
            )
        return None

    def _ack(self, connection_id: int, offset: int) -> None:
        connection = self._connections.get(connection_id)
        if connection is None:
            return  # an ack racing the close of its connection
        if offset > self.commit_log.max_offset or offset < self.commit_log.min_offset:
            self._disconnect(connection_id, f"ack {offset} is outside the master's log")
            return
        if not connection.transferring:
            connection.transferring = True
            connection.next_transfer_offset = connection.acked_offset = offset
        elif offset > connection.next_transfer_offset:
            self._disconnect(connection_id, f"ack {offset} is past what was sent")
            return
        elif offset > connection.acked_offset:
            connection.acked_offset = offset
        self._note_caught_up(connection)
        if not connection.async_learner:
            self._acked_by_broker[connection.slave_id] = connection.acked_offset
        self._advance_confirm()

    def _note_caught_up(self, connection: SlaveConnection) -> None:
        transfers = connection.transfers
        caught_up_at = None
        while transfers and transfers[0][1] <= connection.acked_offset:
            caught_up_at = transfers.popleft()[0]
        if caught_up_at is not None:
            earlier = self._caught_up_ms.get(connection.slave_id, caught_up_at)
            self._caught_up_ms[connection.slave_id] = max(earlier, caught_up_at)

    def _disconnect(self, connection_id: int, reason: str) -> None:
        self._connections.pop(connection_id, None)
        self._actions.disconnects.append(Disconnect(connection_id, reason))

    # --- transfer -------------------------------------------------------------------

    def _transfer(self, connection: SlaveConnection, now_ms: int) -> None:
        """Fill the connection's window with batches; a heartbeat if it is idle."""
        config, log = self.config, self.commit_log
        sent = False
        while connection.next_transfer_offset - connection.acked_offset < config.inflight_bytes_max:
            batch = log.read_batch(connection.next_transfer_offset, config.transfer_batch_bytes_max)
            if batch is None:
                break
            epoch_start = self.epoch_file.start_of(batch.epoch)
            require(
                epoch_start is not None
                and self.epoch_file.epoch_at(batch.start_offset) == batch.epoch,
                f"log offset {batch.start_offset} has epoch {batch.epoch}, which the epoch "
                f"file does not place there ({self.epoch_file.entries})",
            )
            assert epoch_start is not None  # for mypy; `require` above checked it
            self._send_batch(connection, now_ms, batch.epoch, epoch_start, batch.end_offset,
                             batch.messages)  # fmt: skip
            sent = True
        last_send = connection.last_send_time_ms
        idle = last_send is None or now_ms - last_send >= config.heartbeat_interval_ms
        if not sent and idle:
            epoch_start = self.epoch_file.start_of(self.master_epoch)
            require(epoch_start is not None, "the master's own epoch is not in its epoch file")
            assert epoch_start is not None
            offset = connection.next_transfer_offset
            self._send_batch(connection, now_ms, self.master_epoch, epoch_start, offset, [])

    def _send_batch(
        self,
        connection: SlaveConnection,
        now_ms: int,
        epoch: int,
        epoch_start: int,
        end_offset: int,
        messages: list[bytes],
    ) -> None:
        batch = TransferBatch(
            epoch=epoch,
            epoch_start_offset=epoch_start,
            start_offset=connection.next_transfer_offset,
            end_offset=end_offset,
            confirm_offset=self.confirm_offset,
            messages=messages,
        )
        self._actions.sends.append(Send(connection.connection_id, batch))
        connection.next_transfer_offset = end_offset
        connection.last_send_time_ms = now_ms
        transfers = connection.transfers
        if len(transfers) >= self.config.transfer_times_max:
            transfers.popleft()  # only ever makes the slave look less caught up
        transfers.append((now_ms, self.commit_log.max_offset))

    # --- confirmOffset ----------------------------------------------------------------

    def _confirm_members(self) -> set[str]:
        members = set(self.sync_state_set)
        if self._pending_alter is not None:
            members |= set(self._pending_alter.request.new_set)
        return members

    def _advance_confirm(self) -> None:
        """confirmOffset = min over the members (old and proposed sets while a change is
        outstanding) of their durable offsets; a member never heard from holds it still."""
        lowest = self._durable_offset
        for member in self._confirm_members() - {self.broker_id}:
            acked = self._acked_by_broker.get(member)
            if acked is None:
                return
            lowest = min(lowest, acked)
        if lowest > self.confirm_offset:
            self.confirm_offset = lowest
        enough = len(self.sync_state_set) >= self.config.min_in_sync
        if enough and not self.fenced:
            self.acknowledged_offset = self.confirm_offset

    # --- the SyncStateSet -------------------------------------------------------------

    def _decide_sync_state_set(self, now_ms: int) -> None:
        """Shrink by catch-up time, expand by ack >= confirmOffset; one change at a time."""
        pending = self._pending_alter
        if pending is not None:
            retry_due = now_ms - pending.sent_time_ms >= self.config.alter_retry_interval_ms
            if pending.outcome_unknown and retry_due:
                pending.sent_time_ms = now_ms
                pending.outcome_unknown = False
                self._actions.alter_sync_state_set = pending.request
            return
        limit_ms = self.config.ha_max_time_slave_not_catch_up_ms
        keep = {
            member
            for member in self.sync_state_set
            if member == self.broker_id
            or now_ms - self._caught_up_ms.get(member, now_ms) <= limit_ms
        }
        joining = {
            connection.slave_id
            for connection in self._connections.values()
            if connection.transferring
            and not connection.async_learner
            and connection.acked_offset >= self.confirm_offset
            and connection.slave_id not in self.sync_state_set
        }
        new_set = ordered_set(self.broker_id, keep | joining)
        if new_set == self.sync_state_set:
            return
        request = RequestAlterSyncStateSet(
            group=self.group,
            master_id=self.broker_id,
            master_epoch=self.master_epoch,
            sync_state_set_epoch=self.sync_state_set_epoch,
            new_set=new_set,
        )
        self._pending_alter = PendingAlter(request, now_ms)
        self._actions.alter_sync_state_set = request

    def _adopt(self, sync_state_set: Sequence[str], sync_state_set_epoch: int, now_ms: int) -> None:
        self.sync_state_set = ordered_set(self.broker_id, sync_state_set)
        self.sync_state_set_epoch = sync_state_set_epoch
        for member in self.sync_state_set:
            self._caught_up_ms.setdefault(member, now_ms)
        self._pending_alter = None
        self._advance_confirm()

    def alter_sync_state_set_done(
        self, sync_state_set: Sequence[str], sync_state_set_epoch: int, now_ms: int
    ) -> None:
        """The controller applied the outstanding change; this is the set it now holds."""
        if sync_state_set_epoch > self.sync_state_set_epoch:
            self._adopt(sync_state_set, sync_state_set_epoch, now_ms)

    def alter_sync_state_set_refused(self) -> None:
        """The controller refused the outstanding change: it never applies. (A refusal for
        a stale MasterEpoch fences this master too: the driver passes `controller_view`.)"""
        self._pending_alter = None
        self._advance_confirm()

    def alter_sync_state_set_unknown(self) -> None:
        """No answer in time: the change may or may not apply. It stays outstanding (and
        counted) and is sent again after `alter_retry_interval_ms`."""
        if self._pending_alter is not None:
            self._pending_alter.outcome_unknown = True

    def controller_view(
        self,
        master_id: str | None,
        master_epoch: int,
        sync_state_set: Sequence[str],
        sync_state_set_epoch: int,
        now_ms: int,
    ) -> None:
        """The controller's view of the group (the `BrokerGroupInfo` fields), from a
        heartbeat's answer: a newer master fences this one; a newer set is adopted."""
        if master_epoch > self.master_epoch or (
            master_epoch == self.master_epoch and master_id != self.broker_id
        ):
            self.fenced = True
            return
        if master_epoch == self.master_epoch and sync_state_set_epoch > self.sync_state_set_epoch:
            self._adopt(sync_state_set, sync_state_set_epoch, now_ms)

    # --- actions ----------------------------------------------------------------------

    def take_actions(self, now_ms: int) -> MasterActions:
        """Transfers due, heartbeats due, a SyncStateSet change due; see the module docs of
        replication_actions for what the driver does with them."""
        if not self.fenced:
            for connection in list(self._connections.values()):
                if connection.transferring:
                    self._transfer(connection, now_ms)
            self._decide_sync_state_set(now_ms)
        actions = self._actions
        actions.confirm_offset = self.confirm_offset
        actions.acknowledged_offset = self.acknowledged_offset
        self._actions = MasterActions()
        return actions

    @property
    def connections(self) -> list[SlaveConnection]:
        return list(self._connections.values())

    def last_caught_up_ms(self, broker_id: str) -> int | None:
        return self._caught_up_ms.get(broker_id)


__all__ = ["MasterCore", "SlaveConnection", "ordered_set"]
