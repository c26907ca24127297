"""The one driver of a broker's replication (reference 003's ReplicasManager + HAService):
what a node runs for each broker it hosts and what the simulator runs, as `RaftHost` is for
Raft groups and `LedgerDriver` for ledgers.

The cores (replication_master.py, replication_slave.py) compute; `BrokerHost` connects
them to their world through small interfaces, so the asyncio node and the seeded simulator
run the same code:

- a `Scheduler` (runtime/resources.py): callbacks on the host's one thread, timers, clocks.
  The cores are fed `now_ms` from the monotonic clock (durations only: catch-up times,
  heartbeats, retries).
- `HALinks`: connections between brokers. The host opens one connection to its master when
  it is a slave (`connect`); the links accept connections from slaves on the broker's HA
  address when it is a master. Events come back as calls on the host, never from inside a
  call the host made: `connected`, `frame_received`, `connection_lost`.
- `ControllerAccess`: register, heartbeat and AlterSyncStateSet calls to the HA controller,
  each answered exactly once (never inline) with the controller's `HAControllerResult`, or
  None when the outcome is unknown (no answer in time, or the call failed on the way).
- the broker's `CommitLog` and `EpochFile`, which the cores write synchronously (their order
  is the protocol; see replication_actions).
- a `Background` (runtime/resources.py) for the commit log's syncs: a thread pool in a node
  (the msyncs then run while the loop takes more produces, transfers and acks), the
  simulator's delayed jobs, or, by default, at once on the host's thread.

Syncs. At most one is in flight per broker: it covers what was appended when it began
(`CommitLog.begin_sync`), and whatever is appended while it runs waits for the next, which
begins as soon as it returns (group commit: one sync per burst, however long the burst).
Only a returned sync moves the log's durable offset, and only the durable offset counts:
the master's own offset in confirmOffset (`MasterCore.synced`), a slave's acks
(`SlaveCore.synced`). So a produce is still acknowledged only when every SyncStateSet
member has it durably, while the loop never waits for a disk.

What the host does, in order, after every event (`flush`): `take_actions` (sends,
disconnects, a SyncStateSet change to forward, and the produces to complete: those whose end
offset is at or below the acknowledged offset, in log order); then, if something was
appended and no sync is in flight, it begins one. Transfers go out BEFORE the sync, so the
slaves write their disks while the master writes its own; when a sync returns, the master
takes the actions again (acknowledgements) and a slave acks. A timer runs `take_actions`
every `tick_seconds` too (transfer heartbeats and shrink decisions are due by time) and
heartbeats the controller every `controller_heartbeat_seconds`.

Following the controller. Every controller answer carries the group's `BrokerGroupInfo`;
the host follows it: master at the named MasterEpoch (a new `MasterCore`, which appends
<MasterEpoch, max offset> to the epoch file before any write), or slave of the named master
(a new `SlaveCore`, then a connection and the handshake), or nothing (no master elected).
A view with a MasterEpoch older than the one the host follows is stale and ignored. A
master that a newer view names nobody or someone else is fenced first (it acknowledges
nothing more), then changes role. Produces waiting on a mastership that ends fail with
`MasterFencedError`: their outcome is unknown (a new master may still hold them), which the
idempotent producer's retry resolves.

A failed sync (an I/O error, a full disk), or a failed write to the commit log or the epoch
file (an append, a handshake truncation, a new epoch). The kernel may have dropped the pages
a failed sync was writing, so the log counts nothing more durable until it is reopened (the
store refuses more writes too). The broker steps out at once (`step_out`): the produces
waiting fail with `HASyncFailedError`, an unknown outcome (the slaves may hold them durably;
the idempotent producer's retry at the next master resolves it), new ones are refused with
it, the replication connections close and the broker falls silent to the controller, which
elects a master from the SyncStateSet members still alive after its heartbeat timeout. A
slave that steps out stops acking and leaves the SyncStateSet by the usual shrink, so the
master's produces go on. `on_failed` tells the owner (a node reopens the log after a full
disk, Kafka's way with a failed log directory: leadership moves to a replica with room).
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

import msgspec

from quorumlog.errors import (
    DiskFullError,
    HAHandshakeRefusedError,
    HAPendingFullError,
    HAReplicationError,
    HASyncFailedError,
    MasterFencedError,
    NotEnoughReplicasError,
    QuorumLogError,
    StorageError,
)
from quorumlog.ha.commit_log import CommitLog, CommitLogBatch, CommitLogSync
from quorumlog.ha.controller_model import (
    AlterSyncStateSet,
    BrokerGroupInfo,
    BrokerHeartbeat,
    HAControllerResult,
    Refusal,
    RegisterBroker,
)
from quorumlog.ha.epoch_file import EpochEntry, EpochFile
from quorumlog.ha.replication_actions import (
    HAReplicationConfig,
    MasterActions,
    RequestAlterSyncStateSet,
    SlaveActions,
)
from quorumlog.ha.replication_master import MasterCore
from quorumlog.ha.replication_slave import SlaveCore
from quorumlog.ha.wire import HAFrame
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.resources import Background, Scheduler, Timer

log = logging.getLogger("quorumlog.ha")

ControllerCall = RegisterBroker | BrokerHeartbeat | AlterSyncStateSet
ControllerDone = Callable[[HAControllerResult | None], None]


class HALinks(Protocol):
    """Connections between the brokers of a group (frames are `ha.wire` frames)."""

    def connect(self, address: str) -> int:
        """Open a connection to a master's HA address and return its id. `connected(id)` or
        `connection_lost(id)` follows on the host, later, never from inside this call."""
        ...

    def send(self, connection_id: int, frame: HAFrame) -> None:
        """Send in order on the connection; never blocks, never raises (a broken connection
        is reported with `connection_lost`)."""
        ...

    def close(self, connection_id: int) -> None:
        """Close the connection; the host ignores any event of it that still comes."""
        ...


class ControllerAccess(Protocol):
    def submit(self, command: ControllerCall, done: ControllerDone) -> None:
        """Send `command` to the HA controller; call `done` exactly once, on the host's
        thread and never from inside this call, with the controller's result, or None if
        the outcome is unknown."""
        ...


class SyncHere:
    """A `Background` that runs each job at once, on the caller's thread (the default: the
    host then syncs on its own thread, as a test or a simple world wants)."""

    def submit(self, job: Callable[[], None], done: Callable[[BaseException | None], None]) -> None:
        try:
            job()
        except Exception as error:  # reported to the host, as a thread pool does
            done(error)
            return
        done(None)


class BrokerHostConfig(msgspec.Struct, frozen=True, kw_only=True):
    replication: HAReplicationConfig = HAReplicationConfig()
    tick_seconds: float = 0.05
    """How often the cores' time-driven actions run (transfer heartbeats, shrink)."""
    controller_heartbeat_seconds: float = 0.3
    """Several heartbeats fit in the controller's broker timeout (1.5 s by default)."""
    reconnect_seconds: float = 0.2
    """A slave whose connection to its master failed tries again after this long."""
    pending_produces_max: int = 100_000
    """Produces written and not yet acknowledged; more are refused, not queued."""

    def validate(self) -> None:
        self.replication.validate()
        for name in ("tick_seconds", "controller_heartbeat_seconds", "reconnect_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.pending_produces_max < 1:
            raise ValueError("pending_produces_max must be >= 1")


class BrokerStatus(msgspec.Struct, frozen=True):
    """What a broker reports about itself (`quorumlog ha epochs`)."""

    group: str
    broker_id: str
    role: str
    """"master", "slave", "fenced", "none", or "failed" (stepped out after a failed sync)."""
    master_id: str | None
    master_epoch: int
    max_offset: int
    confirm_offset: int
    epochs: list[EpochEntry]


class BrokerHost:
    """Drives one broker of one broker group. See the module docstring."""

    def __init__(
        self,
        *,
        scheduler: Scheduler,
        links: HALinks,
        controller: ControllerAccess,
        commit_log: CommitLog,
        epoch_file: EpochFile,
        group: str,
        broker_id: str,
        address: str,
        config: BrokerHostConfig | None = None,
        on_truncated: Callable[[int], None] | None = None,
        on_role_changed: Callable[[], None] | None = None,
        background: Background | None = None,
        on_failed: Callable[[HASyncFailedError], None] | None = None,
    ) -> None:
        self.config = config or BrokerHostConfig()
        self.config.validate()
        self.scheduler = scheduler
        self.links = links
        self.controller = controller
        self.commit_log = commit_log
        self.epoch_file = epoch_file
        self.group = group
        self.broker_id = broker_id
        self.address = address
        self.on_truncated = on_truncated
        """Called with the offset a slave's log was cut to (whoever indexes the log)."""
        self.on_role_changed = on_role_changed
        self.master: MasterCore | None = None
        self.slave: SlaveCore | None = None
        self.view: BrokerGroupInfo | None = None
        """The controller's view last followed."""
        self.role_epoch = 0
        """The MasterEpoch of the role held (views older than it are stale)."""
        self.slave_connection: int | None = None
        self.accepted: set[int] = set()
        """Connections from slaves, while this broker is master."""
        self.pending: list[tuple[int, int, Completion[int]]] = []
        """A heap of (end offset, arrival, completion) of produces not yet acknowledged
        (a retried produce may wait on an offset below those already waiting)."""
        self.arrivals = itertools.count()
        self.background = background or SyncHere()
        """Where the commit log's syncs run (see the module docstring)."""
        self.sync_in_flight: CommitLogSync | None = None
        self.failure: HASyncFailedError | None = None
        """A sync failed: the broker stepped out (see `step_out`) until its log is reopened,
        which takes a new host."""
        self.on_failed = on_failed
        """Called once when the broker steps out (the node reopens the log after a full
        disk)."""
        self.flush_scheduled = False
        self.registered = False
        self.heartbeat_in_flight = False
        self.closed = False
        self.tick_timer: Timer | None = None
        self.heartbeat_timer: Timer | None = None
        self.reconnect_timer: Timer | None = None
        self.last_truncation: tuple[int, int] | None = None
        self.truncations = 0
        self.acknowledged_offset = 0

    # --- life ----------------------------------------------------------------------------

    def start(self) -> None:
        """Register with the controller and start the timers."""
        self.register()
        self.tick_timer = self.scheduler.call_later(self.config.tick_seconds, self.tick)
        self.heartbeat_timer = self.scheduler.call_later(
            self.config.controller_heartbeat_seconds, self.heartbeat_tick
        )

    def close(self) -> None:
        """Stop: timers, connections, and every produce waiting (outcome unknown)."""
        self.closed = True
        for timer in (self.tick_timer, self.heartbeat_timer, self.reconnect_timer):
            if timer is not None:
                timer.cancel()
        self.drop_role(MasterFencedError(f"broker {self.broker_id} of {self.group} stopped"))

    def now_ms(self) -> int:
        return int(self.scheduler.monotonic_seconds() * 1000)

    # --- what the broker serves ------------------------------------------------------------

    @property
    def is_master(self) -> bool:
        return self.master is not None and not self.master.fenced

    @property
    def sync_failed(self) -> bool:
        return self.failure is not None

    @property
    def master_address(self) -> str | None:
        """The HA address of the master the controller names (None if none or unknown)."""
        view = self.view
        if view is None or view.master_id is None:
            return None
        for broker in view.brokers:
            if broker.broker_id == view.master_id:
                return broker.address
        return None

    @property
    def confirm_offset(self) -> int:
        core = self.master or self.slave
        return core.confirm_offset if core is not None else 0

    def append_refusal(self) -> HAReplicationError | None:
        """Why `append` would refuse now (None: it would write)."""
        if self.failure is not None:
            return self.failure
        master = self.master
        if master is None or master.fenced:
            return MasterFencedError(
                f"broker {self.broker_id} is not the master of {self.group} "
                f"(master: {self.view.master_id if self.view else None})"
            )
        if len(master.sync_state_set) < self.config.replication.min_in_sync:
            return NotEnoughReplicasError(list(master.sync_state_set), master.config.min_in_sync)
        if len(self.pending) >= self.config.pending_produces_max:
            return HAPendingFullError(
                f"{len(self.pending)} produces wait for acknowledgement at {self.broker_id}"
            )
        return None

    def append(self, messages: Sequence[bytes]) -> int:
        """Write a produce at the master; returns its end offset (then `wait_acknowledged`).
        Raises what `append_refusal` names: HASyncFailedError if the broker stepped out after
        a failed sync, MasterFencedError if this broker is not master, NotEnoughReplicasError
        if the SyncStateSet is too small, HAPendingFullError if too many produces wait."""
        refusal = self.append_refusal()
        if refusal is not None:
            raise refusal
        master = self.master
        assert master is not None  # append_refusal said so
        try:
            end_offset = master.append(messages)
        except StorageError as error:
            # A full disk or an I/O error while writing: as for a failed sync, step out
            # (a replica with room takes over; whoever admitted this produce, such as a
            # node's producer table, must forget it: the broker is replaced).
            self.step_out(error)
            assert self.failure is not None  # step_out set it
            raise self.failure from error
        self.schedule_flush()
        return end_offset

    def wait_acknowledged(self, end_offset: int) -> Completion[int]:
        """Completes with `end_offset` once every SyncStateSet member has the log up to it
        (fails with MasterFencedError if this mastership ends first)."""
        completion: Completion[int] = Completion(self.scheduler)
        if self.failure is not None:
            completion.set_exception(self.failure)
        elif end_offset <= self.acknowledged_offset and self.is_master:
            completion.set_result(end_offset)
        elif not self.is_master:
            completion.set_exception(MasterFencedError(f"{self.broker_id} is not master"))
        else:
            heapq.heappush(self.pending, (end_offset, next(self.arrivals), completion))
        return completion

    def produce(self, messages: Sequence[bytes]) -> Completion[int]:
        """`append` then `wait_acknowledged`, errors as a failed completion."""
        try:
            end_offset = self.append(messages)
        except QuorumLogError as error:
            return Completion.failed(self.scheduler, error)
        return self.wait_acknowledged(end_offset)

    def read(self, offset: int, bytes_max: int) -> CommitLogBatch | None:
        """Messages from `offset` (a message boundary) of one epoch; the caller keeps those
        that end at or below `confirm_offset`."""
        return self.commit_log.read_batch(offset, bytes_max)

    def status(self) -> BrokerStatus:
        if self.failure is not None:
            role = "failed"
        elif self.master is not None:
            role = "fenced" if self.master.fenced else "master"
        else:
            role = "slave" if self.slave is not None else "none"
        view = self.view
        return BrokerStatus(
            group=self.group,
            broker_id=self.broker_id,
            role=role,
            master_id=view.master_id if view else None,
            master_epoch=self.role_epoch,
            max_offset=self.commit_log.max_offset,
            confirm_offset=self.confirm_offset,
            epochs=list(self.epoch_file.entries),
        )

    # --- the controller --------------------------------------------------------------------

    def register(self) -> None:
        if self.failure is not None:
            return  # stepped out: the controller must stop counting this broker alive
        command = RegisterBroker(self.group, self.broker_id, self.address)
        self.controller.submit(command, self.registered_answer)

    def registered_answer(self, result: HAControllerResult | None) -> None:
        if self.closed:
            return
        if result is None or not result.ok or result.group is None:
            why = "no answer" if result is None else result.error
            log.info("HA broker %s/%s: register: %s", self.group, self.broker_id, why)
            self.scheduler.call_later(self.config.reconnect_seconds, self.register_again)
            return
        self.registered = True
        self.follow(result.group)

    def register_again(self) -> None:
        if not self.closed and not self.registered:
            self.register()

    def heartbeat_tick(self) -> None:
        if self.closed:
            return
        self.heartbeat_timer = self.scheduler.call_later(
            self.config.controller_heartbeat_seconds, self.heartbeat_tick
        )
        self.heartbeat()

    def heartbeat(self) -> None:
        if not self.registered or self.heartbeat_in_flight or self.failure is not None:
            return
        self.heartbeat_in_flight = True
        command = BrokerHeartbeat(
            self.group, self.broker_id, self.commit_log.max_offset, self.epoch_file.last_epoch
        )
        self.controller.submit(command, self.heartbeat_answer)

    def heartbeat_answer(self, result: HAControllerResult | None) -> None:
        self.heartbeat_in_flight = False
        if self.closed or result is None:
            return
        if result.ok and result.group is not None:
            self.follow(result.group)
        elif result.refusal in (Refusal.UNKNOWN_GROUP, Refusal.UNKNOWN_BROKER):
            self.registered = False  # the controller lost us (a new group): register again
            self.register()

    def forward_alter(self, master: MasterCore, request: RequestAlterSyncStateSet) -> None:
        command = AlterSyncStateSet(
            request.group,
            request.master_id,
            request.master_epoch,
            request.sync_state_set_epoch,
            list(request.new_set),
        )

        def answered(result: HAControllerResult | None) -> None:
            if self.closed or self.master is not master:
                return  # the mastership that asked is over
            if result is None:
                master.alter_sync_state_set_unknown()
            elif result.ok and result.group is not None:
                group = result.group
                master.alter_sync_state_set_done(
                    group.sync_state_set, group.sync_state_set_epoch, self.now_ms()
                )
                self.follow(group)
            else:
                master.alter_sync_state_set_refused()
                self.heartbeat()  # learn what changed (a newer master fences this one)
            self.schedule_flush()

        self.controller.submit(command, answered)

    # --- following the controller's view -----------------------------------------------------

    def follow(self, view: BrokerGroupInfo) -> None:
        """Take the role `view` names (see the module docstring)."""
        if self.closed or view.group != self.group or view.master_epoch < self.role_epoch:
            return
        self.view = view
        if self.failure is not None:
            return  # stepped out: no role until the log is reopened
        master, slave = self.master, self.slave
        if master is not None:
            master.controller_view(
                view.master_id,
                view.master_epoch,
                view.sync_state_set,
                view.sync_state_set_epoch,
                self.now_ms(),
            )
            if view.master_id == self.broker_id and view.master_epoch == master.master_epoch:
                self.schedule_flush()
                return
        if (
            slave is not None
            and view.master_id == slave.master_id
            and view.master_epoch == slave.master_epoch
        ):
            return
        if view.master_id is None:
            if master is not None or slave is not None:
                self.drop_role(MasterFencedError(f"{self.group} has no master"))
                self.role_epoch = view.master_epoch
                self.role_changed()
            return
        try:
            if view.master_id == self.broker_id:
                self.become_master(view)
            else:
                self.become_slave(view)
        except StorageError as error:  # truncating, syncing or the epoch file failed
            self.step_out(error)

    def drop_role(self, error: HAReplicationError) -> None:
        if self.slave_connection is not None:
            self.links.close(self.slave_connection)
            self.slave_connection = None
        for connection_id in sorted(self.accepted):
            self.links.close(connection_id)
        self.accepted.clear()
        if self.reconnect_timer is not None:
            self.reconnect_timer.cancel()
            self.reconnect_timer = None
        self.master = None
        self.slave = None
        self.fail_pending(error)

    def fail_pending(self, error: HAReplicationError) -> None:
        pending, self.pending = self.pending, []
        for _, _, completion in sorted(pending, key=lambda item: item[:2]):
            completion.set_exception(error)

    def become_master(self, view: BrokerGroupInfo) -> None:
        confirm_offset = self.confirm_offset
        self.drop_role(MasterFencedError(f"{self.broker_id} changes role"))
        self.role_epoch = view.master_epoch
        self.master = MasterCore(
            group=self.group,
            broker_id=self.broker_id,
            master_epoch=view.master_epoch,
            sync_state_set=view.sync_state_set or [self.broker_id],
            sync_state_set_epoch=view.sync_state_set_epoch,
            commit_log=self.commit_log,
            epoch_file=self.epoch_file,
            now_ms=self.now_ms(),
            config=self.config.replication,
            confirm_offset=confirm_offset,
        )
        self.acknowledged_offset = self.master.acknowledged_offset
        log.info(
            "HA broker %s/%s: master at MasterEpoch %d from offset %d",
            self.group,
            self.broker_id,
            view.master_epoch,
            self.commit_log.max_offset,
        )
        self.role_changed()
        self.schedule_flush()

    def become_slave(self, view: BrokerGroupInfo) -> None:
        confirm_offset = self.confirm_offset
        self.drop_role(MasterFencedError(f"{self.broker_id} is now a slave"))
        master_id = view.master_id
        if master_id is None:
            return
        self.role_epoch = view.master_epoch
        self.slave = SlaveCore(
            broker_id=self.broker_id,
            address=self.address,
            master_id=master_id,
            master_epoch=view.master_epoch,
            commit_log=self.commit_log,
            epoch_file=self.epoch_file,
            confirm_offset=confirm_offset,
        )
        log.info(
            "HA broker %s/%s: slave of %s at MasterEpoch %d",
            self.group,
            self.broker_id,
            master_id,
            view.master_epoch,
        )
        self.role_changed()
        self.connect_to_master()

    def role_changed(self) -> None:
        if self.on_role_changed is not None:
            self.on_role_changed()

    # --- the slave's connection --------------------------------------------------------------

    def connect_to_master(self) -> None:
        self.reconnect_timer = None
        address = self.master_address
        if self.closed or self.slave is None or self.slave_connection is not None:
            return
        if address is None:
            self.schedule_reconnect()
            return
        self.slave_connection = self.links.connect(address)

    def schedule_reconnect(self) -> None:
        if self.reconnect_timer is None and not self.closed:
            self.reconnect_timer = self.scheduler.call_later(
                self.config.reconnect_seconds, self.connect_to_master
            )

    def lose_slave_connection(self, reason: str | None) -> None:
        if self.slave_connection is not None:
            self.links.close(self.slave_connection)
            self.slave_connection = None
        if self.slave is not None:
            self.slave.connection_lost()
            if reason is not None:
                log.info("HA broker %s/%s: %s", self.group, self.broker_id, reason)
            self.schedule_reconnect()

    def slave_actions(self, actions: SlaveActions) -> None:
        connection_id = self.slave_connection
        if connection_id is not None:
            for frame in actions.sends:
                self.links.send(connection_id, frame)
        if actions.disconnect is not None:
            self.lose_slave_connection(actions.disconnect)
        if actions.sync:
            self.start_sync()

    # --- events from the links ---------------------------------------------------------------

    def connected(self, connection_id: int) -> None:
        """An outgoing connection (to the master) is open."""
        if connection_id != self.slave_connection or self.slave is None:
            self.links.close(connection_id)
            return
        self.slave_actions(self.slave.connect())

    def frame_received(self, connection_id: int, frame: HAFrame) -> None:
        if self.closed:
            return
        if connection_id == self.slave_connection:
            self.slave_frame(frame)
            return
        master = self.master
        if master is None:
            self.links.close(connection_id)  # a slave that thinks this broker is master
            return
        self.accepted.add(connection_id)
        master.receive(connection_id, frame, self.now_ms())
        self.schedule_flush()

    def slave_frame(self, frame: HAFrame) -> None:
        slave = self.slave
        if slave is None:
            return
        truncation = slave.last_truncation
        try:
            actions = slave.receive(frame)
        except HAHandshakeRefusedError as error:
            self.lose_slave_connection(str(error))
            self.heartbeat()  # the refusal may mean a newer master: ask
            return
        except StorageError as error:  # appending, truncating or the epoch file failed
            self.step_out(error)
            return
        if slave.last_truncation is not truncation and slave.last_truncation is not None:
            self.truncated(slave.last_truncation)
        self.slave_actions(actions)

    def truncated(self, truncation: tuple[int, int]) -> None:
        before, offset = truncation
        self.last_truncation = truncation
        if before != offset:
            self.truncations += 1
            log.info(
                "HA broker %s/%s: handshake truncated the commit log from %d to %d",
                self.group,
                self.broker_id,
                before,
                offset,
            )
        if self.on_truncated is not None:
            self.on_truncated(offset)

    def connection_lost(self, connection_id: int) -> None:
        if connection_id == self.slave_connection:
            self.slave_connection = None
            self.lose_slave_connection(None)
            return
        if connection_id in self.accepted:
            self.accepted.discard(connection_id)
            if self.master is not None:
                self.master.connection_closed(connection_id)

    # --- the master's actions ----------------------------------------------------------------

    def tick(self) -> None:
        if self.closed:
            return
        self.tick_timer = self.scheduler.call_later(self.config.tick_seconds, self.tick)
        self.flush()

    def schedule_flush(self) -> None:
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.scheduler.call_soon(self.flush)

    def flush(self) -> None:
        """Act on what the master core decided, then sync what was appended."""
        self.flush_scheduled = False
        master = self.master
        if self.closed or master is None:
            return
        # Replicate first, then sync: the slaves write their disks while this one syncs
        # (the Raft leader's order). Nothing is acknowledged before the sync returns: the
        # master's own durable offset bounds confirmOffset.
        self.master_actions(master, master.take_actions(self.now_ms()))
        if self.master is master:
            self.start_sync()

    # --- syncs ---------------------------------------------------------------------------------

    def start_sync(self) -> None:
        """Begin a sync of what was appended, unless one is in flight (it begins the next
        when it returns) or everything is durable."""
        log = self.commit_log
        if (
            self.sync_in_flight is not None
            or self.closed
            or self.failure is not None
            or log.durable_offset >= log.max_offset
        ):
            return
        captured = log.begin_sync()
        self.sync_in_flight = captured
        self.background.submit(captured.run, lambda error: self.sync_done(captured, error))

    def sync_done(self, captured: CommitLogSync, error: BaseException | None) -> None:
        """On the host's thread: a sync returned; count what it made durable."""
        self.sync_in_flight = None
        self.commit_log.finish_sync(captured, error)
        if self.closed:
            return
        if error is not None:
            self.step_out(error)
            return
        master, slave = self.master, self.slave
        if master is not None:
            master.synced()
            self.master_actions(master, master.take_actions(self.now_ms()))
        elif slave is not None:
            self.slave_actions(slave.synced())
        self.start_sync()  # what was appended while this one ran

    def step_out(self, error: BaseException) -> None:
        """A sync failed (or a write to the log or the epoch file did): the kernel may have
        dropped the pages it was writing, so nothing more from this log may count as durable
        until the broker reopens it. Rather than
        hold produces until a restart: fail the waiting ones (outcome unknown: the slaves
        may hold them durably, and a new master may keep them), refuse new ones, close the
        replication connections, and fall silent to the controller, which then elects a
        master from the SyncStateSet members still alive (a slave that steps out stops
        acking and leaves the set by the usual shrink). Other brokers on the node go on."""
        if self.failure is not None:
            return  # stepped out already
        disk_full = isinstance(error, DiskFullError)
        failure = HASyncFailedError(self.group, self.broker_id, str(error), disk_full)
        self.failure = failure
        log.error("HA broker %s/%s: %s", self.group, self.broker_id, failure)
        self.drop_role(failure)
        if self.on_failed is not None:
            self.on_failed(failure)

    def master_actions(self, master: MasterCore, actions: MasterActions) -> None:
        for send in actions.sends:
            self.links.send(send.connection_id, send.frame)
        for disconnect in actions.disconnects:
            self.accepted.discard(disconnect.connection_id)
            self.links.close(disconnect.connection_id)
        if actions.alter_sync_state_set is not None:
            self.forward_alter(master, actions.alter_sync_state_set)
        if master.fenced:
            self.fail_pending(MasterFencedError(f"{self.broker_id} was fenced"))
            return
        self.acknowledged_offset = actions.acknowledged_offset
        pending = self.pending
        while pending and pending[0][0] <= actions.acknowledged_offset:
            end_offset, _, completion = heapq.heappop(pending)
            completion.set_result(end_offset)


__all__ = [
    "BrokerHost",
    "BrokerHostConfig",
    "BrokerStatus",
    "ControllerAccess",
    "ControllerCall",
    "HALinks",
    "SyncHere",
]
