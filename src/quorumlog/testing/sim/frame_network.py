"""Client and node-to-node requests in the simulator, as the real wire frames.

Raft messages travel over `SimNetwork`; everything a client or a node's service sends to a
node's `on_client_request` (KV reads and writes, controller commands, shard pulls and
deletes, status) travels here, as `codec.wire` frames encoded and decoded with the
shipped codec. Both networks share one set of cut links, so one partition cuts both kinds
of traffic, and draw from the same fault model: a frame may be dropped (a connection that
broke), delayed, or duplicated; callers see zero, one or more answers and must time out and
retry, as real clients do.

Arrivals enter the target's `SimProcess` on the link `rpc:<source>`, so a paused node holds
them and a crashed one drops them; answers enter the caller's process (if it has one) the
same way.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from quorumlog.codec import wire
from quorumlog.testing.sim.events import EventQueue
from quorumlog.testing.sim.network import NetworkFaults, NetworkStats, draw_delays_ms
from quorumlog.testing.sim.process import SimProcess
from quorumlog.testing.sim.trace import TraceRecorder

Replier = Callable[[wire.Frame], None]
RequestHandler = Callable[[wire.ClientRequest, Replier], None]
"""A node's request handler (`on_client_request`): it may call the replier zero or more
times, now or later."""


class Endpoint:
    __slots__ = ("handler", "process")

    def __init__(self, process: SimProcess | None, handler: RequestHandler | None) -> None:
        self.process = process
        self.handler = handler


class SimFrameNetwork:
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
        self.endpoints: dict[str, Endpoint] = {}
        self.stats = NetworkStats()

    def set_faults(self, faults: NetworkFaults) -> None:
        faults.validate()
        self.faults = faults

    def register(
        self, name: str, process: SimProcess | None, handler: RequestHandler | None = None
    ) -> None:
        """`name` is reachable; requests to it run `handler` inside `process` (a client
        registers with no handler: it only calls)."""
        self.endpoints[name] = Endpoint(process, handler)

    def call(
        self, source: str, target: str, request: wire.ClientRequest, on_reply: Replier
    ) -> None:
        """Send `request` from `source` to `target`; each answer that makes it back is
        passed to `on_reply` (inside `source`'s process, if it has one)."""

        def deliver_request(frame: wire.Frame) -> None:
            endpoint = self.endpoints.get(target)
            if endpoint is None or endpoint.handler is None:
                return
            if not isinstance(frame, wire.ClientRequest):
                return  # a frame that is not a request: a real node would refuse it

            def reply(response: wire.Frame) -> None:
                self.carry(target, source, response, on_reply)

            endpoint.handler(frame, reply)

        self.carry(source, target, request, deliver_request)

    def carry(
        self, source: str, target: str, frame: wire.Frame, deliver: Callable[[wire.Frame], None]
    ) -> None:
        stats = self.stats
        stats.sent += 1
        if (source, target) in self.blocked:
            stats.dropped_blocked += 1
            return
        delays_ms = draw_delays_ms(self.faults, self.rng, stats)
        if not delays_ms:
            return
        data = wire.encode(frame)
        for delay_ms in delays_ms:
            self.events.schedule(delay_ms, self.arrive, (source, target, data, deliver))

    def arrive(self, packet: tuple[str, str, bytes, Callable[[wire.Frame], None]]) -> None:
        source, target, data, deliver = packet
        if (source, target) in self.blocked:
            self.stats.dropped_blocked += 1
            return
        endpoint = self.endpoints.get(target)
        if endpoint is None:
            return
        self.stats.delivered += 1
        frame = wire.decode(data)
        if self.trace is not None:
            self.trace.record(self.events.now_ms, f"frame {source} -> {target} {frame!r}")
        if endpoint.process is None:
            deliver(frame)
        else:
            endpoint.process.enter(f"rpc:{source}", deliver, frame)
