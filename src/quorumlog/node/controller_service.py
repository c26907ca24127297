"""Serves the shard controller group: join, leave and move through its log, queries behind
a ReadIndex round.

Requests that arrive in one event-loop turn go into one controller entry, as KV writes do.
A request made only of queries changes nothing, so it is answered from the applied history
once a ReadIndex round confirms this node still leads (linearizable, without a log entry).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quorumlog.codec import wire
from quorumlog.errors import NotLeaderError, QuorumLogError
from quorumlog.node.errors_to_wire import after_read_barrier, error_response
from quorumlog.raft.invariants import InvariantViolation
from quorumlog.runtime.completion import Completion
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
        self.pending: list[tuple[wire.ControllerRequest, list[ControllerCommand], Replier]] = []
        self.flush_scheduled = False

    def reject(self, reply: Replier, request_id: int, error: BaseException) -> None:
        reply(error_response(request_id, error, self.leader_address))

    def handle(self, request: wire.ControllerRequest, reply: Replier) -> None:
        try:
            commands = decode_commands(request.commands)
        except wire.DECODE_ERRORS as error:
            reply(
                wire.ErrorResponse(
                    request_id=request.request_id,
                    code=wire.ErrorCode.BAD_REQUEST,
                    message=f"controller commands do not decode: {error}",
                )
            )
            return
        if not commands or len(commands) > COMMANDS_PER_REQUEST_MAX:
            reply(
                wire.ErrorResponse(
                    request_id=request.request_id,
                    code=wire.ErrorCode.BAD_REQUEST,
                    message=f"{len(commands)} commands; send 1 to {COMMANDS_PER_REQUEST_MAX}",
                )
            )
            return
        if not self.group.is_leader:
            self.reject(
                reply,
                request.request_id,
                NotLeaderError(self.group.node_id, self.group.leader_id),
            )
            return
        if all(isinstance(command, Query) for command in commands):
            self.query(request, commands, reply)
            return
        self.pending.append((request, commands, reply))
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.group.scheduler.call_soon(self.flush)

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

    def flush(self) -> None:
        self.flush_scheduled = False
        pending, self.pending = self.pending, []
        entry = ControllerEntry(
            timestamp_ms=self.group.scheduler.wall_time_ms(),
            batches=[
                ControllerBatch(request.client_id, request.first_unacknowledged, commands)
                for request, commands, _ in pending
            ],
        )
        try:
            future = self.group.propose(encode_entry(entry))
        except QuorumLogError as error:
            for request, _, reply in pending:
                self.reject(reply, request.request_id, error)
            return

        def answer(done: Completion[Any]) -> None:
            error = done.exception()
            if error is not None:
                for request, _, reply in pending:
                    self.reject(reply, request.request_id, error)
                return
            for (request, _, reply), results in zip(pending, done.result(), strict=True):
                reply(
                    wire.ControllerResponse(
                        request_id=request.request_id, results=encode_results(results)
                    )
                )

        future.add_done_callback(answer)
