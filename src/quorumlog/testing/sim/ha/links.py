"""Broker-to-broker HA connections in the simulator, behind `ha.broker_host.HALinks`.

One connection per slave, opened by the slave to its master's HA address. Frames are
encoded and decoded with the shipped `ha.wire` codec. A connection is FIFO in each
direction (a frame never overtakes one sent before it on the same connection), delays are
seeded, and it breaks as a real one does: when either end's process dies, when a partition
cuts the two brokers (the shared `blocked` set), or at random (`break_probability` per
frame). A broken connection tells each live end that did not close it (`connection_lost`)
once, later, and carries nothing more. Every event enters the receiving broker's
`SimProcess` on the link `ha:<id>`, so a paused broker holds it and a crashed one drops
it; nothing is ever delivered from inside a call the host made.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from quorumlog.ha.wire import HAFrame, decode_frame, encode_frame
from quorumlog.testing.sim.events import EventQueue, draw_int
from quorumlog.testing.sim.process import SimProcess


class LinkHost(Protocol):
    """What the links call on a broker's host (`ha.broker_host.BrokerHost`)."""

    def connected(self, connection_id: int) -> None: ...

    def frame_received(self, connection_id: int, frame: HAFrame) -> None: ...

    def connection_lost(self, connection_id: int) -> None: ...


@dataclass
class LinkEnd:
    process: SimProcess
    host: Callable[[], LinkHost | None]
    """The broker's host in its current incarnation (None while it is down)."""


@dataclass
class Connection:
    connection_id: int
    slave: str
    master: str
    incarnations: dict[str, int]
    last_arrival_ms: dict[str, int] = field(default_factory=dict)


def ha_address(broker: str) -> str:
    return f"{broker}:ha"


class SimHALinks:
    def __init__(
        self,
        events: EventQueue,
        rng: random.Random,
        blocked: set[tuple[str, str]],
        delay_ms_max: int = 3,
        break_probability: float = 0.0,
    ) -> None:
        self.events = events
        self.rng = rng
        self.blocked = blocked
        self.delay_ms_max = delay_ms_max
        self.break_probability = break_probability
        self.ends: dict[str, LinkEnd] = {}
        self.connections: dict[int, Connection] = {}
        self.next_connection_id = 1
        self.frames_sent = 0
        self.breaks = 0
        self.extra_delay_ms: dict[str, int] = {}
        """Per sending broker: added to each frame's delay (a slow link out of a master, so
        its slaves trail it by that much when it dies)."""

    def register(self, name: str, end: LinkEnd) -> None:
        self.ends[name] = end

    def for_broker(self, name: str) -> BrokerLinks:
        return BrokerLinks(self, name)

    # --- what a broker's links do ------------------------------------------------------

    def connect(self, slave: str, address: str) -> int:
        connection_id = self.next_connection_id
        self.next_connection_id += 1
        master = address.removesuffix(":ha")
        target = self.ends.get(master)
        source = self.ends[slave]
        reachable = (
            target is not None
            and target.process.up
            and (slave, master) not in self.blocked
            and master != slave
        )
        if not reachable or target is None:
            # Refused or timed out: the slave hears of it later, as from a real connect.
            source.process.schedule(self.delay_ms(), self.lost, (slave, connection_id))
            return connection_id
        self.connections[connection_id] = Connection(
            connection_id,
            slave,
            master,
            {slave: source.process.incarnation, master: target.process.incarnation},
            {slave: 0, master: 0},
        )
        source.process.schedule(2 * self.delay_ms(), self.opened, connection_id)
        return connection_id

    def send(self, name: str, connection_id: int, frame: HAFrame) -> None:
        connection = self.connections.get(connection_id)
        if connection is None:
            return
        target = connection.master if name == connection.slave else connection.slave
        if (name, target) in self.blocked or self.rng.random() < self.break_probability:
            self.close(None, connection_id)
            return
        self.frames_sent += 1
        arrivals = connection.last_arrival_ms
        delay_ms = self.delay_ms() + self.extra_delay_ms.get(name, 0)
        arrival_ms = max(self.events.now_ms + delay_ms, arrivals[target])
        arrivals[target] = arrival_ms  # FIFO: never before the frame sent ahead of it
        packet = (connection_id, target, encode_frame(frame))
        self.events.schedule_at(arrival_ms, self.arrive, packet)

    def close(self, closer: str | None, connection_id: int) -> None:
        """Break the connection; each live end but `closer` hears of it once, later."""
        connection = self.connections.pop(connection_id, None)
        if connection is None:
            return
        self.breaks += 1
        for name in (connection.slave, connection.master):
            end = self.ends[name]
            if name != closer and end.process.incarnation == connection.incarnations[name]:
                end.process.schedule(self.delay_ms(), self.lost, (name, connection_id))

    # --- the world's faults --------------------------------------------------------------

    def broker_died(self, name: str) -> None:
        for connection in list(self.connections.values()):
            if name in (connection.slave, connection.master):
                self.close(name, connection.connection_id)

    def cut(self) -> None:
        """The partition changed: connections across it break."""
        for connection in list(self.connections.values()):
            pair = (connection.slave, connection.master)
            if pair in self.blocked or pair[::-1] in self.blocked:
                self.close(None, connection.connection_id)

    # --- events inside the brokers' processes -------------------------------------------

    def opened(self, connection_id: int) -> None:
        connection = self.connections.get(connection_id)
        if connection is None:
            return
        host = self.ends[connection.slave].host()
        if host is not None:
            host.connected(connection_id)

    def lost(self, argument: tuple[str, int]) -> None:
        name, connection_id = argument
        host = self.ends[name].host()
        if host is not None:
            host.connection_lost(connection_id)

    def arrive(self, packet: tuple[int, str, bytes]) -> None:
        connection_id, target, _ = packet
        connection = self.connections.get(connection_id)
        if connection is None:
            return
        if not self.alive(connection):
            self.close(None, connection_id)
            return
        self.ends[target].process.enter(f"ha:{connection_id}", self.deliver, packet)

    def deliver(self, packet: tuple[int, str, bytes]) -> None:
        connection_id, target, data = packet
        if connection_id not in self.connections:
            return
        host = self.ends[target].host()
        if host is not None:
            host.frame_received(connection_id, decode_frame(data))

    def alive(self, connection: Connection) -> bool:
        return all(
            self.ends[name].process.up and self.ends[name].process.incarnation == incarnation
            for name, incarnation in connection.incarnations.items()
        )

    def delay_ms(self) -> int:
        return draw_int(self.rng, 1, self.delay_ms_max)


class BrokerLinks:
    """One broker's `HALinks`."""

    def __init__(self, links: SimHALinks, name: str) -> None:
        self.links = links
        self.name = name

    def connect(self, address: str) -> int:
        return self.links.connect(self.name, address)

    def send(self, connection_id: int, frame: HAFrame) -> None:
        self.links.send(self.name, connection_id, frame)

    def close(self, connection_id: int) -> None:
        self.links.close(self.name, connection_id)
