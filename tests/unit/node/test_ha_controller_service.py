"""HAControllerService's check on a manual scheduler and a one-replica stand-in group: a
new controller leader waits one heartbeat timeout before electing (the log's clock saw no
heartbeats while there was no leader), then replaces a master that stays silent, once."""

from __future__ import annotations

from typing import Any

from quorumlog.ha.controller_machine import HAControllerMachine
from quorumlog.ha.controller_model import (
    AlterSyncStateSet,
    BrokerHeartbeat,
    HAControllerBatch,
    HAControllerCommand,
    HAControllerEntry,
    RegisterBroker,
    encode_entry,
)
from quorumlog.node.ha_controller_service import HAControllerService
from quorumlog.runtime.completion import Completion
from quorumlog.testing.manual import ManualScheduler

TIMEOUT_MS = 1_000
CHECK_SECONDS = 0.1


class OneReplicaGroup:
    """Enough of a GroupHandle: a proposal applies at once, on this one machine."""

    def __init__(self, scheduler: ManualScheduler, machine: HAControllerMachine) -> None:
        self.scheduler = scheduler
        self.machine = machine
        self.group_id = "ha-controller"
        self.node_id = "n1"
        self.is_leader = False
        self.leader_id: str | None = None
        self.index = 0

    def propose(self, data: bytes) -> Completion[Any]:
        self.index += 1
        completion: Completion[Any] = Completion(self.scheduler)
        completion.set_result(self.machine.apply(self.index, data))
        return completion


def log_commands(group: OneReplicaGroup, *commands: HAControllerCommand) -> None:
    """Commands that reach the log as if through a leader (stamped with the wall clock)."""
    entry = HAControllerEntry(
        group.scheduler.wall_time_ms(), [HAControllerBatch("broker", 0, list(commands))]
    )
    group.propose(encode_entry(entry))


def test_a_new_leader_waits_a_heartbeat_timeout_then_replaces_a_silent_master() -> None:
    scheduler = ManualScheduler()
    machine = HAControllerMachine(broker_heartbeat_timeout_ms=TIMEOUT_MS)
    group = OneReplicaGroup(scheduler, machine)
    service = HAControllerService(group, machine, lambda: None, CHECK_SECONDS)  # type: ignore[arg-type]
    service.start()
    log_commands(
        group,
        RegisterBroker("g", "a", "a:1", 1),
        RegisterBroker("g", "b", "b:1", 2),
        AlterSyncStateSet("g", "a", 1, 1, ["a", "b"], 3),
    )
    # The controller has no leader for two heartbeat timeouts: no heartbeat is logged.
    scheduler.advance(2 * TIMEOUT_MS / 1000)
    group.is_leader = True
    # The brokers' next heartbeats reach the new leader within its grace: no election.
    for _ in range(int(TIMEOUT_MS / 1000 / CHECK_SECONDS)):
        scheduler.advance(CHECK_SECONDS)
        log_commands(group, BrokerHeartbeat("g", "a", 10, 1), BrokerHeartbeat("g", "b", 10, 1))
    scheduler.advance(TIMEOUT_MS / 1000)
    log_commands(group, BrokerHeartbeat("g", "a", 10, 1), BrokerHeartbeat("g", "b", 10, 1))
    assert service.elections_proposed == 0
    info = machine.group_info("g")
    assert info is not None and (info.master_id, info.master_epoch) == ("a", 1)

    # Now a goes silent while b keeps beating: one election, b at MasterEpoch 2.
    for _ in range(3 * int(TIMEOUT_MS / 1000 / CHECK_SECONDS)):
        scheduler.advance(CHECK_SECONDS)
        log_commands(group, BrokerHeartbeat("g", "b", 10, 1))
    info = machine.group_info("g")
    assert info is not None and (info.master_id, info.master_epoch) == ("b", 2)
    assert service.elections_proposed == 1
    service.stop()
    assert scheduler.timer_count == 0


def elect_after_leading(master_reachable: bool) -> tuple[HAControllerMachine, HAControllerService]:
    """A new leader whose node sees master a's node as reachable or not; a was last logged
    a heartbeat timeout ago and b beats to the new leader. Checks for half the grace."""
    scheduler = ManualScheduler()
    machine = HAControllerMachine(broker_heartbeat_timeout_ms=TIMEOUT_MS)
    group = OneReplicaGroup(scheduler, machine)
    service = HAControllerService(
        group,  # type: ignore[arg-type]
        machine,
        lambda: None,
        CHECK_SECONDS,
        node_reachable=lambda node_id: master_reachable or node_id != "a",
    )
    service.start()
    log_commands(
        group,
        RegisterBroker("g", "a", "a:1", 1),
        RegisterBroker("g", "b", "b:1", 2),
        AlterSyncStateSet("g", "a", 1, 1, ["a", "b"], 3),
    )
    scheduler.advance(2 * TIMEOUT_MS / 1000)
    group.is_leader = True
    for _ in range(int(TIMEOUT_MS / 1000 / CHECK_SECONDS) // 2):
        log_commands(group, BrokerHeartbeat("g", "b", 10, 1))
        scheduler.advance(CHECK_SECONDS)
    service.stop()
    return machine, service


def test_a_new_leader_skips_its_grace_for_a_master_whose_node_it_sees_unreachable() -> None:
    machine, service = elect_after_leading(master_reachable=False)
    info = machine.group_info("g")
    assert info is not None and (info.master_id, info.master_epoch) == ("b", 2)
    assert service.elections_proposed == 1


def test_a_new_leader_keeps_its_grace_for_a_master_whose_node_answers() -> None:
    machine, service = elect_after_leading(master_reachable=True)
    info = machine.group_info("g")
    assert info is not None and (info.master_id, info.master_epoch) == ("a", 1)
    assert service.elections_proposed == 0
