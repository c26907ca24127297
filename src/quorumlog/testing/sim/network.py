"""A seeded faulty network between simulated nodes.

Every message is encoded with msgpack when sent and decoded when it arrives, as on a real
wire: the receiver never shares an object with the sender, so a core that mutates what it
sent or received cannot hide the bug behind aliasing. Each copy gets its own random delay,
which reorders messages; a partition or cut drops what crosses it, both at send time and at
arrival (a message in flight when the link is cut is lost, as a TCP connection would be).

Node-level liveness pings (runtime/liveness.py) travel the same links with the same faults
(`send_ping`); in the real node they are empty frames on the peer connection.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import msgspec

from quorumlog.raft.messages import Message
from quorumlog.testing.sim.events import EventQueue
from quorumlog.testing.sim.trace import TraceRecorder


class NetworkFaults(msgspec.Struct, frozen=True):
    """How a network misbehaves. The defaults are a clean, fast, in-order-ish network."""

    delay_ms_min: int = 1
    delay_ms_max: int = 10
    tail_probability: float = 0.0
    """Chance that a message is slow: its delay is drawn up to `tail_delay_ms_max`."""
    tail_delay_ms_max: int = 400
    drop_probability: float = 0.0
    duplicate_probability: float = 0.0
    fifo_links: bool = False
    """Deliver in send order on each directed link, as one TCP connection does (a late
    message holds back the ones behind it). False: every message is delayed on its own,
    so messages overtake each other."""

    def validate(self) -> None:
        if not 0 <= self.delay_ms_min <= self.delay_ms_max:
            raise ValueError("need 0 <= delay_ms_min <= delay_ms_max")
        if self.tail_delay_ms_max < self.delay_ms_max:
            raise ValueError("tail_delay_ms_max must be >= delay_ms_max")
        for name in ("tail_probability", "drop_probability", "duplicate_probability"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within [0, 1]")


class NetworkStats(msgspec.Struct):
    sent: int = 0
    delivered: int = 0
    dropped_random: int = 0
    dropped_blocked: int = 0
    duplicated: int = 0


def draw_delays_ms(faults: NetworkFaults, rng: random.Random, stats: NetworkStats) -> list[int]:
    """The fault draws for one message: [] if it is dropped, else one delay per copy that
    goes out (two when duplicated). Every network draws in this one order, so a seed
    replays the same faults whatever carries the message."""
    draw = rng.random
    drop_probability = faults.drop_probability
    if drop_probability and draw() < drop_probability:
        stats.dropped_random += 1
        return []
    copies = 1
    duplicate_probability = faults.duplicate_probability
    if duplicate_probability and draw() < duplicate_probability:
        copies = 2
        stats.duplicated += 1
    tail_probability = faults.tail_probability
    if copies == 1:  # the common case, without the loop: this runs for every message
        if tail_probability and draw() < tail_probability:
            low, high = faults.delay_ms_max, faults.tail_delay_ms_max
        else:
            low, high = faults.delay_ms_min, faults.delay_ms_max
        return [low + int(draw() * (high - low + 1))]
    delays_ms: list[int] = []
    for _ in range(copies):
        if tail_probability and draw() < tail_probability:
            low, high = faults.delay_ms_max, faults.tail_delay_ms_max
        else:
            low, high = faults.delay_ms_min, faults.delay_ms_max
        # `draw_int` written out (the same draw).
        delays_ms.append(low + int(draw() * (high - low + 1)))
    return delays_ms


_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[Message] = msgspec.msgpack.Decoder(Message)

Receiver = Callable[[Message], None]
PingReceiver = Callable[[str], None]


def encode_message(message: Message) -> bytes:
    return _encoder.encode(message)


def decode_message(data: bytes) -> Message:
    return _decoder.decode(data)


class SimNetwork:
    """Carries messages between node ids, to the receiver registered for the target."""

    def __init__(
        self,
        events: EventQueue,
        rng: random.Random,
        faults: NetworkFaults,
        receivers: dict[str, Receiver],
        trace: TraceRecorder | None = None,
    ) -> None:
        faults.validate()
        self.events = events
        self.rng = rng
        self.faults = faults
        self.receivers = receivers
        """Node id -> what takes a message that arrived for it (the dict may fill later)."""
        self.trace = trace
        self.blocked: set[tuple[str, str]] = set()
        """Directed links that drop everything: (source, target)."""
        self.stats = NetworkStats()
        self.link_arrival_ms: dict[tuple[str, str], int] = {}
        """fifo_links: the latest arrival time scheduled on each link."""
        self.ping_receivers: dict[str, PingReceiver] = {}
        """Node id -> what takes a liveness ping that arrived for it (from the source)."""

    # --- faults ----------------------------------------------------------------------

    def partition(self, groups: list[list[str]]) -> None:
        """Block every link between different groups, both ways (adds to current cuts)."""
        for group_index, group in enumerate(groups):
            for other_index, other in enumerate(groups):
                if group_index == other_index:
                    continue
                for source in group:
                    for target in other:
                        self.blocked.add((source, target))

    def cut(self, source: str, target: str) -> None:
        """Drop messages from `source` to `target` only (a one-way fault)."""
        self.blocked.add((source, target))

    def heal(self) -> None:
        self.blocked.clear()

    def set_faults(self, faults: NetworkFaults) -> None:
        faults.validate()
        self.faults = faults

    # --- carrying --------------------------------------------------------------------

    def send(self, message: Message) -> None:
        stats = self.stats
        stats.sent += 1
        source = message.source
        target = message.target
        if (source, target) in self.blocked:
            stats.dropped_blocked += 1
            return
        delays_ms = draw_delays_ms(self.faults, self.rng, stats)
        if not delays_ms:
            if self.trace is not None:
                self.trace.record(self.events.now_ms, f"net drop {message!r}")
            return
        data = _encoder.encode(message)
        events = self.events
        fifo_links = self.faults.fifo_links
        for delay_ms in delays_ms:
            arrival_ms = events.now_ms + delay_ms
            if fifo_links:
                link = (source, target)
                arrival_ms = max(arrival_ms, self.link_arrival_ms.get(link, 0))
                self.link_arrival_ms[link] = arrival_ms
            events.schedule_at(arrival_ms, self._arrive, (source, target, data))

    def send_ping(self, source: str, target: str) -> None:
        """A liveness ping: lost, delayed or duplicated like any message on the link."""
        if (source, target) in self.blocked:
            return
        for delay_ms in draw_delays_ms(self.faults, self.rng, self.stats):
            self.events.schedule(delay_ms, self._arrive_ping, (source, target))

    def _arrive_ping(self, link: tuple[str, str]) -> None:
        source, target = link
        if link in self.blocked:
            return
        receiver = self.ping_receivers.get(target)
        if receiver is not None:
            receiver(source)

    def _arrive(self, packet: tuple[str, str, bytes]) -> None:
        source, target, data = packet
        if (source, target) in self.blocked:
            self.stats.dropped_blocked += 1
            return
        receiver = self.receivers.get(target)
        if receiver is not None:
            self.stats.delivered += 1
            receiver(_decoder.decode(data))
