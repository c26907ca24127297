"""One simulated ledger client: a `SimProcess` running the shipped `LedgerDriver` on a
`SimScheduler`, with its links to the bookies and its access to the metadata.

Links carry the bookie protocol's frames over the `SimFrameNetwork` (encoded and decoded
with codec/wire). They model the connections a real client holds, one per bookie:

- a connection to a bookie that is down is refused: the driver hears
  `bookie_unreachable` soon, and the frame is lost;
- a connection to a bookie that restarted since it was opened was reset: the same;
- a connection may break on its own (seeded): the frame may or may not have gone out,
  every answer still to come on it is lost, and the driver hears `bookie_unreachable`;
- a partition silently drops frames both ways (no reset: the cores time out), and a
  paused bookie holds them (its process queues them), as a SIGSTOPped process does.

A killed bookie process (not a power loss) resets its connections at once: every client
that had one hears `bookie_unreachable`.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import msgspec

from quorumlog.codec import wire
from quorumlog.ledger.driver import LedgerDriver
from quorumlog.ledger.protocol_actions import BookieAnswer, BookieRequest, LedgerProtocolConfig
from quorumlog.testing.sim.events import EventQueue, draw_int
from quorumlog.testing.sim.frame_network import SimFrameNetwork
from quorumlog.testing.sim.ledger.metadata import (
    MetadataFaults,
    RecordingMetadataStore,
    SimMetadataAccess,
)
from quorumlog.testing.sim.process import SimProcess, SimScheduler

BOOKIE_ANSWER_TYPES = (
    wire.AddEntriesResult,
    wire.ReadEntriesResult,
    wire.LastAddConfirmedResult,
    wire.ErrorResponse,
)
RESET_NOTICE_MS_MAX = 5
"""A reset connection is noticed within this long (the next read of its socket)."""
TICK_SECONDS = 0.02


class LinkFaults(msgspec.Struct, frozen=True):
    break_probability: float = 0.0
    """Per frame sent: the connection breaks as it goes (the frame may or may not leave)."""


BookieIncarnation = Callable[[str], int | None]
"""A bookie's current incarnation number, or None while it is down."""


class SimLinks:
    """The driver's `BookieLinks` for one client (see the module docstring)."""

    def __init__(
        self,
        name: str,
        process: SimProcess,
        network: SimFrameNetwork,
        incarnation_of: BookieIncarnation,
        rng: random.Random,
        faults: LinkFaults,
    ) -> None:
        self.name = name
        self.process = process
        self.network = network
        self.incarnation_of = incarnation_of
        self.rng = rng
        self.faults = faults
        self.driver: LedgerDriver | None = None
        self.connections: dict[str, tuple[int, int]] = {}
        """Bookie id -> (connection number, the bookie incarnation it reached)."""
        self.connection_numbers = 0
        self.resets = 0

    def send(self, bookie_id: str, request: BookieRequest) -> None:
        incarnation = self.incarnation_of(bookie_id)
        if incarnation is None:
            self.reset(bookie_id)  # refused: nobody listens there
            return
        connection = self.connections.get(bookie_id)
        if connection is not None and connection[1] != incarnation:
            self.reset(bookie_id)  # the bookie restarted: this connection is gone
            return
        if connection is None:
            self.connection_numbers += 1
            connection = (self.connection_numbers, incarnation)
            self.connections[bookie_id] = connection
        if self.faults.break_probability and self.rng.random() < self.faults.break_probability:
            left = self.rng.random() < 0.5
            self.reset(bookie_id)
            if not left:
                return
        number = connection[0]

        def on_answer(frame: wire.Frame) -> None:
            self.answer(bookie_id, number, frame)

        self.network.call(self.name, bookie_id, request, on_answer)

    def answer(self, bookie_id: str, number: int, frame: wire.Frame) -> None:
        connection = self.connections.get(bookie_id)
        if connection is None or connection[0] != number or self.driver is None:
            return  # it came on a connection that broke since: never read
        if isinstance(frame, BOOKIE_ANSWER_TYPES):
            answer: BookieAnswer = frame
            self.driver.receive(bookie_id, answer)

    def reset(self, bookie_id: str) -> None:
        """The connection to `bookie_id` failed: the driver hears it soon, never inside a
        send; the next send opens a new one."""
        self.resets += 1
        self.connections.pop(bookie_id, None)
        delay_ms = draw_int(self.rng, 1, RESET_NOTICE_MS_MAX)
        self.process.schedule(delay_ms, self.notify_unreachable, bookie_id)

    def notify_unreachable(self, bookie_id: str) -> None:
        if self.driver is not None:
            self.driver.bookie_unreachable(bookie_id)

    def bookie_killed(self, bookie_id: str) -> None:
        """The bookie's process died and its OS reset the connections."""
        if bookie_id in self.connections:
            self.reset(bookie_id)


class SimLedgerClient:
    def __init__(
        self,
        name: str,
        events: EventQueue,
        network: SimFrameNetwork,
        store: RecordingMetadataStore,
        incarnation_of: BookieIncarnation,
        config: LedgerProtocolConfig,
        faults: tuple[LinkFaults, MetadataFaults],
        seed_random: Callable[[str], random.Random],
    ) -> None:
        """`seed_random(component)`: this client's stream for one component."""
        link_faults, metadata_faults = faults
        self.name = name
        self.process = SimProcess(name, events, seed_random("resume"))
        self.process.boot()
        network.register(name, self.process)
        self.scheduler = SimScheduler(self.process)
        self.links = SimLinks(
            name, self.process, network, incarnation_of, seed_random("links"), link_faults
        )
        self.metadata = SimMetadataAccess(
            store, self.process, seed_random("metadata"), metadata_faults, network.trace
        )
        self.driver = LedgerDriver(
            self.scheduler,
            self.links,
            self.metadata,
            config,
            tick_seconds=TICK_SECONDS,
            random=seed_random("driver"),
        )
        self.links.driver = self.driver

    def run(self, callback: Callable[[], None], delay_ms: int = 0) -> None:
        """Run `callback` inside this client's process after `delay_ms`."""
        self.process.schedule(delay_ms, _call, callback)

    def describe(self) -> str:
        state = "down" if not self.process.up else "paused" if self.process.paused else "up"
        return (
            f"client {self.name}: {state}, cores running {len(self.driver.running)}, "
            f"resets {self.links.resets}, metadata ops {self.metadata.operations} "
            f"({self.metadata.unavailable} unavailable)"
        )


def _call(callback: Callable[[], None]) -> None:
    callback()
