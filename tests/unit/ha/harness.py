"""A manual pump for the HA replication cores: brokers, links, a stand-in controller.

Each broker has a real `MmapCommitLog` (small files, in tmp_path) and an `EpochFile` on its
own simulated disk. Links carry frames in order (a TCP connection); `pump` moves frames and
actions until nothing moves. The controller here keeps only what these tests need of
the real one (ha/controller_machine.py, the controller engineer's): one master per
MasterEpoch, epochs that only grow, AlterSyncStateSet only from the current master with the
current epochs.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from quorumlog.ha.commit_log import MmapCommitLog
from quorumlog.ha.epoch_file import EpochFile
from quorumlog.ha.replication_actions import HAReplicationConfig, RequestAlterSyncStateSet
from quorumlog.ha.replication_master import MasterCore, ordered_set
from quorumlog.ha.replication_slave import SlaveCore, SlaveState
from quorumlog.ha.wire import HAFrame, decode_frame, encode_frame
from quorumlog.storage.base import SyncPolicy
from quorumlog.testing.sim.filesystem import SimFileSystem

DATA_FILE_BYTES = 2048
GROUP = "group-a"


@dataclass
class StandInController:
    master_id: str | None = None
    master_epoch: int = 0
    sync_state_set: list[str] = field(default_factory=list)
    sync_state_set_epoch: int = 0
    masters_by_epoch: dict[int, str] = field(default_factory=dict)

    def elect(self, broker_id: str) -> None:
        self.master_epoch += 1
        self.master_id = broker_id
        self.masters_by_epoch[self.master_epoch] = broker_id
        if broker_id not in self.sync_state_set:  # only the first election (or unclean)
            self.sync_state_set = [broker_id]
            self.sync_state_set_epoch += 1
        self.sync_state_set = ordered_set(broker_id, self.sync_state_set)

    def alter(self, request: RequestAlterSyncStateSet) -> bool:
        if (
            request.master_id != self.master_id
            or request.master_epoch != self.master_epoch
            or request.sync_state_set_epoch != self.sync_state_set_epoch
        ):
            return False
        self.sync_state_set = list(request.new_set)
        self.sync_state_set_epoch += 1
        return True


@dataclass
class Link:
    connection_id: int
    slave_id: str
    master_id: str
    to_master: deque[bytes] = field(default_factory=deque)
    to_slave: deque[bytes] = field(default_factory=deque)


class Broker:
    def __init__(self, broker_id: str, root: Path, seed: int) -> None:
        self.broker_id = broker_id
        self.root = root
        self.disk = SimFileSystem(random.Random(seed))
        self.master: MasterCore | None = None
        self.slave: SlaveCore | None = None
        self.alive = True
        self.open()

    def open(self) -> None:
        self.log = MmapCommitLog.open(
            self.root / self.broker_id,
            data_file_bytes=DATA_FILE_BYTES,
            index_file_bytes=32 * 128,
            sync_policy=SyncPolicy.NEVER,  # unsynced bytes survive a process crash anyway
        )
        self.epochs = EpochFile(Path(f"/{self.broker_id}/epochs"), self.disk)

    def crash(self) -> None:
        """The process dies (the OS lives: the log's page cache survives, as on a real host)."""
        self.log.close()
        self.disk.process_crash()
        self.master = self.slave = None
        self.alive = False

    def contents(self) -> list[tuple[int, bytes]]:
        """(epoch, message) for every message of the log, in order."""
        found: list[tuple[int, bytes]] = []
        offset = self.log.min_offset
        while (batch := self.log.read_batch(offset, 1 << 20)) is not None:
            found.extend((batch.epoch, message) for message in batch.messages)
            offset = batch.end_offset
        return found


class Cluster:
    def __init__(
        self, root: Path, broker_ids: list[str], config: HAReplicationConfig, seed: int = 0
    ) -> None:
        self.config = config
        self.brokers = {
            broker_id: Broker(broker_id, root, seed * 100 + number)
            for number, broker_id in enumerate(broker_ids)
        }
        self.controller = StandInController()
        self.links: dict[int, Link] = {}
        self.isolated: set[str] = set()
        self.next_connection_id = 1
        self.now_ms = 0
        self.alter_answers_lost = False
        """While set, the controller applies AlterSyncStateSet but its answers are lost."""
        self.acknowledged_offset = 0

    # --- roles ----------------------------------------------------------------------

    @property
    def master(self) -> Broker:
        master_id = self.controller.master_id
        assert master_id is not None
        return self.brokers[master_id]

    def master_core(self) -> MasterCore:
        core = self.master.master
        assert core is not None
        return core

    def elect(self, broker_id: str) -> None:
        """The controller makes `broker_id` master; every live broker takes its role."""
        self.controller.elect(broker_id)
        for link in list(self.links.values()):
            self.close_link(link)
        for broker in self.brokers.values():
            if broker.alive and broker.broker_id not in self.isolated:
                self.take_role(broker)

    def take_role(self, broker: Broker) -> None:
        control = self.controller
        assert control.master_id is not None
        previous = broker.master or broker.slave
        confirm_offset = previous.confirm_offset if previous is not None else 0
        broker.master = broker.slave = None
        if broker.broker_id == control.master_id:
            broker.master = MasterCore(
                group=GROUP,
                broker_id=broker.broker_id,
                master_epoch=control.master_epoch,
                sync_state_set=control.sync_state_set,
                sync_state_set_epoch=control.sync_state_set_epoch,
                commit_log=broker.log,
                epoch_file=broker.epochs,
                now_ms=self.now_ms,
                config=self.config,
                confirm_offset=confirm_offset,
            )
        else:
            broker.slave = SlaveCore(
                broker_id=broker.broker_id,
                address=f"{broker.broker_id}:0",
                master_id=control.master_id,
                master_epoch=control.master_epoch,
                commit_log=broker.log,
                epoch_file=broker.epochs,
                confirm_offset=confirm_offset,
            )

    def crash(self, broker_id: str) -> None:
        for link in list(self.links.values()):
            if broker_id in (link.slave_id, link.master_id):
                self.close_link(link)
        self.brokers[broker_id].crash()

    def restart(self, broker_id: str) -> None:
        broker = self.brokers[broker_id]
        broker.open()
        broker.alive = True
        if broker_id not in self.isolated:
            self.take_role(broker)

    def isolate(self, broker_id: str) -> None:
        self.isolated.add(broker_id)
        for link in list(self.links.values()):
            if broker_id in (link.slave_id, link.master_id):
                self.close_link(link)

    def heal(self, broker_id: str) -> None:
        """The broker hears from the controller again and takes the role it names."""
        self.isolated.discard(broker_id)
        broker = self.brokers[broker_id]
        if not broker.alive:
            return
        if broker.master is not None:
            control = self.controller
            broker.master.controller_view(
                control.master_id,
                control.master_epoch,
                control.sync_state_set,
                control.sync_state_set_epoch,
                self.now_ms,
            )
            if not broker.master.fenced:
                return
        self.take_role(broker)

    # --- links ----------------------------------------------------------------------

    def close_link(self, link: Link) -> None:
        self.links.pop(link.connection_id, None)
        master = self.brokers[link.master_id].master
        if master is not None:
            master.connection_closed(link.connection_id)
        slave = self.brokers[link.slave_id].slave
        if slave is not None:
            slave.connection_lost()

    def connect_slaves(self) -> None:
        control = self.controller
        master = self.brokers[control.master_id] if control.master_id else None
        if master is None or master.master is None or master.broker_id in self.isolated:
            return
        linked = {link.slave_id for link in self.links.values()}
        for broker in self.brokers.values():
            slave = broker.slave
            if slave is None or broker.broker_id in self.isolated or broker.broker_id in linked:
                continue
            if slave.state is not SlaveState.READY or slave.master_id != master.broker_id:
                continue
            link = Link(self.next_connection_id, broker.broker_id, master.broker_id)
            self.next_connection_id += 1
            self.links[link.connection_id] = link
            link.to_master.extend(encode_frame(frame) for frame in slave.connect().sends)

    # --- the pump -------------------------------------------------------------------

    def pump(self, rounds_max: int = 10_000) -> None:
        """Move frames and actions until nothing moves."""
        for _ in range(rounds_max):
            self.connect_slaves()
            moved = self._master_actions()
            for link in list(self.links.values()):
                moved |= self._deliver(link)
            if not moved:
                return
        raise AssertionError("the pump did not settle")

    def _master_actions(self) -> bool:
        moved = False
        for broker in self.brokers.values():
            core = broker.master
            if core is None:
                continue
            actions = core.take_actions(self.now_ms)
            self.on_acknowledged(broker, actions.acknowledged_offset)
            for send in actions.sends:
                link = self.links.get(send.connection_id)
                if link is not None:
                    link.to_slave.append(encode_frame(send.frame))
                    moved = True
            for disconnect in actions.disconnects:
                link = self.links.get(disconnect.connection_id)
                if link is not None:
                    self.close_link(link)
                    moved = True
            request = actions.alter_sync_state_set
            if request is not None and broker.broker_id not in self.isolated:
                moved = True
                self._answer_alter(core, request)
        return moved

    def _answer_alter(self, core: MasterCore, request: RequestAlterSyncStateSet) -> None:
        applied = self.controller.alter(request)
        if self.alter_answers_lost:
            core.alter_sync_state_set_unknown()
        elif applied:
            control = self.controller
            core.alter_sync_state_set_done(
                control.sync_state_set, control.sync_state_set_epoch, self.now_ms
            )
        else:
            core.alter_sync_state_set_refused()
            self.tell_view(core)

    def tell_view(self, core: MasterCore) -> None:
        control = self.controller
        core.controller_view(
            control.master_id,
            control.master_epoch,
            control.sync_state_set,
            control.sync_state_set_epoch,
            self.now_ms,
        )

    def _deliver(self, link: Link) -> bool:
        moved = False
        master = self.brokers[link.master_id].master
        slave = self.brokers[link.slave_id].slave
        while link.to_master and link.connection_id in self.links:
            frame: HAFrame = decode_frame(link.to_master.popleft())
            assert master is not None
            master.receive(link.connection_id, frame, self.now_ms)
            moved = True
        while link.to_slave and link.connection_id in self.links:
            assert slave is not None
            actions = slave.receive(decode_frame(link.to_slave.popleft()))
            link.to_master.extend(encode_frame(frame) for frame in actions.sends)
            if actions.sync:  # the slave syncs at once here, then acks
                slave.commit_log.sync()
                link.to_master.extend(encode_frame(frame) for frame in slave.synced().sends)
            if actions.disconnect is not None:
                self.close_link(link)
            moved = True
        return moved

    def on_acknowledged(self, broker: Broker, offset: int) -> None:
        """Any master's acknowledgement counts: a client of a stale master sees it too."""
        self.acknowledged_offset = max(self.acknowledged_offset, offset)

    # --- produce and time -----------------------------------------------------------

    def produce(self, messages: list[bytes]) -> int:
        core = self.master_core()
        end = core.append(messages)
        core.sync()
        return end

    def advance(self, milliseconds: int) -> None:
        """Time passes; every master that reaches the controller hears its view (as the
        answer to its heartbeat)."""
        self.now_ms += milliseconds
        for broker in self.brokers.values():
            if broker.master is not None and broker.broker_id not in self.isolated:
                self.tell_view(broker.master)
        self.pump()
