"""The HA controller in the simulator: the SHIPPED machine and service on the Raft simulator.

Every controller node of a `SimCluster` runs `ha.controller_machine.HAControllerMachine`
(wrapped only to observe what it applies: `ObservedControllerMachine`) behind the shipped
`node.ha_controller_service.HAControllerService`, with its periodic election check on the
node's scheduler. Brokers reach it with the code real brokers run: the shipped
`node.ha_controller_access.RequestControllerAccess` (sequences, lanes, answers) on the
shipped attempt loop (`node.peer_requests.request_by_attempts`: leader hints, timeouts,
back-off), its `codec.wire.HAControllerRequest` frames sent over the simulated network.
"""

from __future__ import annotations

from collections.abc import Callable

from quorumlog.codec import wire
from quorumlog.ha.broker_host import ControllerCall, ControllerDone
from quorumlog.ha.controller_machine import HAControllerMachine
from quorumlog.ha.controller_model import AlterSyncStateSet, HAControllerResult
from quorumlog.node.ha_controller_access import ControllerAccessConfig, RequestControllerAccess
from quorumlog.node.ha_controller_service import HAControllerService
from quorumlog.runtime.handle import GroupHandle
from quorumlog.testing.sim.application import LeaderAddress, SimApplication, serving_only
from quorumlog.testing.sim.frame_network import RequestHandler, SimFrameNetwork
from quorumlog.testing.sim.node import client_address
from quorumlog.testing.sim.process import SimProcess
from quorumlog.testing.sim.shardkv.transport import FrameCalls, SimPeerRequests

CHECK_INTERVAL_SECONDS = 0.1
ACCESS_CONFIG = ControllerAccessConfig(timeout_seconds=1.0, attempt_timeout_seconds=0.3)
"""Shorter than a node's: the simulated controller declares a broker dead after 1 s of
silence (a node's after 1.5 s), and an attempt at a dead node must end well before."""

ApplyObserver = Callable[[HAControllerMachine, dict[str, tuple[str | None, int, list[str]]]], None]
"""Told after every entry a controller machine applies: the machine and, per group, its
(master, MasterEpoch, SyncStateSet) BEFORE the entry."""


class ObservedControllerMachine(HAControllerMachine):
    """The shipped machine; `apply` also reports to the checker (it changes nothing)."""

    observer: ApplyObserver | None = None

    def apply(self, index: int, data: bytes) -> list[list[HAControllerResult]]:
        before = {
            name: (state.master_id, state.master_epoch, list(state.sync_state_set))
            for name, state in self.groups.items()
        }
        results = super().apply(index, data)
        if self.observer is not None:
            self.observer(self, before)
        return results


def controller_application(
    heartbeat_timeout_ms: int, observer: ApplyObserver
) -> SimApplication[ObservedControllerMachine]:
    def machine_factory() -> ObservedControllerMachine:
        machine = ObservedControllerMachine(heartbeat_timeout_ms)
        machine.observer = observer
        return machine

    def service_factory(
        group: GroupHandle, machine: ObservedControllerMachine, leader_address: LeaderAddress
    ) -> RequestHandler:
        service = HAControllerService(group, machine, leader_address, CHECK_INTERVAL_SECONDS)
        service.start()
        return serving_only(wire.HAControllerRequest, service.handle, "controller")

    return SimApplication(machine_factory, service_factory)


class LosableAlterAnswers:
    """The shipped access with a fault on top: while `lose()` says so, the answer to an
    AlterSyncStateSet is lost after the controller applied it (apache/rocketmq #5663)."""

    def __init__(self, access: RequestControllerAccess, lose: Callable[[], bool]) -> None:
        self.access = access
        self.lose = lose

    def submit(self, command: ControllerCall, done: ControllerDone) -> None:
        if not isinstance(command, AlterSyncStateSet):
            self.access.submit(command, done)
            return

        def answered(result: HAControllerResult | None) -> None:
            done(None if result is not None and self.lose() else result)

        self.access.submit(command, answered)


def broker_controller_access(
    name: str,
    process: SimProcess,
    frames: SimFrameNetwork,
    node_ids: list[str],
    client_id: str,
    lose_alter_answers: Callable[[], bool],
) -> LosableAlterAnswers:
    """A broker's way to the controller: the shipped `RequestControllerAccess` on the
    shipped attempt loop, its attempts sent as simulated frames."""
    calls = FrameCalls(name, frames, process)
    access = RequestControllerAccess(
        SimPeerRequests(calls),
        calls.scheduler,
        [client_address(node_id) for node_id in node_ids],
        ACCESS_CONFIG,
        client_id=client_id,
    )
    return LosableAlterAnswers(access, lose_alter_answers)
