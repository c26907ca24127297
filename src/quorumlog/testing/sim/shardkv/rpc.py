"""Request/response messages between clients, shard groups and the controller, and the
seeded faulty network that carries them.

Raft traffic inside a group goes over `SimNetwork`; everything between groups (pulls,
deletes, configuration queries) and from clients goes over `RpcNetwork`, which has the same
fault model and shares the same set of cut links, so one partition cuts both. Every message
is msgpack-encoded on send and decoded on arrival, as on a real wire. A request may be
dropped, delayed, duplicated (the handler runs twice and both answers travel back), or cut;
callers therefore see zero, one or two answers per request and must time out and retry.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import msgspec

from quorumlog.codec.wire import KVCommand, KVCommandResult
from quorumlog.shard.config import ShardConfiguration
from quorumlog.shard.controller_commands import ControllerCommand, ControllerResult
from quorumlog.shard.group_commands import (
    DeleteRequest,
    DeleteResponse,
    PullRequest,
    PullResponse,
)
from quorumlog.testing.sim.events import EventQueue
from quorumlog.testing.sim.network import NetworkFaults, NetworkStats, draw_delays_ms
from quorumlog.testing.sim.trace import TraceRecorder


class ShardWrite(msgspec.Struct, frozen=True, tag="shard_write"):
    client_id: str
    first_unacknowledged: int
    command: KVCommand


class ShardRead(msgspec.Struct, frozen=True, tag="shard_read"):
    key: str


class ShardWriteReply(msgspec.Struct, frozen=True, tag="shard_write_reply"):
    result: KVCommandResult | None
    """None: the group does not serve the key's shard now (nothing was applied)."""


class ShardReadReply(msgspec.Struct, frozen=True, tag="shard_read_reply"):
    value: str | None
    wrong_group: bool = False


class NotLeader(msgspec.Struct, frozen=True, tag="not_leader"):
    """This server cannot take the request now (not the leader, or its proposal was lost):
    try another server of the group."""

    leader_hint: str | None = None
    """The leader this server last heard from, if any: the one to try next."""


class ControllerQuery(msgspec.Struct, frozen=True, tag="controller_query"):
    number: int


class ControllerQueryReply(msgspec.Struct, frozen=True, tag="controller_query_reply"):
    configuration: ShardConfiguration


class ControllerAdmin(msgspec.Struct, frozen=True, tag="controller_admin"):
    client_id: str
    first_unacknowledged: int
    command: ControllerCommand


class ControllerAdminReply(msgspec.Struct, frozen=True, tag="controller_admin_reply"):
    result: ControllerResult


RpcMessage = (
    ShardWrite
    | ShardRead
    | ShardWriteReply
    | ShardReadReply
    | NotLeader
    | ControllerQuery
    | ControllerQueryReply
    | ControllerAdmin
    | ControllerAdminReply
    | PullRequest
    | PullResponse
    | DeleteRequest
    | DeleteResponse
)

_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[RpcMessage] = msgspec.msgpack.Decoder(RpcMessage)

Reply = Callable[[RpcMessage], None]
Handler = Callable[[RpcMessage, Reply], None]
"""A server's request handler: it may call `reply` zero or more times."""
Gate = Callable[[Callable[[RpcMessage], None], RpcMessage, str], bool]
"""An endpoint's process gate (`RaftMember.hold`): True if it took the delivery to run
later (the process is paused), False to deliver now. The third argument names the link
(`rpc:<source>`), whose order a resumed process keeps."""


class RpcNetwork:
    """Carries requests to registered endpoints and their replies back to the caller."""

    def __init__(
        self,
        events: EventQueue,
        rng: random.Random,
        faults: NetworkFaults,
        blocked: set[tuple[str, str]],
        trace: TraceRecorder | None = None,
    ) -> None:
        faults.validate()
        self.events = events
        self.rng = rng
        self.faults = faults
        self.blocked = blocked
        """Shared with the Raft network: a partition cuts both kinds of traffic."""
        self.trace = trace
        self.handlers: dict[str, Handler] = {}
        self.gates: dict[str, Gate] = {}
        self.stats = NetworkStats()

    def register(self, endpoint: str, handler: Handler, gate: Gate | None = None) -> None:
        """`handler` serves requests to `endpoint`; `gate` (if any) sees every arrival
        there first, requests and the replies to the endpoint's own calls alike."""
        self.handlers[endpoint] = handler
        if gate is not None:
            self.gates[endpoint] = gate

    def call(self, source: str, target: str, request: RpcMessage, on_reply: Reply) -> None:
        """Send `request`; each answer that makes it back is passed to `on_reply`."""

        def deliver_request(message: RpcMessage) -> None:
            handler = self.handlers.get(target)
            if handler is None:
                return

            def reply(response: RpcMessage) -> None:
                self._carry(target, source, response, on_reply)

            handler(message, reply)

        self._carry(source, target, request, deliver_request)

    def _carry(
        self, source: str, target: str, message: RpcMessage, deliver: Callable[[RpcMessage], None]
    ) -> None:
        stats = self.stats
        stats.sent += 1
        if (source, target) in self.blocked:
            stats.dropped_blocked += 1
            return
        delays_ms = draw_delays_ms(self.faults, self.rng, stats)
        if not delays_ms:
            return
        data = _encoder.encode(message)
        for delay_ms in delays_ms:
            self.events.schedule(delay_ms, self._arrive, (source, target, data, deliver))

    def _arrive(self, packet: tuple[str, str, bytes, Callable[[RpcMessage], None]]) -> None:
        source, target, data, deliver = packet
        if (source, target) in self.blocked:
            self.stats.dropped_blocked += 1
            return
        self.stats.delivered += 1
        message = _decoder.decode(data)
        gate = self.gates.get(target)
        held = gate is not None and gate(deliver, message, f"rpc:{source}")
        if self.trace is not None:
            note = " (held: paused)" if held else ""
            self.trace.record(self.events.now_ms, f"rpc {source} -> {target} {message!r}{note}")
        if not held:
            deliver(message)


__all__ = [
    "ControllerAdmin",
    "ControllerAdminReply",
    "ControllerQuery",
    "ControllerQueryReply",
    "Gate",
    "NotLeader",
    "RpcMessage",
    "RpcNetwork",
    "ShardRead",
    "ShardReadReply",
    "ShardWrite",
    "ShardWriteReply",
]
