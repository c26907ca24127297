"""One outstanding request from a server to another group, retried by rotation.

A group leader talks to other groups (the controller for configurations, previous owners
for pulls and deletes) one request per purpose at a time. `Exchange` keeps that request's
bookkeeping: which attempt is current (late and duplicated answers to older attempts are
ignored), which server to try next (rotated on a timeout or a "not leader"), and whether
the purpose is busy (an answer is being proposed, or a request is in flight).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quorumlog.testing.sim.events import EventQueue
from quorumlog.testing.sim.shardkv.rpc import RpcMessage, RpcNetwork

TimerGate = Callable[[Callable[[Any], None], Any], bool]
"""The sending process's gate (`RaftMember.hold`): a timer that fires while it is paused
runs on its resume instead."""


class Exchange:
    __slots__ = (
        "answered_attempt",
        "attempt",
        "busy",
        "busy_since_ms",
        "resume_at",
        "server_index",
    )

    def __init__(self) -> None:
        self.attempt = 0
        self.answered_attempt = 0
        self.busy = False
        self.busy_since_ms = 0
        self.server_index = 0
        self.resume_at: tuple[int, int] | None = None
        """For chunked pulls: where the next chunk starts (advanced once a chunk applied)."""

    def release(self, *, rotate: bool = False) -> None:
        self.busy = False
        if rotate:
            self.server_index += 1

    def release_to(self, servers: list[str], hint: str | None) -> None:
        """Release after a "not leader": next try the hinted leader if it is one of
        `servers`, else the next server."""
        if hint is not None and hint in servers:
            self.busy = False
            self.server_index = servers.index(hint)
        else:
            self.release(rotate=True)

    def send(
        self,
        *,
        rpc: RpcNetwork,
        events: EventQueue,
        source: str,
        servers: list[str],
        request: RpcMessage,
        timeout_ms: int,
        handle: Callable[[RpcMessage], None],
        gate: TimerGate | None = None,
    ) -> None:
        """Send `request` to the current server; `handle` gets the first answer of this
        attempt only. Without an answer in `timeout_ms`, the next server is tried later."""
        self.attempt += 1
        attempt = self.attempt
        self.busy = True
        self.busy_since_ms = events.now_ms
        target = servers[self.server_index % len(servers)]

        def on_reply(message: RpcMessage) -> None:
            if self.attempt != attempt or self.answered_attempt == attempt:
                return
            self.answered_attempt = attempt
            handle(message)

        def on_timeout(argument: object) -> None:
            if gate is not None and gate(on_timeout, argument):
                return
            if self.attempt == attempt and self.answered_attempt != attempt:
                self.release(rotate=True)

        rpc.call(source, target, request, on_reply)
        events.schedule(timeout_ms, on_timeout)

    def stuck(self, now_ms: int, limit_ms: int) -> bool:
        """Busy for longer than any answer or proposal should take (a lost proposal)."""
        return self.busy and now_ms - self.busy_since_ms > limit_ms
