"""Clients of the simulated sharded KV and of its controller, recording a History.

A `ShardClient` routes a key to its shard (`shard_for_key`) and the shard to a group
through a cached configuration. It retries the same operation, with the same (client id,
sequence), on "not leader" (next server), on a timeout (next server) and on wrong group
(after fetching the latest configuration from the controller), so a write applied just
before its shard moved is answered from the session that moved with the shard rather than
applied again. After `operation_timeout_ms` it gives up: the outcome is unknown.

An `AdminClient` sends join, leave and move to the controller the same way.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import msgspec

from quorumlog.codec.wire import KVCommand
from quorumlog.shard.config import UNASSIGNED_GID, ShardConfiguration, shard_for_key
from quorumlog.shard.controller_commands import ControllerCommand, ControllerResult
from quorumlog.testing.history import History
from quorumlog.testing.sim.events import EventQueue, draw_int
from quorumlog.testing.sim.shardkv.rpc import (
    ControllerAdmin,
    ControllerAdminReply,
    ControllerQuery,
    ControllerQueryReply,
    RpcMessage,
    RpcNetwork,
    ShardRead,
    ShardReadReply,
    ShardWrite,
    ShardWriteReply,
)


class ClientOptions(msgspec.Struct, frozen=True):
    request_timeout_ms: int = 400
    operation_timeout_ms: int = 8_000
    backoff_ms_min: int = 10
    backoff_ms_max: int = 60


OnFinish = Callable[[str, object], None]
"""Called once with ("ok", output) or ("unknown", None)."""


class _Operation:
    __slots__ = ("argument", "deadline_ms", "key", "kind", "on_finish", "operation_id", "sequence")

    def __init__(
        self,
        operation_id: int,
        kind: str,
        key: str,
        argument: str | None,
        sequence: int,
        deadline_ms: int,
        on_finish: OnFinish,
    ) -> None:
        self.operation_id = operation_id
        self.kind = kind
        self.key = key
        self.argument = argument
        self.sequence = sequence
        self.deadline_ms = deadline_ms
        self.on_finish = on_finish


class _Requester:
    """What both clients share: server rotation, attempts that void older answers, backoff."""

    def __init__(
        self,
        client_id: str,
        *,
        events: EventQueue,
        rpc: RpcNetwork,
        controller_servers: list[str],
        rng: random.Random,
        options: ClientOptions,
    ) -> None:
        self.client_id = client_id
        self.events = events
        self.rpc = rpc
        self.controller_servers = controller_servers
        self.rng = rng
        self.options = options
        self.attempt = 0
        self.server_index: dict[int, int] = {}
        """gid (0: the controller) -> which of its servers to try next."""
        self.retries = 0

    def request(
        self,
        gid: int,
        servers: list[str],
        message: RpcMessage,
        handle: Callable[[RpcMessage], None],
    ) -> None:
        """Send to the group's current server; `handle` gets the first answer of this
        attempt; a timeout rotates to the next server and calls `self.on_timeout`."""
        self.attempt += 1
        attempt = self.attempt
        target = servers[self.server_index.get(gid, 0) % len(servers)]

        def on_reply(reply: RpcMessage) -> None:
            if self.attempt == attempt:
                self.attempt += 1  # void duplicates and the timeout
                handle(reply)

        def on_timeout(_: object) -> None:
            if self.attempt == attempt:
                self.attempt += 1
                self.rotate(gid)
                self.retry()

        self.rpc.call(self.client_id, target, message, on_reply)
        self.events.schedule(self.options.request_timeout_ms, on_timeout)

    def rotate(self, gid: int) -> None:
        self.server_index[gid] = self.server_index.get(gid, 0) + 1

    def later(self, callback: Callable[[object], None]) -> None:
        self.retries += 1
        options = self.options
        self.events.schedule(
            draw_int(self.rng, options.backoff_ms_min, options.backoff_ms_max), callback
        )

    def retry(self) -> None:
        raise NotImplementedError


class ShardClient(_Requester):
    def __init__(
        self,
        client_id: str,
        *,
        events: EventQueue,
        rpc: RpcNetwork,
        controller_servers: list[str],
        rng: random.Random,
        options: ClientOptions,
        history: History,
        shard_count: int,
    ) -> None:
        super().__init__(
            client_id,
            events=events,
            rpc=rpc,
            controller_servers=controller_servers,
            rng=rng,
            options=options,
        )
        self.history = history
        self.shard_count = shard_count
        self.configuration: ShardConfiguration | None = None
        self.next_sequence = 1
        self.operation: _Operation | None = None
        self.wrong_group_count = 0

    @property
    def busy(self) -> bool:
        return self.operation is not None

    def begin(
        self,
        kind: str,
        key: str,
        argument: str | None,
        on_finish: OnFinish,
        operation_timeout_ms: int | None = None,
    ) -> None:
        """Start "get", "put" or "append"; one operation at a time."""
        if self.operation is not None:
            raise RuntimeError(f"client {self.client_id} already has an operation in flight")
        now_ms = self.events.now_ms
        operation_id = self.history.invoke(self.client_id, kind, key, argument, now_ms)
        sequence = 0
        if kind != "get":
            sequence = self.next_sequence
            self.next_sequence += 1
        timeout_ms = operation_timeout_ms or self.options.operation_timeout_ms
        self.operation = _Operation(
            operation_id, kind, key, argument, sequence, now_ms + timeout_ms, on_finish
        )
        self.retry()

    def retry(self, _: object = None) -> None:
        operation = self.operation
        if operation is None:
            return
        if self.events.now_ms >= operation.deadline_ms:
            self.finish(operation, "unknown", None)
            return
        configuration = self.configuration
        shard = shard_for_key(operation.key, self.shard_count)
        if configuration is None or configuration.shards[shard] == UNASSIGNED_GID:
            self.refresh_configuration()
            return
        gid = configuration.shards[shard]
        servers = configuration.groups[gid]
        message: RpcMessage
        if operation.kind == "get":
            message = ShardRead(operation.key)
        else:
            command = KVCommand(
                operation.sequence, operation.kind, operation.key, operation.argument
            )
            message = ShardWrite(self.client_id, operation.sequence, command)
        self.request(gid, servers, message, lambda reply: self.answered(operation, gid, reply))

    def answered(self, operation: _Operation, gid: int, reply: RpcMessage) -> None:
        if isinstance(reply, ShardWriteReply):
            if reply.result is None:
                self.wrong_group(operation)
            else:
                self.finish(operation, "ok", None)
        elif isinstance(reply, ShardReadReply):
            if reply.wrong_group:
                self.wrong_group(operation)
            else:
                self.finish(operation, "ok", reply.value)
        else:
            self.rotate(gid)
            self.later(self.retry)

    def wrong_group(self, operation: _Operation) -> None:
        self.wrong_group_count += 1
        self.later(lambda _: self.refresh_configuration())

    def refresh_configuration(self) -> None:
        if self.operation is None:
            return
        if self.events.now_ms >= self.operation.deadline_ms:
            self.finish(self.operation, "unknown", None)
            return

        def handle(reply: RpcMessage) -> None:
            if isinstance(reply, ControllerQueryReply):
                latest = reply.configuration
                if self.configuration is None or latest.number >= self.configuration.number:
                    self.configuration = latest
                self.later(self.retry)
            else:
                self.rotate(UNASSIGNED_GID)
                self.later(lambda _: self.refresh_configuration())

        self.request(UNASSIGNED_GID, self.controller_servers, ControllerQuery(-1), handle)

    def finish(self, operation: _Operation, status: str, output: object) -> None:
        if self.operation is not operation:
            return
        self.operation = None
        self.attempt += 1
        if status == "ok":
            self.history.complete(operation.operation_id, output, self.events.now_ms)
        else:
            self.history.unknown(operation.operation_id)
        operation.on_finish(status, output)


class AdminClient(_Requester):
    """Join, leave and move, each retried with its sequence until the controller answers."""

    def __init__(
        self,
        client_id: str,
        *,
        events: EventQueue,
        rpc: RpcNetwork,
        controller_servers: list[str],
        rng: random.Random,
        options: ClientOptions,
    ) -> None:
        super().__init__(
            client_id,
            events=events,
            rpc=rpc,
            controller_servers=controller_servers,
            rng=rng,
            options=options,
        )
        self.next_sequence = 1
        self.pending: tuple[ControllerCommand, Callable[[ControllerResult], None]] | None = None

    def take_sequence(self) -> int:
        sequence = self.next_sequence
        self.next_sequence += 1
        return sequence

    def begin(
        self, command: ControllerCommand, on_done: Callable[[ControllerResult], None]
    ) -> None:
        self.pending = (command, on_done)
        self.retry()

    def retry(self, _: object = None) -> None:
        if self.pending is None:
            return
        command, on_done = self.pending
        message = ControllerAdmin(self.client_id, command.sequence, command)

        def handle(reply: RpcMessage) -> None:
            if isinstance(reply, ControllerAdminReply):
                self.pending = None
                on_done(reply.result)
            else:
                self.rotate(UNASSIGNED_GID)
                self.later(self.retry)

        self.request(UNASSIGNED_GID, self.controller_servers, message, handle)
