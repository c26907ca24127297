"""BrokerHosts on a ManualScheduler, with in-memory links and the real controller machine.

Frames cross the links encoded and decoded (ha/wire.py), each delivery a soon callback, so
nothing is answered inline. The controller applies every command through
`HAControllerMachine` stamped with the scheduler's wall clock; `answers_lost` makes it apply
but answer None (outcome unknown), as a timed-out call would.
"""

from __future__ import annotations

import functools
import itertools
import random
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from quorumlog.ha.broker_host import BrokerHost, BrokerHostConfig, ControllerCall, ControllerDone
from quorumlog.ha.commit_log import MmapCommitLog
from quorumlog.ha.controller_machine import HAControllerMachine
from quorumlog.ha.controller_model import (
    ElectMaster,
    HAControllerBatch,
    HAControllerCommand,
    HAControllerEntry,
    HAControllerResult,
    encode_entry,
)
from quorumlog.ha.epoch_file import EpochFile
from quorumlog.ha.replication_actions import HAReplicationConfig
from quorumlog.ha.wire import HAFrame, decode_frame, encode_frame
from quorumlog.storage.base import SyncPolicy
from quorumlog.testing.manual import ManualScheduler
from quorumlog.testing.sim.filesystem import SimFileSystem

GROUP = "group-a"
HEARTBEAT_TIMEOUT_MS = 1_000


class MachineController:
    def __init__(self, scheduler: ManualScheduler) -> None:
        self.scheduler = scheduler
        self.machine = HAControllerMachine(broker_heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS)
        self.index = 0
        self.sequence = itertools.count(1)
        self.answers_lost = False
        self.unreachable: set[str] = set()
        """Brokers whose calls never reach the controller (answered None)."""

    def run(self, command: HAControllerCommand) -> HAControllerResult:
        self.index += 1
        entry = HAControllerEntry(
            timestamp_ms=self.scheduler.wall_time_ms(),
            batches=[HAControllerBatch("c", 0, [command])],
        )
        [[result]] = self.machine.apply(self.index, encode_entry(entry))
        return result

    def access(self, broker_id: str) -> BrokerControllerAccess:
        return BrokerControllerAccess(self, broker_id)

    def elect_if_silent(self) -> None:
        """What the controller leader's periodic check does."""
        for name, epoch in self.machine.groups_needing_election(self.scheduler.wall_time_ms()):
            self.run(ElectMaster(name, automatic=True, expected_master_epoch=epoch))


@dataclass
class BrokerControllerAccess:
    controller: MachineController
    broker_id: str

    def submit(self, command: ControllerCall, done: ControllerDone) -> None:
        controller = self.controller
        if self.broker_id in controller.unreachable:
            controller.scheduler.call_soon(lambda: done(None))
            return
        result = controller.run(
            msgspec.structs.replace(command, sequence=next(controller.sequence))
        )
        answer = None if controller.answers_lost else result
        controller.scheduler.call_soon(lambda: done(answer))


@dataclass
class Network:
    scheduler: ManualScheduler
    hosts: dict[str, BrokerHost] = field(default_factory=dict)
    """By HA address."""
    ends: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)
    """(address, connection id) -> the other end."""
    connection_ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    cut: set[str] = field(default_factory=set)
    """Addresses that no connection reaches."""
    frames_sent: int = 0

    def links(self, address: str) -> MemoryLinks:
        return MemoryLinks(self, address)

    def deliver(self, address: str, connection_id: int, data: bytes) -> None:
        host = self.hosts.get(address)
        if host is not None and (address, connection_id) in self.ends:
            host.frame_received(connection_id, decode_frame(data))

    def break_connection(self, address: str, connection_id: int) -> None:
        other = self.ends.pop((address, connection_id), None)
        if other is None:
            return
        self.ends.pop(other, None)
        host = self.hosts.get(other[0])
        if host is not None:
            self.scheduler.call_soon(lambda: host.connection_lost(other[1]))

    def isolate(self, address: str) -> None:
        """Cut `address` off: both ends of its connections hear they were lost."""
        self.cut.add(address)
        host = self.hosts.get(address)
        for here in [key for key in self.ends if key[0] == address]:
            self.break_connection(*here)
            if host is not None:
                self.scheduler.call_soon(functools.partial(host.connection_lost, here[1]))


@dataclass
class MemoryLinks:
    network: Network
    address: str

    def connect(self, address: str) -> int:
        network = self.network
        mine, theirs = next(network.connection_ids), next(network.connection_ids)
        host = network.hosts.get(self.address)
        reachable = (
            address in network.hosts
            and address not in network.cut
            and self.address not in network.cut
        )
        if not reachable:
            if host is not None:
                network.scheduler.call_soon(lambda: host.connection_lost(mine))
            return mine
        network.ends[(self.address, mine)] = (address, theirs)
        network.ends[(address, theirs)] = (self.address, mine)
        if host is not None:
            network.scheduler.call_soon(lambda: host.connected(mine))
        return mine

    def send(self, connection_id: int, frame: HAFrame) -> None:
        network = self.network
        other = network.ends.get((self.address, connection_id))
        if other is None:
            return
        network.frames_sent += 1
        data = encode_frame(frame)
        network.scheduler.call_soon(lambda: network.deliver(other[0], other[1], data))

    def close(self, connection_id: int) -> None:
        self.network.break_connection(self.address, connection_id)


class HostedBroker:
    def __init__(self, broker_id: str, root: Path, cluster: BrokerCluster) -> None:
        self.broker_id = broker_id
        self.address = f"{broker_id}:7000"
        self.root = root
        self.cluster = cluster
        self.disk = SimFileSystem(random.Random(broker_id))
        self.host: BrokerHost | None = None
        self.truncated_to: list[int] = []

    def start(self) -> BrokerHost:
        cluster = self.cluster
        self.log = MmapCommitLog.open(
            self.root / self.broker_id,
            data_file_bytes=4096,
            index_file_bytes=32 * 256,
            sync_policy=SyncPolicy.NEVER,
        )
        self.epochs = EpochFile(Path(f"/{self.broker_id}/epochs"), self.disk)
        host = BrokerHost(
            scheduler=cluster.scheduler,
            links=cluster.network.links(self.address),
            controller=cluster.controller.access(self.broker_id),
            commit_log=self.log,
            epoch_file=self.epochs,
            group=GROUP,
            broker_id=self.broker_id,
            address=self.address,
            config=cluster.config,
            on_truncated=self.truncated_to.append,
        )
        cluster.network.hosts[self.address] = host
        self.host = host
        host.start()
        return host

    def stop(self) -> None:
        """The process dies: connections drop, the log's page cache survives."""
        host = self.host
        assert host is not None
        network = self.cluster.network
        for here in [key for key in network.ends if key[0] == self.address]:
            network.break_connection(*here)
        del network.hosts[self.address]
        host.close()
        self.log.close()
        self.disk.process_crash()
        self.host = None

    def messages(self) -> list[bytes]:
        found: list[bytes] = []
        offset = self.log.min_offset
        while (batch := self.log.read_batch(offset, 1 << 20)) is not None:
            found.extend(batch.messages)
            offset = batch.end_offset
        return found


class BrokerCluster:
    def __init__(self, root: Path, broker_ids: list[str], min_in_sync: int = 2) -> None:
        self.scheduler = ManualScheduler()
        self.network = Network(self.scheduler)
        self.controller = MachineController(self.scheduler)
        self.config = BrokerHostConfig(
            replication=HAReplicationConfig(
                heartbeat_interval_ms=100,
                ha_max_time_slave_not_catch_up_ms=2_000,
                alter_retry_interval_ms=300,
                min_in_sync=min_in_sync,
            ),
            tick_seconds=0.05,
            controller_heartbeat_seconds=0.2,
            reconnect_seconds=0.1,
        )
        self.brokers = {broker_id: HostedBroker(broker_id, root, self) for broker_id in broker_ids}

    def host(self, broker_id: str) -> BrokerHost:
        host = self.brokers[broker_id].host
        assert host is not None
        return host

    def master_id(self) -> str | None:
        info = self.controller.machine.group_info(GROUP)
        return info.master_id if info else None

    def run(self, seconds: float) -> None:
        """Move time in steps, with the controller leader's check between them."""
        steps = max(1, round(seconds / 0.05))
        for _ in range(steps):
            self.scheduler.advance(0.05)
            self.controller.elect_if_silent()

    def run_until(self, condition: object, seconds_max: float = 20.0) -> None:
        """Advance until `condition()` holds; fail after `seconds_max` of virtual time."""
        assert callable(condition)
        waited = 0.0
        while not condition():
            if waited >= seconds_max:
                raise AssertionError(f"not within {seconds_max} virtual seconds")
            self.run(0.05)
            waited += 0.05
