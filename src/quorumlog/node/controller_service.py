"""Serves the shard controller group: join, leave and move through its log, queries behind
a ReadIndex round.

Requests that arrive in one event-loop turn go into one controller entry, as KV writes do.
A request made only of queries changes nothing, so it is answered from the applied history
once a ReadIndex round confirms this node still leads (linearizable, without a log entry).
"""

from __future__ import annotations

from collections.abc import Callable

from quorumlog.codec import wire
from quorumlog.node.batched_proposals import BatchedProposals
from quorumlog.node.command_requests import accepted_commands
from quorumlog.node.errors_to_wire import after_read_barrier, error_response
from quorumlog.raft.invariants import InvariantViolation
from quorumlog.runtime.handle import GroupHandle
from quorumlog.shard.controller import ControllerMachine, rejected
from quorumlog.shard.controller_commands import (
    ControllerBatch,
    ControllerCommand,
    ControllerEntry,
    ControllerResult,
    Query,
    decode_commands,
    encode_entry,
    encode_results,
)

Replier = Callable[[wire.Frame], None]
COMMANDS_PER_REQUEST_MAX = 1_000


class ControllerService:
    def __init__(
        self,
        group: GroupHandle,
        machine: ControllerMachine,
        leader_address: Callable[[], str | None],
    ) -> None:
        self.group = group
        self.machine = machine
        self.leader_address = leader_address
        self.proposals: BatchedProposals[ControllerBatch] = BatchedProposals(
            group, make_entry, answer, self.reject
        )

    def reject(self, reply: Replier, request_id: int, error: BaseException) -> None:
        reply(error_response(request_id, error, self.leader_address))

    def handle(self, request: wire.ControllerRequest, reply: Replier) -> None:
        commands = accepted_commands(
            request.request_id,
            request.commands,
            decode_commands,
            COMMANDS_PER_REQUEST_MAX,
            self.group,
            self.leader_address,
            reply,
            "controller commands",
        )
        if commands is None:
            return
        if all(isinstance(command, Query) for command in commands):
            self.query(request, commands, reply)
            return
        batch = ControllerBatch(request.client_id, request.first_unacknowledged, commands)
        self.proposals.add(request.request_id, batch, reply)

    def query(
        self, request: wire.ControllerRequest, commands: list[ControllerCommand], reply: Replier
    ) -> None:
        def answer() -> None:
            results = [self.read(command) for command in commands]
            reply(
                wire.ControllerResponse(
                    request_id=request.request_id, results=encode_results(results)
                )
            )

        after_read_barrier(
            self.group.linearizable_read, request.request_id, reply, self.leader_address, answer
        )

    def read(self, command: ControllerCommand) -> ControllerResult:
        if not isinstance(command, Query):
            raise InvariantViolation(f"a read of a {type(command).__name__}")
        if command.number < -1:
            return rejected(f"configuration number must be -1 or more, got {command.number}")
        return ControllerResult(ok=True, configuration=self.machine.query(command.number))


def make_entry(timestamp_ms: int, batches: list[ControllerBatch]) -> bytes:
    return encode_entry(ControllerEntry(timestamp_ms=timestamp_ms, batches=batches))


def answer(reply: Replier, request_id: int, results: list[ControllerResult]) -> None:
    reply(wire.ControllerResponse(request_id=request_id, results=encode_results(results)))
