"""The HA controller in the simulator: the SHIPPED machine and service on the Raft simulator.

Every controller node of a `SimCluster` runs `ha.controller_machine.HAControllerMachine`
(wrapped only to observe what it applies: `ObservedControllerMachine`) behind the shipped
`node.ha_controller_service.HAControllerService`, with its periodic election check on the
node's scheduler. Brokers reach it as real brokers do: `codec.wire.HAControllerRequest`
frames over the simulated frame network, following NOT_LEADER hints, timing out and trying
another node (`SimControllerAccess`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from quorumlog.codec import wire
from quorumlog.ha.controller_machine import HAControllerMachine
from quorumlog.ha.controller_model import (
    HA_CONTROLLER_QUERY_TYPES,
    AlterSyncStateSet,
    BrokerHeartbeat,
    HAControllerCommand,
    HAControllerResult,
    decode_results,
    encode_commands,
)
from quorumlog.node.ha_controller_service import HAControllerService
from quorumlog.runtime.handle import GroupHandle
from quorumlog.testing.sim.application import LeaderAddress, SimApplication
from quorumlog.testing.sim.frame_network import Replier, RequestHandler, SimFrameNetwork
from quorumlog.testing.sim.node import client_address
from quorumlog.testing.sim.process import SimProcess

CHECK_INTERVAL_SECONDS = 0.1
REQUEST_TIMEOUT_MS = 300
UNSEQUENCED_TYPES: tuple[type, ...] = (*HA_CONTROLLER_QUERY_TYPES, BrokerHeartbeat)
"""Commands the controller does not deduplicate (a repeat is harmless)."""

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

        def handle(request: wire.ClientRequest, reply: Replier) -> None:
            if isinstance(request, wire.HAControllerRequest):
                service.handle(request, reply)
                return
            reply(
                wire.ErrorResponse(
                    request_id=request.request_id,
                    code=wire.ErrorCode.BAD_REQUEST,
                    message=f"the simulated controller serves no {type(request).__name__}",
                )
            )

        return handle

    return SimApplication(machine_factory, service_factory)


@dataclass
class PendingCall:
    command: HAControllerCommand
    sequence: int
    on_result: Callable[[HAControllerResult | None], None]
    answered: bool = False


@dataclass
class SimControllerAccess:
    """A broker's way to the controller: one command per request, an answer or None (no
    answer in time: the outcome is unknown). Deduplicated commands carry a sequence of this
    client; a timed-out one is not retried here (the caller decides, as the cores do)."""

    name: str
    process: SimProcess
    frames: SimFrameNetwork
    node_ids: list[str]
    rng: random.Random
    client_id: str = ""
    next_sequence: int = 1
    next_request_id: int = 1
    target: int = 0
    outstanding: dict[int, PendingCall] = field(default_factory=dict)
    lose_alter_answers: Callable[[], bool] = lambda: False
    """While it says so, the answer to an applied AlterSyncStateSet is lost (#5663)."""

    def submit(
        self, command: HAControllerCommand, on_result: Callable[[HAControllerResult | None], None]
    ) -> None:
        """`ha.broker_host.ControllerAccess`: the answer comes from a later event, never
        from inside this call."""
        sequence = 0
        if not isinstance(command, UNSEQUENCED_TYPES):
            sequence = self.next_sequence
            self.next_sequence += 1
            command = msgspec.structs.replace(command, sequence=sequence)
        pending = PendingCall(command, sequence, on_result)
        self.send(pending, hops_left=3)

    def send(self, pending: PendingCall, hops_left: int) -> None:
        request_id = self.next_request_id
        self.next_request_id += 1
        self.outstanding[request_id] = pending
        first_unacknowledged = min(
            (call.sequence for call in self.outstanding.values() if call.sequence),
            default=self.next_sequence,
        )
        request = wire.HAControllerRequest(
            request_id=request_id,
            client_id=self.client_id,
            commands=encode_commands([pending.command]),
            first_unacknowledged=first_unacknowledged,
        )
        node_id = self.node_ids[self.target % len(self.node_ids)]

        def on_reply(frame: wire.Frame) -> None:
            self.reply(request_id, frame, hops_left)

        self.frames.call(self.name, node_id, request, on_reply)
        self.process.schedule(REQUEST_TIMEOUT_MS, self.timed_out, request_id)

    def reply(self, request_id: int, frame: wire.Frame, hops_left: int) -> None:
        pending = self.outstanding.pop(request_id, None)
        if pending is None or pending.answered:
            return
        if isinstance(frame, wire.HAControllerResponse):
            pending.answered = True
            lost = isinstance(pending.command, AlterSyncStateSet) and self.lose_alter_answers()
            pending.on_result(None if lost else decode_results(frame.results)[0])
            return
        if isinstance(frame, wire.ErrorResponse) and frame.leader_hint is not None:
            hinted = [
                position
                for position, node_id in enumerate(self.node_ids)
                if client_address(node_id) == frame.leader_hint
            ]
            if hinted:
                self.target = hinted[0]
        else:
            self.target += 1
        if hops_left > 0 and frame_is_retryable(frame):
            self.send(pending, hops_left - 1)  # not applied: NOT_LEADER and the like
            return
        pending.answered = True
        pending.on_result(None)

    def timed_out(self, request_id: int) -> None:
        pending = self.outstanding.pop(request_id, None)
        if pending is None or pending.answered:
            return
        self.target += 1 + self.rng.randrange(len(self.node_ids))
        pending.answered = True
        pending.on_result(None)


def frame_is_retryable(frame: wire.Frame) -> bool:
    """An error that says the command was not taken (so sending it again is safe)."""
    return isinstance(frame, wire.ErrorResponse) and frame.code is wire.ErrorCode.NOT_LEADER
