"""What the HA replication cores take as settings and hand out as actions.

The cores (replication_master.py, replication_slave.py) open no socket and read no clock:
time comes in as `now_ms` arguments. They do touch the broker's commit log and epoch file,
through the small `CommitLog` and `EpochFile` interfaces (the simulator runs them on its
disk), because the order of those writes IS the protocol: an epoch entry is durable before
the offsets it describes are used, a log truncation comes before the epoch file's.

A driver (the broker in the node, the simulator, a test's pump) does for the master:

1. feed `receive(connection_id, frame, now_ms)` for every frame from a slave connection,
   `connection_closed(connection_id)` when one drops;
2. `append(messages)` for produces, then make the log durable once per burst (group
   commit): `sync()`, or the commit log's `begin_sync` / `run` off the loop / `finish_sync`,
   then `synced()` (the master counts only what the log reports durable);
3. answer each `RequestAlterSyncStateSet` with `alter_sync_state_set_done`,
   `alter_sync_state_set_refused` or (no answer in time) `alter_sync_state_set_unknown`,
   and pass every view of the group the controller sends with `controller_view`;
4. call `take_actions(now_ms)` after each event or burst, periodically too (heartbeats and
   SyncStateSet decisions are due by time); then send every `Send` in order, close every
   `Disconnect`ed connection, forward the `RequestAlterSyncStateSet` to the controller, and
   complete the produces whose end offset is at or below `acknowledged_offset`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from quorumlog.ha.wire import HAFrame


class HAReplicationConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Bounds carry their unit in their name; times are milliseconds of the caller's clock."""

    transfer_batch_bytes_max: int = 1024 * 1024
    """Message bytes in one transfer batch (a larger single message still goes alone)."""
    inflight_bytes_max: int = 16 * 1024 * 1024
    """Log bytes sent to one slave and not yet acknowledged by it (the pipeline window)."""
    heartbeat_interval_ms: int = 1000
    """An idle connection gets an empty batch (with confirmOffset) this often."""
    ha_max_time_slave_not_catch_up_ms: int = 15_000
    """A SyncStateSet member not caught up for longer leaves the set (003's shrink)."""
    alter_retry_interval_ms: int = 3000
    """An AlterSyncStateSet whose outcome is unknown is sent again after this long."""
    min_in_sync: int = 2
    """Members the SyncStateSet needs for a produce to be taken and acknowledged."""
    transfer_times_max: int = 1024
    """(time, master max offset) pairs kept per slave to date its catching up."""

    def validate(self) -> None:
        """Raise ValueError naming the first setting out of range."""
        for name in self.__struct_fields__:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.transfer_batch_bytes_max > self.inflight_bytes_max:
            raise ValueError("transfer_batch_bytes_max must not exceed inflight_bytes_max")
        if self.heartbeat_interval_ms >= self.ha_max_time_slave_not_catch_up_ms:
            raise ValueError(
                "heartbeat_interval_ms must be below ha_max_time_slave_not_catch_up_ms "
                "(an idle, caught-up slave would leave the SyncStateSet)"
            )


class Send(msgspec.Struct, frozen=True):
    connection_id: int
    frame: HAFrame


class Disconnect(msgspec.Struct, frozen=True):
    connection_id: int
    reason: str


class RequestAlterSyncStateSet(msgspec.Struct, frozen=True):
    """Ask the controller to change the SyncStateSet. The fields are those of the
    controller's `ha.controller_model.AlterSyncStateSet` command, by name."""

    group: str
    master_id: str
    master_epoch: int
    sync_state_set_epoch: int
    new_set: list[str]


@dataclass
class MasterActions:
    sends: list[Send] = field(default_factory=list)
    disconnects: list[Disconnect] = field(default_factory=list)
    alter_sync_state_set: RequestAlterSyncStateSet | None = None
    confirm_offset: int = 0
    """min over the SyncStateSet of what each member has durably; consumers read below it."""
    acknowledged_offset: int = 0
    """Produces ending at or below this are acknowledged (confirmOffset while the
    SyncStateSet has at least min_in_sync members; it does not move otherwise)."""


@dataclass
class SlaveActions:
    sends: list[HAFrame] = field(default_factory=list)
    disconnect: str | None = None
    """The connection broke the protocol: close it and handshake again."""
    sync: bool = False
    """Messages were appended: make the log durable (at once, or off the loop while more
    batches come), then call the slave's `synced()` and send what it returns (the ack)."""


__all__ = [
    "Disconnect",
    "HAReplicationConfig",
    "MasterActions",
    "RequestAlterSyncStateSet",
    "Send",
    "SlaveActions",
]
